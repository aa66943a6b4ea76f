#include "ps_server.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels.h"
#include "model.h"
#include "rank_host.h"

namespace lockstep::trainer {

static_assert(kPsHeaderAt * sizeof(float) + sizeof(PsHeader) <= ParamLayout::kHeaderFloats * sizeof(float));
static_assert(std::is_trivially_copyable_v<PsHeader>);

PsHeader readPsHeader(const float* buffer) {
  PsHeader h;
  std::memcpy(static_cast<void*>(&h), buffer + kPsHeaderAt, sizeof h);
  return h;
}

void writePsHeader(float* buffer, const PsHeader& header) { std::memcpy(buffer + kPsHeaderAt, &header, sizeof header); }

std::size_t psMessageFloats(const ShardPlan& parts, int part) {
  return ParamLayout::kHeaderFloats + parts.end(part) - parts.begin(part);
}

double serverLearningRate(const JobSpec& spec) {
  if (spec.staleness == 0) return effectiveLearningRate(spec);
  return learningRateFor(spec, std::uint64_t{spec.batchPerRank} * spec.accumSteps);
}

ParameterServer::ParameterServer(PsServerSetup setup)
    : setup_(std::move(setup)), workers_(static_cast<int>(setup_.env->worldSize)),
      floats_(psMessageFloats(*setup_.parts, setup_.part)), master_(floats_, 0.0f),
      queued_(static_cast<std::size_t>(workers_)), receiving_(floats_),
      version_(static_cast<std::size_t>(workers_), setup_.firstStep), told_(static_cast<std::size_t>(workers_), false),
      updates_(setup_.firstStep) {
  const auto from = setup_.master->begin() + static_cast<std::ptrdiff_t>(partBegin());
  std::copy(from, from + static_cast<std::ptrdiff_t>(floats_ - ParamLayout::kHeaderFloats),
            master_.begin() + ParamLayout::kHeaderFloats);
  thread_ = std::thread([this] {
    result_ = serve();
    if (!result_) link_.reset();  // its pairs close: the workers see the server gone, not a timeout
  });
}

ParameterServer::~ParameterServer() {
  abort();
  if (thread_.joinable()) thread_.join();
}

void ParameterServer::abort() {
  aborting_ = true;
  std::lock_guard lock(pendingMutex_);
  if (pending_ != nullptr) pending_->abort();
}

Result<int> ParameterServer::waitFor(PsLink::Receive& receive) {
  {
    std::lock_guard lock(pendingMutex_);
    if (aborting_) return Error{ErrorCode::kCancelled, "parameter server: stopped"};
    pending_ = &receive;
  }
  auto arrived = receive.wait();
  std::lock_guard lock(pendingMutex_);
  pending_ = nullptr;
  return arrived;
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
  LOCKSTEP_ASSIGN_OR_RETURN(auto store, StoreClient::connect(env.masterAddr, env.masterPort, timeout, env.storeSecret,
                                                             static_cast<int>(env.rank)));
  GlooOptions mesh;
  mesh.rank = workers_ + setup_.part;
  mesh.worldSize = workers_ + setup_.parts->count();
  mesh.storePrefix = setup_.storePrefix;
  mesh.localHost = store->localAddress();
  mesh.timeout = timeout;
  LOCKSTEP_ASSIGN_OR_RETURN(link_, PsLink::connect(*store, mesh));
  // Resumed at its last step: the workers do not push either.
  if (updates_ >= setup_.totalSteps) return {};
  std::vector<int> everyWorker(static_cast<std::size_t>(workers_));
  for (int w = 0; w < workers_; ++w) everyWorker[static_cast<std::size_t>(w)] = w;
  while (std::count(told_.begin(), told_.end(), false) > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto receive, link_->receive(everyWorker, receiving_.data(), floats_, PsTag::kPush));
    LOCKSTEP_ASSIGN_OR_RETURN(const int worker, waitFor(*receive));
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
  const bool endAsked = std::any_of(queued_.begin(), queued_.end(), [](const auto& q) { return readPsHeader(q.data()).done != 0; });
  float* sum = queued_[0].data();
  for (std::size_t w = 1; w < queued_.size(); ++w) kernels::sumFloats(sum, sum, queued_[w].data(), floats_);
  LOCKSTEP_TRY(update(sum, endAsked));
  for (int w = 0; w < workers_; ++w) LOCKSTEP_TRY(reply(w, sum, 0, true));
  for (auto& q : queued_) q.clear();
  return {};
}

// The queued gradient computed on the oldest weights, if the bound holds for every other worker not
// yet told the run is over, queued or computing: after this update the j-th oldest of them (from 1)
// can be applied as update updates_ + j at the earliest, so its gradient is then at least
// updates_ + j - v_j old. Returns whether a gradient was taken (a gradient of no samples, at an
// epoch's end, makes no update: the worker goes on with the weights as they are).
Result<bool> ParameterServer::applyOldestIfBounded() {
  std::vector<int> others;
  int oldest = -1;
  for (int w = 0; w < workers_; ++w) {
    const auto i = static_cast<std::size_t>(w);
    if (told_[i]) continue;
    others.push_back(w);
    if (!queued_[i].empty() && (oldest < 0 || version_[i] < version_[static_cast<std::size_t>(oldest)])) oldest = w;
  }
  if (oldest < 0) return false;
  const auto o = static_cast<std::size_t>(oldest);
  const float* gradient = queued_[o].data();
  if (gradient[kSampleCount] == 0.0f) {
    LOCKSTEP_TRY(reply(oldest, gradient, 0, false));
    queued_[o].clear();
    return true;
  }
  others.erase(std::find(others.begin(), others.end(), oldest));
  std::sort(others.begin(), others.end(),
            [&](int a, int b) { return version_[static_cast<std::size_t>(a)] < version_[static_cast<std::size_t>(b)]; });
  for (std::size_t j = 0; j < others.size(); ++j) {
    if (updates_ + 1 + j - version_[static_cast<std::size_t>(others[j])] > setup_.options->spec.staleness) {
      return false;  // applying it would leave that worker's gradient too stale: wait for older ones first
    }
  }
  const auto staleness = static_cast<std::uint32_t>(updates_ - version_[o]);
  LOCKSTEP_TRY(update(gradient, readPsHeader(gradient).done != 0));
  LOCKSTEP_TRY(reply(oldest, gradient, staleness, true));
  queued_[o].clear();
  return true;
}

Result<void> ParameterServer::update(const float* gradient, bool endAsked) {
  Optimizer& optimizer = *setup_.optimizer;  // over this part's range
  optimizer.beginStep(serverLearningRate(setup_.options->spec));
  optimizer.applyToRange(master_.data() + ParamLayout::kHeaderFloats, gradient + ParamLayout::kHeaderFloats,
                         1.0f / gradient[kSampleCount]);
  ++updates_;
  stopVoted_ = gradient[kStopVotes] > 0.0f;
  over_ = updates_ >= setup_.totalSteps || stopVoted_ || endAsked;
  return checkpointIfDue(stopVoted_);
}

// The master's weights to a worker, with the update's loss, samples and votes (headerFrom's) and
// what it needs to go on.
Result<void> ParameterServer::reply(int worker, const float* headerFrom, std::uint32_t staleness, bool applied) {
  const auto w = static_cast<std::size_t>(worker);
  float* master = master_.data();
  std::copy(headerFrom, headerFrom + kPsHeaderAt, master);
  writePsHeader(master, PsHeader{updates_, over_ ? 1u : 0u, staleness, applied ? 1u : 0u, stopVoted_ ? 1u : 0u});
  version_[w] = updates_;
  told_[w] = over_;
  return link_->send(worker, master, floats_, PsTag::kPull);
}

Result<void> ParameterServer::checkpointIfDue(bool stopVoted) {
  const JobSpec& spec = setup_.options->spec;
  if (spec.checkpointDir.empty() || spec.checkpointEvery == 0) return {};
  if (updates_ % spec.checkpointEvery != 0 && !stopVoted) return {};
  Optimizer& mine = *setup_.optimizer;
  if (setup_.part != 0) {
    // This part's range of the master, then of each optimizer state buffer, to part 0.
    std::vector<float> state(master_.begin() + ParamLayout::kHeaderFloats, master_.end());
    for (const auto& buffer : mine.stateBuffers()) state.insert(state.end(), buffer.data->begin(), buffer.data->end());
    return link_->send(workers_, state.data(), state.size(), PsTag::kState);
  }
  Optimizer whole(spec.optimizer, *setup_.layout);
  whole.setStepsTaken(mine.stepsTaken());
  std::vector<float> params(setup_.layout->totalFloats(), 0.0f);
  LOCKSTEP_TRY(assembleCheckpoint(params, whole));
  if (setup_.checkpoints == nullptr) return {};
  return setup_.checkpoints->submit(snapshotCheckpoint(updates_, *setup_.resume, params, whole));
}

Result<void> ParameterServer::assembleCheckpoint(std::vector<float>& params, Optimizer& whole) {
  const ShardPlan& parts = *setup_.parts;
  auto place = [&](int part, const float* range, const std::vector<std::vector<float>*>& state) {
    const std::size_t begin = parts.begin(part), floats = parts.end(part) - begin;
    std::copy(range, range + floats, params.begin() + static_cast<std::ptrdiff_t>(begin));
    const auto all = whole.stateBuffers();
    for (std::size_t b = 0; b < all.size(); ++b) {
      std::copy(state[b]->begin(), state[b]->begin() + static_cast<std::ptrdiff_t>(floats),
                all[b].data->begin() + static_cast<std::ptrdiff_t>(begin));
    }
  };
  std::vector<std::vector<float>*> own;
  for (const auto& buffer : setup_.optimizer->stateBuffers()) own.push_back(buffer.data);
  place(0, master_.data() + ParamLayout::kHeaderFloats, own);
  for (int part = 1; part < parts.count(); ++part) {
    const std::size_t floats = parts.end(part) - parts.begin(part);
    const std::size_t buffers = whole.stateBuffers().size();
    std::vector<float> message(floats * (1 + buffers));
    LOCKSTEP_ASSIGN_OR_RETURN(auto receive, link_->receive({workers_ + part}, message.data(), message.size(), PsTag::kState));
    LOCKSTEP_ASSIGN_OR_RETURN(const int sender, waitFor(*receive));
    (void)sender;
    std::vector<std::vector<float>> state(buffers);
    std::vector<std::vector<float>*> pointers;
    for (std::size_t b = 0; b < buffers; ++b) {
      const auto at = message.begin() + static_cast<std::ptrdiff_t>(floats * (1 + b));
      state[b].assign(at, at + static_cast<std::ptrdiff_t>(floats));
      pointers.push_back(&state[b]);
    }
    place(part, message.data(), pointers);
  }
  return {};
}

}  // namespace lockstep::trainer
