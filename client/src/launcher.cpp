#include "lockstep/client/launcher.h"

#include <algorithm>

namespace lockstep {

Launcher::Launcher(JobSpec placed) : spec_(std::move(placed)) {
  for (const auto& p : spec_.ranks) {
    if (std::find(order_.begin(), order_.end(), p.node) == order_.end()) order_.push_back(p.node);
  }
  if (order_.empty()) error_ = invalidArgument("no node runs a rank of job " + spec_.jobId);
}

std::vector<Launcher::Start> Launcher::next() {
  std::vector<Start> out;
  if (error_ || awaited_ > 0 || handedOut_ == order_.size()) return out;
  // Rank 0's node alone, then (with its store's port and secret) all the others.
  const std::size_t end = handedOut_ == 0 ? 1 : order_.size();
  for (; handedOut_ < end; ++handedOut_) {
    out.push_back({order_[handedOut_], spec_, storeSecret_});
    ++awaited_;
  }
  return out;
}

void Launcher::started(const std::string& node, const StartJobReply& reply) {
  --awaited_;
  if (error_) {
    stopping_.push_back(node);  // it started after another part failed: stop it too
    return;
  }
  started_.push_back(node);
  // The other nodes' ranks reach rank 0's store (placeJob named its host) with its port and secret.
  if (node == order_.front() && spec_.worldSize > 1) {
    spec_.rendezvousPort = reply.rendezvousPort;
    storeSecret_ = reply.storeSecret;
  }
}

void Launcher::failed(const std::string& node, const Error& error) {
  --awaited_;
  // An agent whose answer did not come in time may still start its part.
  const bool mayStart = error.code == ErrorCode::kTimeout || error.code == ErrorCode::kUnavailable;
  if (error_) {
    if (mayStart) stopping_.push_back(node);
    return;
  }
  stopping_ = started_;
  if (mayStart) stopping_.push_back(node);
  error_ = error.withContext("starting job " + spec_.jobId + " on " + node +
                             (stopping_.empty() ? "" : "; stopping the parts already started"));
}

bool Launcher::finished() const { return awaited_ == 0 && (error_ || handedOut_ == order_.size()); }

std::vector<std::string> Launcher::toStop() { return std::exchange(stopping_, {}); }

}  // namespace lockstep
