#include "lockstep/net/zmq_util.h"

#include <array>

namespace lockstep {

ZapHandler::ZapHandler(zmq::context_t& context) : socket_(context, zmq::socket_type::rep) {
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
}

void ZapHandler::handleOne(const std::function<bool(const std::string&)>& allowed) {
  auto request = receiveMultipart(socket_, 16);
  if (!request) return;
  auto& frames = *request;
  // version, request id, domain, address, identity, mechanism, credentials...
  const bool wellFormed = frames.size() >= 6 && frames[0].to_string_view() == "1.0";
  std::string status = "400", text = "not authorized", userId;
  if (wellFormed && frames[5].to_string_view() == "CURVE" && frames.size() >= 7 && frames[6].size() == 32) {
    char key[41];
    zmq_z85_encode(key, static_cast<const std::uint8_t*>(frames[6].data()), 32);
    if (allowed(key)) {
      status = "200";
      text = "OK";
      userId = key;  // every message of the connection carries it as its "User-Id"
    }
  }
  const std::string requestId = wellFormed ? frames[1].to_string() : "";
  const std::array<std::string, 6> reply = {"1.0", requestId, status, text, userId, ""};
  try {
    for (size_t i = 0; i < reply.size(); ++i) {
      socket_.send(zmq::buffer(reply[i]), i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  } catch (const zmq::error_t&) {
    // libzmq went away (shutting down): nothing to answer.
  }
}

std::string clientKeyOf(const zmq::message_t& frame) {
  try {
    // zmq_msg_gets reads the property without changing the message; cppzmq's gets() is not const.
    const char* id = zmq_msg_gets(frame.handle(), "User-Id");
    return id != nullptr ? id : "";
  } catch (const zmq::error_t&) {
    return "";  // no such property: not a CURVE connection
  }
}

Result<void> makeCurveServer(zmq::socket_t& socket, const CurveKeyPair& keys) {
  try {
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey, keys.secretKey);
    socket.set(zmq::sockopt::zap_domain, kZapDomain);
    return {};
  } catch (const zmq::error_t& e) {
    return internalError(std::string("cannot make a CURVE server socket: ") + e.what());
  }
}

Result<void> makeCurveClient(zmq::socket_t& socket, const CurveKeyPair& keys, const std::string& serverPublicKey) {
  if (!isValidPublicKey(serverPublicKey)) return invalidArgument("'" + serverPublicKey + "' is not a Z85 public key");
  try {
    socket.set(zmq::sockopt::curve_serverkey, serverPublicKey);
    socket.set(zmq::sockopt::curve_publickey, keys.publicKey);
    socket.set(zmq::sockopt::curve_secretkey, keys.secretKey);
    return {};
  } catch (const zmq::error_t& e) {
    return internalError(std::string("cannot make a CURVE client socket: ") + e.what());
  }
}

Result<std::vector<zmq::message_t>> receiveMultipart(zmq::socket_t& socket, std::size_t maxFrames, bool* dropped) {
  std::vector<zmq::message_t> frames;
  bool tooMany = false;
  try {
    while (true) {
      zmq::message_t frame;
      if (!socket.recv(frame, zmq::recv_flags::dontwait)) {
        if (frames.empty()) return Error{ErrorCode::kUnavailable, "no message waiting"};
        break;  // cannot happen mid-message: parts arrive together
      }
      const bool more = frame.more();
      if (frames.size() < maxFrames) {
        frames.push_back(std::move(frame));
      } else {
        tooMany = true;
      }
      if (!more) break;
    }
  } catch (const zmq::error_t& e) {
    return ioError(std::string("receive failed: ") + e.what());
  }
  if (tooMany && dropped != nullptr) *dropped = true;
  if (tooMany && dropped == nullptr) return invalidArgument("a message of more than " + std::to_string(maxFrames) + " frames");
  return frames;
}

}  // namespace lockstep
