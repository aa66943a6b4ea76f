#include "ps_server.h"

#include <algorithm>
#include <cstring>

#include "kernels.h"
#include "model.h"
#include "rank_host.h"

namespace lockstep::trainer {

static_assert(kPsHeaderAt * sizeof(float) + sizeof(PsHeader) <= ParamLayout::kHeaderFloats * sizeof(float));

PsHeader readPsHeader(const float* buffer) {
  PsHeader h;
  std::memcpy(&h, buffer + kPsHeaderAt, sizeof h);
  return h;
}

void writePsHeader(float* buffer, const PsHeader& header) { std::memcpy(buffer + kPsHeaderAt, &header, sizeof header); }

double serverLearningRate(const JobSpec& spec) {
  if (spec.staleness == 0 || spec.optimizer.lrScaling == LrScaling::kNone) return effectiveLearningRate(spec);
  const double base = spec.optimizer.lrBaseBatch > 0 ? spec.optimizer.lrBaseBatch : spec.batchPerRank;
  return spec.optimizer.lr * static_cast<double>(std::uint64_t{spec.batchPerRank} * spec.accumSteps) / base;
}

ParameterServer::ParameterServer(PsServerSetup setup)
    : setup_(std::move(setup)), workers_(static_cast<int>(setup_.env->worldSize)), floats_(setup_.master->size()),
      queued_(static_cast<std::size_t>(workers_)), receiving_(floats_),
      version_(static_cast<std::size_t>(workers_), setup_.firstStep), told_(static_cast<std::size_t>(workers_), false),
      updates_(setup_.firstStep) {
  thread_ = std::thread([this] { result_ = serve(); });
}

ParameterServer::~ParameterServer() {
  if (thread_.joinable()) thread_.join();
}

Result<void> ParameterServer::join() {
  if (thread_.joinable()) thread_.join();
  return result_;
}

std::uint64_t ParameterServer::gradientBytes() const {
  return static_cast<std::uint64_t>(workers_ + 1) * floats_ * sizeof(float);
}

Result<void> ParameterServer::serve() {
  const DistEnv& env = *setup_.env;
  const auto timeout = commTimeout(setup_.options->spec);
  LOCKSTEP_ASSIGN_OR_RETURN(auto store, StoreClient::connect(env.masterAddr, env.masterPort, timeout, env.storeSecret, 0));
  GlooOptions mesh;
  mesh.rank = workers_;
  mesh.worldSize = workers_ + 1;
  mesh.storePrefix = setup_.storePrefix;
  mesh.localHost = store->localAddress();
  mesh.timeout = timeout;
  LOCKSTEP_ASSIGN_OR_RETURN(link_, PsLink::connect(*store, mesh));
  if (updates_ >= setup_.totalSteps) over_ = true;
  std::vector<int> everyWorker(static_cast<std::size_t>(workers_));
  for (int w = 0; w < workers_; ++w) everyWorker[static_cast<std::size_t>(w)] = w;
  while (std::count(told_.begin(), told_.end(), false) > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto receive, link_->receive(everyWorker, receiving_.data(), floats_, PsTag::kPush));
    LOCKSTEP_ASSIGN_OR_RETURN(const int worker, receive->wait());
    if (worker < 0 || worker >= workers_ || told_[static_cast<std::size_t>(worker)]) {
      return internalError("parameter server: a push from worker " + std::to_string(worker) + ", which is done");
    }
    LOCKSTEP_TRY(received(worker));
  }
  return {};
}

// A worker's gradient is in: queue it, then make every update the bound allows.
Result<void> ParameterServer::received(int worker) {
  const auto w = static_cast<std::size_t>(worker);
  queued_[w].swap(receiving_);
  receiving_.resize(floats_);
  version_[w] = readPsHeader(queued_[w].data()).version;
  if (!over_) {
    if (setup_.options->spec.staleness == 0) {
      LOCKSTEP_TRY(applySynchronous());
    } else {
      for (bool applied = true; applied && !over_;) {
        LOCKSTEP_ASSIGN_OR_RETURN(applied, applyOldestIfBounded());
      }
    }
  }
  if (!over_) return {};
  // The run is over: whoever is waiting hears so, its gradient unused.
  for (std::size_t q = 0; q < queued_.size(); ++q) {
    if (queued_[q].empty() || told_[q]) continue;
    LOCKSTEP_TRY(reply(static_cast<int>(q), queued_[q].data(), 0, false));
    queued_[q].clear();
  }
  return {};
}

// Every worker's gradient, summed in rank order into the first's: one update of the global batch.
Result<void> ParameterServer::applySynchronous() {
  if (std::any_of(queued_.begin(), queued_.end(), [](const auto& q) { return q.empty(); })) return {};
  float* sum = queued_[0].data();
  for (std::size_t w = 1; w < queued_.size(); ++w) kernels::sumFloats(sum, sum, queued_[w].data(), floats_);
  LOCKSTEP_TRY(update(sum, version_[0]));
  for (int w = 0; w < workers_; ++w) LOCKSTEP_TRY(reply(w, sum, 0, true));
  for (auto& q : queued_) q.clear();
  return {};
}

// The queued gradient computed on the oldest weights, if no worker still computing would then be
// more than K updates behind. Returns whether it was applied.
Result<bool> ParameterServer::applyOldestIfBounded() {
  int oldest = -1, computing = -1;
  for (int w = 0; w < workers_; ++w) {
    const auto i = static_cast<std::size_t>(w);
    if (told_[i]) continue;
    int& pick = queued_[i].empty() ? computing : oldest;
    if (pick < 0 || version_[i] < version_[static_cast<std::size_t>(pick)]) pick = w;
  }
  if (oldest < 0) return false;
  const auto o = static_cast<std::size_t>(oldest);
  if (computing >= 0 && updates_ + 1 - version_[static_cast<std::size_t>(computing)] > setup_.options->spec.staleness) {
    return false;  // applying it would leave that worker's gradient too stale: wait for it first
  }
  const auto staleness = static_cast<std::uint32_t>(updates_ - version_[o]);
  LOCKSTEP_TRY(update(queued_[o].data(), version_[o]));
  LOCKSTEP_TRY(reply(oldest, queued_[o].data(), staleness, true));
  queued_[o].clear();
  return true;
}

Result<void> ParameterServer::update(const float* gradient, std::uint64_t /*gradientVersion*/) {
  std::vector<float>& master = *setup_.master;
  Optimizer& optimizer = *setup_.optimizer;
  optimizer.beginStep(serverLearningRate(setup_.options->spec));
  optimizer.apply(master.data(), gradient, 0, floats_, 1.0f / gradient[kSampleCount]);
  ++updates_;
  stopVoted_ = gradient[kStopVotes] > 0.0f;
  over_ = updates_ >= setup_.totalSteps || stopVoted_;
  return checkpointIfDue(stopVoted_);
}

// The master's weights to a worker, with the update's loss, samples and votes (headerFrom's) and
// what it needs to go on.
Result<void> ParameterServer::reply(int worker, const float* headerFrom, std::uint32_t staleness, bool applied) {
  const auto w = static_cast<std::size_t>(worker);
  float* master = setup_.master->data();
  std::copy(headerFrom, headerFrom + kPsHeaderAt, master);
  writePsHeader(master, PsHeader{updates_, over_ ? 1u : 0u, staleness, applied ? 1u : 0u, 0});
  version_[w] = updates_;
  told_[w] = over_;
  return link_->send(worker, master, floats_, PsTag::kPull);
}

Result<void> ParameterServer::checkpointIfDue(bool stopVoted) {
  const JobSpec& spec = setup_.options->spec;
  if (setup_.checkpoints == nullptr || spec.checkpointEvery == 0) return {};
  if (updates_ % spec.checkpointEvery != 0 && !stopVoted) return {};
  return setup_.checkpoints->submit(snapshotCheckpoint(updates_, *setup_.resume, *setup_.master, *setup_.optimizer));
}

}  // namespace lockstep::trainer
