#include "ps_link.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include "gloo_mesh.h"

namespace lockstep::trainer {

Result<std::unique_ptr<PsLink>> PsLink::connect(StoreClient& store, const GlooOptions& options) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto context, connectGlooMesh(store, options, /*synchronousPairs=*/false));
  return std::unique_ptr<PsLink>(new PsLink(std::move(context), options.timeout));
}

PsLink::PsLink(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
    : context_(std::move(context)), timeout_(timeout) {}

PsLink::~PsLink() = default;

int PsLink::rank() const { return context_->rank; }
int PsLink::size() const { return context_->size; }

PsLink::Receive::Receive(std::unique_ptr<gloo::transport::UnboundBuffer> buffer, std::chrono::milliseconds timeout)
    : buffer_(std::move(buffer)), timeout_(timeout) {}

PsLink::Receive::~Receive() = default;

void PsLink::Receive::abort() { buffer_->abortWaitRecv(); }

Result<int> PsLink::Receive::wait() {
  try {
    int from = -1;
    if (!buffer_->waitRecv(&from, timeout_)) return Error{ErrorCode::kCancelled, "parameter server: receive aborted"};
    return from;
  } catch (const std::exception& e) {
    return glooError("receive", e);
  }
}

Result<std::unique_ptr<PsLink::Receive>> PsLink::receive(const std::vector<int>& from, float* data, std::size_t floats,
                                                         PsTag tag) {
  try {
    auto buffer = context_->createUnboundBuffer(data, floats * sizeof(float));
    buffer->recv(from, static_cast<std::uint64_t>(tag));
    return std::unique_ptr<Receive>(new Receive(std::move(buffer), timeout_));
  } catch (const std::exception& e) {
    return glooError("receive", e);
  }
}

Result<void> PsLink::send(int to, float* data, std::size_t floats, PsTag tag) {
  try {
    auto buffer = context_->createUnboundBuffer(data, floats * sizeof(float));
    buffer->send(to, static_cast<std::uint64_t>(tag));
    if (!buffer->waitSend(timeout_)) return Error{ErrorCode::kCancelled, "parameter server: send aborted"};
    return {};
  } catch (const std::exception& e) {
    return glooError("send", e);
  }
}

}  // namespace lockstep::trainer
