#include "trainer.h"

#include <cblas.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "checkpoint.h"
#include "cpu_share.h"
#include "lockstep/common/clock.h"
#include "lockstep/protocol/validate.h"
#include "rank_state.h"
#include "step_accounting.h"

namespace lockstep::trainer {
namespace {

using std::chrono::milliseconds;

// A 64-bit fingerprint of the data set, so that a resumed run can tell it trains on the same data.
std::uint64_t datasetHash(const Dataset& d) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ d.samples;
  auto mix = [&h](const void* data, std::size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::size_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
      std::uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0x100000001b3ull;
      h ^= h >> 29;
    }
    for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  };
  mix(d.features.data(), d.features.size() * sizeof(float));
  mix(d.labels.data(), d.labels.size() * sizeof(std::int32_t));
  return h;
}

// What rank 0 tells every rank about the initial state it loaded.
struct InitialHeader {
  std::int64_t failed = 0;
  std::uint64_t firstStep = 0;
  std::int64_t optimizerSteps = 0;
};

// Rank 0: --init-weights, then the newest checkpoint in --checkpoint-dir (with --resume), into the
// state; `firstStep` becomes the checkpoint's step.
Result<void> readInitialState(const jobflags::TrainerOptions& options, RankState& s, std::uint64_t& firstStep) {
  const JobSpec& spec = options.spec;
  if (!spec.initWeightsPath.empty()) {
    if (auto r = loadWeights(spec.initWeightsPath, *s.layout, s.params.data()); !r) {
      return r.error().withContext("--init-weights");
    }
  }
  if (spec.checkpointDir.empty()) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(const auto latest, latestCheckpoint(spec.checkpointDir));
  if (latest.has_value() && !options.resume) {
    // Retention would delete this run's checkpoints in favour of the older, higher-numbered ones.
    return invalidArgument("--checkpoint-dir " + spec.checkpointDir + " already holds checkpoints (newest: " +
                           latest.value() + "); add --resume to continue from them, or use an empty directory");
  }
  if (latest.has_value()) {
    LOCKSTEP_ASSIGN_OR_RETURN(firstStep, loadCheckpoint(*latest, *s.layout, s.params.data(), *s.optimizer, s.resume));
    std::fprintf(stderr, "[lockstep] resuming from %s (step %llu)\n", latest->c_str(),
                 static_cast<unsigned long long>(firstStep));
  } else if (options.resume) {
    std::fprintf(stderr, "[lockstep] no checkpoint in %s yet: starting from step 0\n", spec.checkpointDir.c_str());
  }
  return {};
}

}  // namespace

RankRunner::RankRunner(jobflags::TrainerOptions options, DistEnv env, const std::atomic<int>& stopSignal)
    : options_(std::move(options)), env_(std::move(env)), stopSignal_(stopSignal), state_(std::make_unique<RankState>()) {
  options_.spec.worldSize = env_.worldSize;
}

RankRunner::~RankRunner() = default;

Result<RunSummary> RankRunner::run() {
  // Checked here, where the world size is known, for both backends.
  if (options_.spec.sync == Sync::kParameterServer) LOCKSTEP_TRY(validatePsRanks(options_.spec));
  LOCKSTEP_ASSIGN_OR_RETURN(loop_, makeRankLoop(options_.spec.backend, *this));
  LOCKSTEP_TRY(setUp());
  LOCKSTEP_TRY(loop_->setUp());
  LOCKSTEP_TRY(connect());
  LOCKSTEP_TRY(restoreOrInit());
  StepAccounting accounting(options_, env_, *state_);
  LOCKSTEP_TRY(loop_->train(accounting));
  LOCKSTEP_TRY(finishRun(accounting.summary().stepsDone));
  accounting.finish();
  state_->heartbeat.reset();
  RunSummary summary = accounting.summary();
  summary.droppedReports = state_->metrics->close();
  return summary;
}

Result<void> RankRunner::setUp() {
  RankState& s = *state_;
  const JobSpec& spec = options_.spec;
  placeThreads();
  // Rank 0 empties a shared metrics file before anyone can write to it (the others open it only
  // after the rendezvous, which needs rank 0). Under a launcher, the launcher did it.
  if (env_.rank == 0 && !env_.storeHostedByLauncher && !options_.metricsOut.empty() && options_.resume == false) {
    const int fd = ::open(options_.metricsOut.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errnoError("--metrics-out: cannot create " + options_.metricsOut, errno);
    ::close(fd);
  }

  LOCKSTEP_ASSIGN_OR_RETURN(s.data, loadDataset(spec));
  s.layout = std::make_unique<ParamLayout>(spec.layers);
  s.params.assign(s.layout->totalFloats(), 0.0f);
  s.optimizer = std::make_unique<Optimizer>(spec.optimizer, *s.layout);
  s.sampler = std::make_unique<GlobalBatchSampler>(s.data.samples, env_.worldSize, spec.batchPerRank, spec.accumSteps,
                                                   spec.shuffle, spec.seed);
  s.totalSteps = spec.steps > 0 ? spec.steps : std::uint64_t{spec.epochs} * s.sampler->stepsPerEpoch();
  if (!spec.checkpointDir.empty()) s.resume = resumeSettings(spec, s.data.samples, datasetHash(s.data));
  return {};
}

// The BLAS threads, and each local rank on its own CPUs where the loop computes on them. Before any
// thread starts, so that the BLAS and communication threads inherit it.
void RankRunner::placeThreads() const {
  const std::vector<int> allowed = allowedCpus();
  // An agent that gave this rank cores of its own (LOCKSTEP_RANK_CPUS) pinned it there already.
  const char* own = std::getenv("LOCKSTEP_RANK_CPUS");
  const bool ownCores = own != nullptr && *own != '\0';
  const CpuShare share = ownCores ? cpuShareOf(allowed, 0, 1) : cpuShareOf(allowed, env_.localRank, env_.localWorldSize);
  const std::uint32_t threads = options_.threads > 0 ? options_.threads : share.threads;
  const bool pinned = !ownCores && loop_->pinsCpus() && options_.pinCpus && env_.localWorldSize > 1 &&
                      threads <= share.cpus.size() && !boundAlready(allowed) && pinTo(share);
  openblas_set_num_threads(static_cast<int>(threads));
  if (pinned && !options_.quiet && env_.localRank == 0) {
    std::fprintf(stderr, "[lockstep] each of the %u local ranks computes on its own CPUs (local rank 0: %s; --no-pin-cpus to let them roam)\n",
                 env_.localWorldSize, share.describe().c_str());
  }
}

Result<void> RankRunner::connect() {
  RankState& s = *state_;
  if (env_.worldSize > 1) {
    LOCKSTEP_TRY(rendezvous());
    const std::string prefix = "lockstep/" + options_.spec.jobId + "/" + std::to_string(env_.attempt) + "/";
    LOCKSTEP_ASSIGN_OR_RETURN(s.comm, loop_->connect(s.store.get(), prefix));
    s.heartbeat = std::make_unique<Heartbeat>(*s.store, s.progress);
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(s.comm, loop_->connect(nullptr, ""));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(s.metrics, MetricsSink::open(options_.metricsOut, env_.reportEndpoint));
  return {};
}

// The rendezvous store (rank 0 hosts it unless the launcher does) and this rank's place in it.
Result<void> RankRunner::rendezvous() {
  RankState& s = *state_;
  const milliseconds timeout = commTimeout(options_.spec);
  if (env_.rank == 0 && !env_.storeHostedByLauncher) {
    StoreServerOptions store;
    store.secret = env_.storeSecret;
    store.worldSize = env_.worldSize;
    LOCKSTEP_ASSIGN_OR_RETURN(s.storeServer, StoreServer::start(env_.masterAddr, env_.masterPort, store));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(s.store, StoreClient::connect(env_.masterAddr, env_.masterPort, timeout, env_.storeSecret,
                                                          static_cast<int>(env_.rank)));
  s.store->setInterruptCheck([this] { return stopSignal_.load() != 0; });
  return s.store->registerRank();
}

Result<void> RankRunner::restoreOrInit() {
  RankState& s = *state_;
  const JobSpec& spec = options_.spec;
  initParameters(*s.layout, spec.seed, s.params.data());

  // Rank 0 reads files; every rank then receives its result, so other nodes need no copy.
  InitialHeader header;
  Result<void> loaded;
  if (env_.rank == 0) {
    loaded = readInitialState(options_, s, header.firstStep);
    header.failed = loaded ? 0 : 1;
    header.optimizerSteps = s.optimizer->stepsTaken();
  }
  s.progress.enter(RankPhase::kCommunicate);
  if (s.comm) {
    if (auto r = s.comm->broadcast(&header, sizeof header, 0); !r) return diagnoseCommFailure(r.error(), "at start-up");
  }
  if (!loaded) return loaded.error();
  // The job's input is at fault (weights or checkpoint files), on every rank.
  if (header.failed) return invalidArgument("rank 0 could not load the initial state (see its error)");
  s.firstStep = header.firstStep;
  s.optimizer->setStepsTaken(header.optimizerSteps);
  if (s.firstStep > s.totalSteps) {
    return invalidArgument("the checkpoint is at step " + std::to_string(s.firstStep) + ", past the " +
                           std::to_string(s.totalSteps) + " steps of this run; raise --steps to continue");
  }
  LOCKSTEP_TRY(shareInitialState());
  // Sharded: every rank started from the full state, as a checkpoint holds it; each keeps its part.
  if (spec.shard != Shard::kNone && s.comm) {
    s.shards = std::make_unique<ShardPlan>(*s.layout, static_cast<int>(env_.worldSize));
    s.optimizer = partOf(*s.optimizer, *s.shards, static_cast<int>(env_.rank));
  }
  if (env_.rank == 0 && !spec.checkpointDir.empty()) {
    s.checkpoints = std::make_unique<CheckpointWriter>(
        spec.checkpointDir, *s.layout, spec.keepCheckpoints > 0 ? spec.keepCheckpoints : kDefaultKeepCheckpoints);
  }
  return {};
}

// Rank 0's parameters and optimizer state, to every rank.
Result<void> RankRunner::shareInitialState() {
  RankState& s = *state_;
  if (!s.comm) return {};
  if (auto r = s.comm->broadcast(s.params.data(), s.params.size() * sizeof(float), 0); !r) {
    return diagnoseCommFailure(r.error(), "at start-up");
  }
  for (const auto& buffer : s.optimizer->stateBuffers()) {
    if (auto r = s.comm->broadcast(buffer.data->data(), buffer.data->size() * sizeof(float), 0); !r) {
      return diagnoseCommFailure(r.error(), "at start-up");
    }
  }
  return {};
}

void RankRunner::notePhase(const char* name, Clock::time_point began, std::uint64_t step) const {
  if (!state_->metrics) return;
  PhaseReport p;
  stampSender(p, options_.spec.jobId, env_);
  p.name = name;
  p.timeUnixUs = unixMicrosNow();
  p.durationUs = micros(Clock::now() - began);
  p.step = step;
  state_->metrics->phase(p);
}

void RankRunner::note(const std::string& text) const {
  if (env_.rank != 0) return;
  if (!options_.quiet) std::fprintf(stderr, "[lockstep] %s\n", text.c_str());
  JobEvent event;
  event.jobId = options_.spec.jobId;
  event.kind = JobEventKind::kNote;
  event.timeUnixUs = unixMicrosNow();
  event.rank = env_.rank;
  event.message = text;
  if (state_->metrics) state_->metrics->note(event);
}

// After the last step: the last checkpoint, leaving together, the final weights.
Result<void> RankRunner::finishRun(std::uint64_t stepsDone) {
  RankState& s = *state_;
  const bool logging = env_.rank == 0 && !options_.quiet;
  if (s.checkpoints) {
    s.progress.enter(RankPhase::kCheckpoint);
    const auto finishStart = Clock::now();
    bool waited = false;
    LOCKSTEP_ASSIGN_OR_RETURN(const std::string last, s.checkpoints->finish(&waited));
    if (waited) notePhase("checkpoint", finishStart, stepsDone);  // the job waited for its last write
    if (logging && !last.empty()) std::fprintf(stderr, "[lockstep] last checkpoint: %s\n", last.c_str());
  }
  // Leave together, so that no rank tears down a connection another still reads.
  if (s.comm) {
    s.progress.enter(RankPhase::kCommunicate);
    if (auto r = s.comm->barrier(); !r) return diagnoseCommFailure(r.error(), "at the end");
  }
  if (env_.rank == 0 && !options_.saveWeightsPath.empty()) {
    if (auto r = saveWeights(options_.saveWeightsPath, *s.layout, s.params.data()); !r) {
      return r.error().withContext("--save-weights");
    }
  }
  return {};
}

Error RankRunner::diagnoseCommFailure(const Error& error, const std::string& when) {
  commBroken_ = true;
  RankState& s = *state_;
  // A world of one has no store and no peer to lose: the error is the collective's own.
  if (!s.store) return error.withContext("rank " + std::to_string(env_.rank) + " " + when);
  std::string lost;
  // The store may need a moment to notice a closed connection, and a launcher to record how the
  // process ended; ask for up to two seconds.
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto status = s.store->status(std::chrono::seconds(2));
    if (!status) {
      lost = env_.storeHostedByLauncher ? "the launcher that hosts the rendezvous store (unreachable)"
                                        : "rank 0 (the rendezvous store it hosts is unreachable)";
      break;
    }
    lost.clear();
    bool waitingForExitNote = false;
    for (const auto& peer : *status) {
      if (peer.rank == static_cast<int>(env_.rank) || peer.state != RankLiveness::State::kDisconnected) continue;
      lost += (lost.empty() ? "" : ", ") + std::string("rank ") + std::to_string(peer.rank) + " (its process is gone" +
              (peer.exitNote.empty() ? "" : ": " + peer.exitNote) + ")";
      waitingForExitNote |= peer.exitNote.empty() && env_.storeHostedByLauncher;
    }
    if (!lost.empty() && !waitingForExitNote) break;
    if (lost.empty() && error.code != ErrorCode::kPeerLost) {
      lost = describeStragglers(*status);
      break;
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
  if (lost.empty()) lost = "a peer";
  return Error{error.code == ErrorCode::kTimeout ? ErrorCode::kTimeout : ErrorCode::kPeerLost,
               "rank " + std::to_string(env_.rank) + " lost " + lost + " " + when + ": " + error.message};
}

// A collective timed out and nobody's connection closed: name the ranks that are not in it.
std::string RankRunner::describeStragglers(const std::vector<RankLiveness>& status) const {
  constexpr std::int64_t kStaleMillis = 3000;  // three missed heartbeats
  std::string frozen, busy;
  for (const auto& peer : status) {
    if (peer.rank == static_cast<int>(env_.rank)) continue;
    const std::string who = "rank " + std::to_string(peer.rank);
    if (peer.millisSinceHeartbeat > kStaleMillis) {
      frozen += (frozen.empty() ? "" : ", ") + who + " (no heartbeat for " +
                std::to_string(peer.millisSinceHeartbeat / 1000) + " s: stopped, or its host is overloaded)";
    } else if (peer.phase != RankPhase::kCommunicate) {
      busy += (busy.empty() ? "" : ", ") + who + " (" + std::string(rankPhaseName(peer.phase)) + " for " +
              std::to_string(peer.millisInPhase / 1000) + " s after step " + std::to_string(peer.step) +
              ", not in the collective)";
    }
  }
  if (!frozen.empty()) return frozen;
  if (!busy.empty()) return busy;
  return "a peer (every rank is in the collective: check the network between them)";
}

void RankRunner::waitForPeersToLeave(std::chrono::milliseconds timeout) const {
  const RankState& s = *state_;
  if (!s.storeServer) return;
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    bool othersConnected = false;
    for (const auto& peer : s.storeServer->liveness()) {
      othersConnected |= peer.rank != static_cast<int>(env_.rank) && peer.state == RankLiveness::State::kConnected;
    }
    if (!othersConnected) return;
    std::this_thread::sleep_for(milliseconds(50));
  }
}

}  // namespace lockstep::trainer
