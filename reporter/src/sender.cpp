#include "lockstep/reporter/sender.h"

#include <zmq.hpp>

#include "lockstep/protocol/codec.h"

namespace lockstep {

struct ReportSender::Socket {
  zmq::context_t context{1};
  zmq::socket_t push{context, zmq::socket_type::push};
};

ReportSender::ReportSender(std::unique_ptr<Socket> socket) : socket_(std::move(socket)) {}
ReportSender::~ReportSender() { close(); }

Result<std::unique_ptr<ReportSender>> ReportSender::connect(const std::string& endpoint) {
  try {
    auto socket = std::make_unique<Socket>();
    socket->push.set(zmq::sockopt::sndhwm, 100000);
    socket->push.set(zmq::sockopt::linger, 2000);
    socket->push.connect(endpoint);
    return std::unique_ptr<ReportSender>(new ReportSender(std::move(socket)));
  } catch (const zmq::error_t& e) {
    return invalidArgument("LOCKSTEP_REPORT='" + endpoint + "' is not a usable ZeroMQ endpoint: " + e.what());
  }
}

bool ReportSender::send(const StepReport& report) { return push(report); }

bool ReportSender::send(const JobEvent& note) { return push(note); }

bool ReportSender::send(const PhaseReport& phase) { return push(phase); }

bool ReportSender::push(StreamPayload payload) {
  if (!socket_) return false;
  const std::string bytes = encode(StreamMessage{++seq_, "", std::move(payload)});
  try {
    if (socket_->push.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) return true;
  } catch (const zmq::error_t&) {
    // Counted as dropped like a full queue: the rank goes on either way.
  }
  ++dropped_;
  return false;
}

std::uint64_t ReportSender::close() {
  if (socket_) {
    socket_->push.close();  // lingers up to 2 s for queued reports
    socket_->context.close();
    socket_.reset();
  }
  return dropped_;
}

}  // namespace lockstep
