#pragma once
// What the agent's components may ask of its event loop, and nothing more: answer a client's
// request (the client socket), and add a record to the node's stream. The loop implements both
// (loop/client_port.h, stream/node_stream.h); a component gets the ones it needs by reference.
// Event loop only.

#include <cstdint>
#include <string>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

class ReplyPort {
 public:
  virtual ~ReplyPort() = default;
  // Sent without waiting: a client that left or stopped reading asks again.
  virtual void reply(const std::string& client, const Reply& reply) = 0;
  void replyError(const std::string& client, std::uint64_t requestId, const Error& error) {
    reply(client, Reply{requestId, ErrorReply{error.code, error.message}});
  }
};

class StreamPort {
 public:
  virtual ~StreamPort() = default;
  // Numbers the record in the node's stream (stream/stream_buffer.h).
  virtual void append(StreamPayload payload) = 0;
};

}  // namespace lockstep::agent
