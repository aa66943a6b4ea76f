#include "trainer.h"

#include <cblas.h>
#include <fcntl.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "checkpoint.h"
#include "cpu_share.h"
#include "comm.h"
#include "dataset.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/store.h"
#include "metrics.h"
#include "model.h"
#include "optimizer.h"
#include "rank_state.h"
#include "reducer.h"
#include "sampler.h"
#include "shm_comm.h"

namespace lockstep::trainer {
namespace {

using std::chrono::milliseconds;

constexpr double kLossSmoothing = 0.1;  // EMA weight of the newest loss for --target-loss

std::int64_t micros(Clock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }


Result<std::uint32_t> envNumber(const char* name, std::uint32_t fallback, std::uint32_t max) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  std::uint32_t v = 0;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || ptr != end || v > max) {
    return invalidArgument(std::string(name) + "='" + text + "' is not a whole number up to " + std::to_string(max));
  }
  return v;
}

std::string withThousands(double v) {
  std::string digits = std::to_string(static_cast<long long>(std::llround(v)));
  for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3) digits.insert(static_cast<size_t>(i), ",");
  return digits;
}

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

// LOCKSTEP_TEST_SLOWDOWN=RANK:FACTOR makes that rank compute FACTOR times slower (it idles for the
// difference): the load-balancing tests and benchmark stand in for slower hardware with it.
Result<double> testSlowdown(std::uint32_t rank) {
  const char* text = std::getenv("LOCKSTEP_TEST_SLOWDOWN");
  if (text == nullptr || *text == '\0') return 1.0;
  unsigned slowRank = 0;
  double factor = 0;
  if (std::sscanf(text, "%u:%lf", &slowRank, &factor) != 2 || !(factor >= 1.0) || factor > 100.0) {
    return invalidArgument(std::string("LOCKSTEP_TEST_SLOWDOWN='") + text + "': expected RANK:FACTOR with FACTOR 1 to 100");
  }
  return slowRank == rank ? factor : 1.0;
}

}  // namespace

Result<DistEnv> distEnvFromEnvironment() {
  DistEnv env;
  const bool distributed = std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr;
  LOCKSTEP_ASSIGN_OR_RETURN(env.attempt, envNumber("LOCKSTEP_ATTEMPT", 0, 1u << 20));
  if (const char* report = std::getenv("LOCKSTEP_REPORT")) env.reportEndpoint = report;
  if (!distributed) return env;
  LOCKSTEP_ASSIGN_OR_RETURN(env.rank, envNumber("RANK", 0, 65535));
  LOCKSTEP_ASSIGN_OR_RETURN(env.worldSize, envNumber("WORLD_SIZE", 1, 4096));
  LOCKSTEP_ASSIGN_OR_RETURN(env.localRank, envNumber("LOCAL_RANK", env.rank, 65535));
  LOCKSTEP_ASSIGN_OR_RETURN(env.localWorldSize, envNumber("LOCAL_WORLD_SIZE", env.worldSize, 4096));
  if (env.worldSize == 0) return invalidArgument("WORLD_SIZE must be at least 1");
  if (env.rank >= env.worldSize) {
    return invalidArgument("RANK=" + std::to_string(env.rank) + " is not below WORLD_SIZE=" + std::to_string(env.worldSize));
  }
  if (env.localRank >= env.localWorldSize) {
    return invalidArgument("LOCAL_RANK=" + std::to_string(env.localRank) + " is not below LOCAL_WORLD_SIZE=" +
                           std::to_string(env.localWorldSize));
  }
  if (env.worldSize > 1) {
    const char* addr = std::getenv("MASTER_ADDR");
    if (addr == nullptr || *addr == '\0') return invalidArgument("MASTER_ADDR is required when WORLD_SIZE > 1");
    env.masterAddr = addr;
    LOCKSTEP_ASSIGN_OR_RETURN(auto port, envNumber("MASTER_PORT", 0, 65535));
    if (port == 0) return invalidArgument("MASTER_PORT is required when WORLD_SIZE > 1 (a free TCP port on rank 0's host)");
    env.masterPort = static_cast<std::uint16_t>(port);
  }
  const char* agentStore = std::getenv("LOCKSTEP_AGENT_STORE");
  env.storeHostedByLauncher = agentStore != nullptr && std::string(agentStore) == "1";
  if (const char* secret = std::getenv("LOCKSTEP_STORE_SECRET"); secret != nullptr) {
    if (!isValidStoreSecret(secret)) {
      return invalidArgument("LOCKSTEP_STORE_SECRET is not 64 hex digits (the agent and the --nproc launcher set it; "
                             "ranks started by hand may share one, from `openssl rand -hex 32`)");
    }
    env.storeSecret = secret;
  }
  return env;
}

RankRunner::RankRunner(TrainerOptions options, DistEnv env, const std::atomic<int>& stopSignal)
    : options_(std::move(options)), env_(std::move(env)), stopSignal_(stopSignal), state_(std::make_unique<State>()) {
  options_.spec.worldSize = env_.worldSize;
}

RankRunner::~RankRunner() = default;

Result<RunSummary> RankRunner::run() {
  LOCKSTEP_TRY(setUp());
  LOCKSTEP_TRY(connect());
  LOCKSTEP_TRY(restoreOrInit());
  if (options_.spec.backend == Backend::kCpu && state_->comm) LOCKSTEP_TRY(setUpCpuBuckets());
  return train();
}

Result<void> RankRunner::setUp() {
  State& s = *state_;
  const JobSpec& spec = options_.spec;
  // Before any thread starts, so that the BLAS and communication threads inherit it.
  const std::vector<int> allowed = allowedCpus();
  const CpuShare share = cpuShareOf(allowed, env_.localRank, env_.localWorldSize);
  const std::uint32_t threads = options_.threads > 0 ? options_.threads : share.threads;
  const bool pinned = spec.backend == Backend::kCpu && options_.pinCpus && env_.localWorldSize > 1 &&
                      threads <= share.cpus.size() && !boundAlready(allowed) && pinTo(share);
  openblas_set_num_threads(static_cast<int>(threads));
  if (pinned && !options_.quiet && env_.localRank == 0) {
    std::fprintf(stderr, "[lockstep] each of the %u local ranks computes on its own CPUs (local rank 0: %s; --no-pin-cpus to let them roam)\n",
                 env_.localWorldSize, share.describe().c_str());
  }

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
  // With --balance dynamic a rank may take up to 4 per-rank batches of a micro-step.
  s.maxRows = spec.rebalanceEvery > 0 && env_.worldSize > 1
                  ? static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{spec.batchPerRank} * env_.worldSize,
                                                                       std::uint64_t{spec.batchPerRank} * 4))
                  : spec.batchPerRank;
  if (spec.backend == Backend::kCpu) s.model = std::make_unique<Mlp>(*s.layout, spec.activation, s.maxRows);
  LOCKSTEP_ASSIGN_OR_RETURN(s.slowdown, testSlowdown(env_.rank));
  s.totalSteps = spec.steps > 0 ? spec.steps : std::uint64_t{spec.epochs} * s.sampler->stepsPerEpoch();
  if (!spec.checkpointDir.empty()) s.resume = resumeSettings(spec, s.data.samples, datasetHash(s.data));
  return {};
}

Result<void> RankRunner::connect() {
  State& s = *state_;
  const JobSpec& spec = options_.spec;
  if (env_.worldSize > 1) {
    const milliseconds timeout = commTimeout();
    if (env_.rank == 0 && !env_.storeHostedByLauncher) {
      StoreServerOptions store;
      store.secret = env_.storeSecret;
      store.worldSize = env_.worldSize;
      LOCKSTEP_ASSIGN_OR_RETURN(s.storeServer, StoreServer::start(env_.masterAddr, env_.masterPort, store));
    }
    LOCKSTEP_ASSIGN_OR_RETURN(s.store, StoreClient::connect(env_.masterAddr, env_.masterPort, timeout, env_.storeSecret,
                                                            static_cast<int>(env_.rank)));
    s.store->setInterruptCheck([this] { return stopSignal_.load() != 0; });
    LOCKSTEP_TRY(s.store->registerRank());
    const std::string prefix = "lockstep/" + spec.jobId + "/" + std::to_string(env_.attempt) + "/";
    if (spec.backend == Backend::kCuda) {
      LOCKSTEP_ASSIGN_OR_RETURN(s.comm, connectNccl(s.store.get(), prefix, env_, timeout));
    } else {
      GlooOptions gloo;
      gloo.rank = static_cast<int>(env_.rank);
      gloo.worldSize = static_cast<int>(env_.worldSize);
      gloo.storePrefix = prefix + "gloo/";
      gloo.localHost = s.store->localAddress();
      gloo.timeout = timeout;
      LOCKSTEP_ASSIGN_OR_RETURN(s.comm, connectGloo(*s.store, gloo));
      // All ranks on this node: all-reduce through shared memory (shm_comm.h), unless asked not to.
      const char* allReduce = std::getenv("LOCKSTEP_ALLREDUCE");
      if (env_.localWorldSize == env_.worldSize && (allReduce == nullptr || std::string(allReduce) != "gloo")) {
        LOCKSTEP_ASSIGN_OR_RETURN(s.comm, connectSharedMemory(std::move(s.comm), *s.store, prefix + "shm/",
                                                              s.layout->totalFloats(), timeout));
      }
    }
    s.heartbeat = std::make_unique<Heartbeat>(*s.store, s.progress);
  } else if (spec.backend == Backend::kCuda) {
    // A world of one still reduces through NCCL, as a larger one would.
    LOCKSTEP_ASSIGN_OR_RETURN(s.comm, connectNccl(nullptr, "", env_, commTimeout()));
  }
  // The gradients live where the all-reduce reads them, if it can read them in place.
  s.grads = reducibleBuffer(s.comm.get(), s.layout->totalFloats(), s.ownGrads);
  LOCKSTEP_ASSIGN_OR_RETURN(s.metrics, MetricsSink::open(options_.metricsOut, env_.reportEndpoint));
  return {};
}

Result<void> RankRunner::restoreOrInit() {
  State& s = *state_;
  const JobSpec& spec = options_.spec;
  initParameters(*s.layout, spec.seed, s.params.data());

  // Rank 0 reads files; every rank then receives its result, so other nodes need no copy.
  struct Header {
    std::int64_t failed = 0;
    std::uint64_t firstStep = 0;
    std::int64_t optimizerSteps = 0;
  } header;
  Result<void> loaded;
  if (env_.rank == 0) {
    if (!spec.initWeightsPath.empty()) {
      loaded = loadWeights(spec.initWeightsPath, *s.layout, s.params.data());
      if (!loaded) loaded = loaded.error().withContext("--init-weights");
    }
    if (loaded && !spec.checkpointDir.empty()) {
      auto latest = latestCheckpoint(spec.checkpointDir);
      if (!latest) {
        loaded = latest.error();
      } else if (latest->has_value() && !options_.resume) {
        // Retention would delete this run's checkpoints in favour of the older, higher-numbered ones.
        loaded = invalidArgument("--checkpoint-dir " + spec.checkpointDir + " already holds checkpoints (newest: " +
                                 latest->value() + "); add --resume to continue from them, or use an empty directory");
      } else if (latest->has_value()) {
        auto step = loadCheckpoint(**latest, *s.layout, s.params.data(), *s.optimizer, s.resume);
        if (!step) {
          loaded = step.error();
        } else {
          header.firstStep = *step;
          std::fprintf(stderr, "[lockstep] resuming from %s (step %llu)\n", latest->value().c_str(),
                       static_cast<unsigned long long>(*step));
        }
      } else if (options_.resume) {
        std::fprintf(stderr, "[lockstep] no checkpoint in %s yet: starting from step 0\n", spec.checkpointDir.c_str());
      }
    }
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
  if (s.comm) {
    if (auto r = s.comm->broadcast(s.params.data(), s.params.size() * sizeof(float), 0); !r) {
      return diagnoseCommFailure(r.error(), "at start-up");
    }
    for (const auto& buffer : s.optimizer->stateBuffers()) {
      if (auto r = s.comm->broadcast(buffer.data->data(), buffer.data->size() * sizeof(float), 0); !r) {
        return diagnoseCommFailure(r.error(), "at start-up");
      }
    }
  }
  if (env_.rank == 0 && !spec.checkpointDir.empty()) {
    s.checkpoints = std::make_unique<CheckpointWriter>(
        spec.checkpointDir, *s.layout, spec.keepCheckpoints > 0 ? spec.keepCheckpoints : kDefaultKeepCheckpoints);
  }
  return {};
}

StepAccounting::StepAccounting(const TrainerOptions& options, const DistEnv& env, RankRunner::State& state,
                               RunSummary& summary)
    : options_(options), env_(env), state_(state), summary_(summary) {
  logging_ = env.rank == 0 && !options.quiet;
  logEvery_ = options.logEvery > 0 ? options.logEvery : std::max<std::uint64_t>(1, (state.totalSteps - state.firstStep) / 20);
  summary_.firstStep = state.firstStep;
  summary_.stepsDone = state.firstStep;
  summary_.totalSteps = state.totalSteps;
}

void StepAccounting::printStart(std::size_t buckets) const {
  if (!logging_) return;
  const JobSpec& spec = options_.spec;
  std::fprintf(stderr,
               "[lockstep] %u rank%s x batch %u x accum %u = global batch %llu | %llu parameters | %zu bucket%s | "
               "steps %llu..%llu\n",
               env_.worldSize, env_.worldSize == 1 ? "" : "s", spec.batchPerRank, spec.accumSteps,
               static_cast<unsigned long long>(spec.globalBatch()),
               static_cast<unsigned long long>(state_.layout->parameterCount()), buckets, buckets == 1 ? "" : "s",
               static_cast<unsigned long long>(state_.firstStep + 1), static_cast<unsigned long long>(state_.totalSteps));
}

Result<bool> StepAccounting::record(const StepReport& report, std::uint64_t globalSamples, double globalLoss,
                                    bool finalStep) {
  const JobSpec& spec = options_.spec;
  smoothedLoss_ = smoothedLoss_ ? (1 - kLossSmoothing) * *smoothedLoss_ + kLossSmoothing * globalLoss : globalLoss;
  LOCKSTEP_TRY(state_.metrics->write(report));
  state_.progress.completed(report.step);
  sumStepUs_ += report.stepTimeUs;
  // The trainer measures every part of its steps: the optional fields are always set here.
  sumExposedUs_ += report.exposedCommTimeUs.value_or(0);
  logSamples_ += globalSamples;
  ++logSteps_;
  logStepUs_ += report.stepTimeUs;
  logDataUs_ += report.dataTimeUs.value_or(0);
  logComputeUs_ += report.computeTimeUs.value_or(0);
  logExposedUs_ += report.exposedCommTimeUs.value_or(0);
  summary_.stepsDone = report.step;
  summary_.finalLoss = globalLoss;
  const bool reachedTarget = spec.targetLoss && *smoothedLoss_ <= *spec.targetLoss;
  if (logging_ && ((report.step - state_.firstStep) % logEvery_ == 0 || finalStep || reachedTarget)) {
    // Means over the steps since the last line.
    const double seconds = std::chrono::duration<double>(Clock::now() - logStart_).count();
    const double n = static_cast<double>(logSteps_) * 1e3;
    std::fprintf(stderr,
                 "[lockstep] step %llu/%llu | epoch %u | loss %.4f | %s samples/s | step %.1f ms: data %.1f, "
                 "compute %.1f, comm wait %.1f\n",
                 static_cast<unsigned long long>(report.step), static_cast<unsigned long long>(state_.totalSteps),
                 report.epoch, globalLoss, withThousands(static_cast<double>(logSamples_) / seconds).c_str(),
                 logStepUs_ / n, logDataUs_ / n, logComputeUs_ / n, logExposedUs_ / n);
    logStart_ = Clock::now();
    logSamples_ = logSteps_ = 0;
    logStepUs_ = logDataUs_ = logComputeUs_ = logExposedUs_ = 0;
  }
  if (reachedTarget) {
    summary_.reachedTargetLoss = true;
    if (logging_) {
      std::fprintf(stderr, "[lockstep] smoothed loss %.4f reached the target %.4f\n", *smoothedLoss_, *spec.targetLoss);
    }
  }
  return reachedTarget;
}

void StepAccounting::finish(Clock::time_point runStart, std::uint64_t samplesSeen) {
  summary_.seconds = std::chrono::duration<double>(Clock::now() - runStart).count();
  summary_.samplesPerSecond = summary_.seconds > 0 ? static_cast<double>(samplesSeen) / summary_.seconds : 0;
  summary_.exposedCommFraction =
      sumStepUs_ > 0 ? static_cast<double>(sumExposedUs_) / static_cast<double>(sumStepUs_) : 0;
}

Result<RunSummary> RankRunner::train() {
  if (options_.spec.backend == Backend::kCuda) return trainCuda();
  State& s = *state_;
  const JobSpec& spec = options_.spec;
  const double lr = effectiveLearningRate(spec);
  // The reducer's plan; re-read when it is re-planned between steps.
  std::vector<std::size_t> cuts = s.reducer ? s.reducer->cuts() : std::vector<std::size_t>{};
  std::vector<Bucket> buckets = s.reducer ? s.reducer->buckets() : std::vector<Bucket>{{0, s.layout->totalFloats()}};
  float* grads = s.grads;
  float* params = s.params.data();

  std::vector<std::uint32_t> indices;
  std::vector<float> batchX(std::size_t{s.maxRows} * s.data.dim);
  std::vector<std::int32_t> batchY(s.maxRows);
  std::vector<double> costs;  // this rank's forward + backward time per sample, each step since the last re-split

  RunSummary summary;
  StepAccounting accounting(options_, env_, s, summary);
  std::uint64_t samplesSeen = 0;
  Clock::duration lastComputeTime{};
  const auto runStart = Clock::now();
  accounting.printStart(buckets.size());
  Clock::time_point backwardStart, backwardEnd;  // the last micro-step's, which the reducer follows
  if (env_.rank == 0 && !options_.quiet && s.reducer && !s.reducer->yieldsCompute()) {
    std::fprintf(stderr,
                 "[lockstep] note: this process may not return from SCHED_IDLE (needs CAP_SYS_NICE or "
                 "`ulimit -e 20`), so communication competes with compute for CPU time\n");
  }
  for (std::uint64_t step = s.firstStep; step < s.totalSteps; ++step) {
    const auto stepStart = Clock::now();
    s.progress.enter(RankPhase::kCompute);
    Clock::duration dataTime{}, modelTime{};
    double localLossSum = 0.0;
    std::uint32_t localSamples = 0;
    if (s.reducer) s.reducer->beginStep();

    for (std::uint32_t micro = 0; micro < spec.accumSteps; ++micro) {
      const auto dataStart = Clock::now();
      s.sampler->indices(step, micro, env_.rank, indices);
      s.data.gather(indices, batchX.data(), batchY.data());
      dataTime += Clock::now() - dataStart;

      const auto n = static_cast<std::uint32_t>(indices.size());
      const auto modelStart = Clock::now();
      if (s.slowdown > 1.0) {
        // A test knob: stand in for slower hardware by idling (s.slowdown - 1) x the last compute time.
        std::this_thread::sleep_for(lastComputeTime * (s.slowdown - 1.0));
      }
      const auto computeStart = Clock::now();
      localLossSum += s.model->forward(params, batchX.data(), batchY.data(), n);
      localSamples += n;
      const bool last = micro + 1 == spec.accumSteps;
      if (last) {
        grads[kLossSum] = static_cast<float>(localLossSum);
        grads[kSampleCount] = static_cast<float>(localSamples);
        grads[kStopVotes] = stopSignal_.load() != 0 ? 1.0f : 0.0f;
      }
      if (last) backwardStart = Clock::now();
      s.model->backward(params, grads, micro > 0, cuts, [&](std::size_t end) {
        if (last && s.reducer) s.reducer->markReady(end);
      });
      if (last) backwardEnd = Clock::now();
      lastComputeTime = Clock::now() - computeStart;
      modelTime += Clock::now() - modelStart;
    }

    // Apply each bucket as soon as it is reduced; the first carries the header.
    Clock::duration exposed{}, optimizerTime{};
    const auto optimizerBegins = Clock::now();
    s.optimizer->beginStep(lr);
    optimizerTime += Clock::now() - optimizerBegins;
    float gradScale = 0.0f;
    if (s.reducer) s.progress.enter(RankPhase::kCommunicate);
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      if (s.reducer) {
        const auto waitStart = Clock::now();
        if (auto r = s.reducer->waitBucket(b); !r) {
          return diagnoseCommFailure(r.error(), "during step " + std::to_string(step + 1));
        }
        exposed += Clock::now() - waitStart;
      }
      if (b == 0) gradScale = 1.0f / grads[kSampleCount];
      const auto applyStart = Clock::now();
      s.optimizer->apply(params, grads, buckets[b].begin, buckets[b].end, gradScale);
      optimizerTime += Clock::now() - applyStart;
    }
    const auto stepEnd = Clock::now();

    const double globalLoss = static_cast<double>(grads[kLossSum]) / grads[kSampleCount];
    const bool stopVoted = grads[kStopVotes] > 0.0f;

    StepReport report = stepReport(step + 1, localSamples, localLossSum, globalLoss, lr);
    report.dataTimeUs = micros(dataTime);
    report.exposedCommTimeUs = micros(exposed);
    report.stepTimeUs = micros(stepEnd - stepStart);
    report.computeTimeUs = std::max<std::int64_t>(0, report.stepTimeUs - micros(dataTime) - micros(exposed));
    report.optimizerTimeUs = std::min(micros(optimizerTime), *report.computeTimeUs);
    report.allreduceTimeUs = s.reducer ? s.reducer->allreduceMicros() : 0;
    report.bytesReduced = s.reducer ? s.reducer->bytesReduced() : 0;
    samplesSeen += static_cast<std::uint64_t>(grads[kSampleCount]);

    if (s.planWatch) s.planWatch->noteStep(s.reducer->timings(), backwardStart, backwardEnd);

    const bool checkpointDue = spec.checkpointEvery > 0 && (step + 1) % spec.checkpointEvery == 0;
    if (s.checkpoints && (checkpointDue || (stopVoted && spec.checkpointEvery > 0))) {
      // The copy is quick; the file is written on the writer's thread while training goes on.
      s.progress.enter(RankPhase::kCheckpoint);
      const auto copyStart = Clock::now();
      LOCKSTEP_TRY(s.checkpoints->submit(snapshotCheckpoint(step + 1, s.resume, s.params, *s.optimizer)));
      notePhase("checkpoint", copyStart, step + 1);
    }
    LOCKSTEP_ASSIGN_OR_RETURN(const bool reachedTarget,
                              accounting.record(report, static_cast<std::uint64_t>(grads[kSampleCount]), globalLoss,
                                                step + 1 == s.totalSteps || stopVoted));
    // Forward and backward only: they grow with the rows, unlike the optimizer, which every rank
    // runs over all parameters.
    if (localSamples > 0) costs.push_back(static_cast<double>(micros(modelTime)) / localSamples);
    if (spec.rebalanceEvery > 0 && s.comm && (step + 1) % spec.rebalanceEvery == 0 && !stopVoted && !reachedTarget) {
      if (auto r = rebalance(std::move(costs), step + 1); !r) return diagnoseCommFailure(r.error(), "re-splitting the batch");
      costs.clear();
    }
    if (!stopVoted && !reachedTarget && s.planWatch) {
      if (auto r = replanIfDrifted(step + 1); !r) return diagnoseCommFailure(r.error(), "re-planning the buckets");
      cuts = s.reducer->cuts();
      buckets = s.reducer->buckets();
    }
    if (stopVoted) {
      summary.stoppedBySignal = stopSignal_.load() != 0 ? stopSignal_.load() : 15;
      break;
    }
    if (reachedTarget) break;
  }
  LOCKSTEP_TRY(finishRun(params, summary.stepsDone));
  accounting.finish(runStart, samplesSeen);
  s.heartbeat.reset();
  summary.droppedReports = s.metrics->close();
  return summary;
}

Result<void> RankRunner::rebalance(std::vector<double> costs, std::uint64_t step) {
  State& s = *state_;
  const JobSpec& spec = options_.spec;
  std::vector<float>& cost = s.rankCosts;
  cost.assign(env_.worldSize, 0.0f);  // same size each time: the buffer does not move
  // The median step: a step the scheduler or the page cache held up says nothing about speed.
  if (!costs.empty()) {
    std::nth_element(costs.begin(), costs.begin() + static_cast<std::ptrdiff_t>(costs.size() / 2), costs.end());
    cost[env_.rank] = static_cast<float>(costs[costs.size() / 2]);
  }
  s.progress.enter(RankPhase::kCommunicate);
  LOCKSTEP_TRY(s.comm->allReduceSum(cost.data(), cost.size()));
  const auto split = splitByCost(cost, spec.batchPerRank * env_.worldSize, s.maxRows, s.sampler->split());
  if (split == s.sampler->split()) return {};
  s.sampler->setSplit(split);
  if (env_.rank == 0 && !options_.quiet) {
    std::string rows, costText;
    for (std::size_t r = 0; r < split.size(); ++r) {
      rows += (r ? ", " : "") + std::to_string(split[r]);
      char text[32];
      std::snprintf(text, sizeof text, "%s%.1f", r ? ", " : "", cost[r]);
      costText += text;
    }
    std::fprintf(stderr, "[lockstep] after step %llu: rows per rank %s (measured us per sample: %s)\n",
                 static_cast<unsigned long long>(step), rows.c_str(), costText.c_str());
  }
  return {};
}

StepReport RankRunner::stepReport(std::uint64_t step, std::uint32_t localSamples, double localLossSum,
                                  double globalLoss, double lr) const {
  const JobSpec& spec = options_.spec;
  StepReport report;
  report.jobId = spec.jobId;
  report.rank = env_.rank;
  report.worldSize = env_.worldSize;
  report.attempt = env_.attempt;
  report.step = step;
  report.epoch = state_->sampler->epochOf(step - 1);
  report.samples = localSamples;
  report.loss = localSamples > 0 ? static_cast<float>(localLossSum / localSamples) : NAN;
  report.globalLoss = static_cast<float>(globalLoss);
  report.timeUnixUs = unixMicrosNow();
  report.lr = lr;
  return report;
}

void RankRunner::notePhase(const char* name, Clock::time_point began, std::uint64_t step) const {
  if (!state_->metrics) return;
  PhaseReport p;
  p.jobId = options_.spec.jobId;
  p.rank = env_.rank;
  p.worldSize = env_.worldSize;
  p.attempt = env_.attempt;
  p.name = name;
  p.timeUnixUs = unixMicrosNow();
  p.durationUs = micros(Clock::now() - began);
  p.step = step;
  state_->metrics->phase(p);
}

// After the last step: the last checkpoint, leaving together, the final weights.
Result<void> RankRunner::finishRun(const float* params, std::uint64_t stepsDone) {
  State& s = *state_;
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
    if (s.reducer) s.reducer->shutdown();
    s.progress.enter(RankPhase::kCommunicate);
    if (auto r = s.comm->barrier(); !r) return diagnoseCommFailure(r.error(), "at the end");
  }
  if (env_.rank == 0 && !options_.saveWeightsPath.empty()) {
    if (auto r = saveWeights(options_.saveWeightsPath, *s.layout, params); !r) return r.error().withContext("--save-weights");
  }
  return {};
}

Error RankRunner::diagnoseCommFailure(const Error& error, const std::string& when) {
  commBroken_ = true;
  State& s = *state_;
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
  const State& s = *state_;
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
