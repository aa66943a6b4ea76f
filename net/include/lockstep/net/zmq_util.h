#pragma once
// ZeroMQ with CURVE everywhere: server and client setup, the ZAP handler that decides which client
// keys may connect, and bounded multipart receives. cppzmq exceptions stay inside these helpers.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "lockstep/common/result.h"
#include "lockstep/net/keys.h"

namespace lockstep {

// The ZAP domain Lockstep's servers use.
inline constexpr const char* kZapDomain = "lockstep";

// Answers libzmq's ZAP requests (RFC 27) for sockets that set a ZAP domain. libzmq 4.3 accepts every
// CURVE client when no handler is bound, so construct this before binding any CURVE server.
// Not thread-safe: poll socket() and call handleOne() from one thread.
class ZapHandler {
 public:
  explicit ZapHandler(zmq::context_t& context);
  zmq::socket_t& socket() { return socket_; }
  // Answers one waiting request; `allowed` gets the client's Z85 public key. An allowed client's
  // messages carry its key as their "User-Id" property (clientKeyOf).
  void handleOne(const std::function<bool(const std::string& clientKey)>& allowed);

 private:
  zmq::socket_t socket_;
};

// The Z85 key of the client that sent `frame` on a ZAP-checked CURVE socket; "" when unknown.
std::string clientKeyOf(const zmq::message_t& frame);

Result<void> makeCurveServer(zmq::socket_t& socket, const CurveKeyPair& keys);
Result<void> makeCurveClient(zmq::socket_t& socket, const CurveKeyPair& keys, const std::string& serverPublicKey);

// Receives one whole multipart message without blocking (call when the socket is readable).
// More than maxFrames frames is an error, or, with `dropped`, the first maxFrames and *dropped
// set; the rest of the message is read and freed frame by frame either way, never kept.
Result<std::vector<zmq::message_t>> receiveMultipart(zmq::socket_t& socket, std::size_t maxFrames,
                                                     bool* dropped = nullptr);

}  // namespace lockstep
