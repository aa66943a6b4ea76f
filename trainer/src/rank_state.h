#pragma once
// A rank's state while it runs, shared by the CPU loop (trainer.cpp) and the GPU loop
// (cuda/gpu_train.cpp): what RankRunner builds in setUp/connect/restoreOrInit, and what both
// loops do with a finished step (StepAccounting). Private to the trainer.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "bucket_measure.h"
#include "checkpoint.h"
#include "comm.h"
#include "dataset.h"
#include "lockstep/common/progress.h"
#include "lockstep/common/store.h"
#include "metrics.h"
#include "model.h"
#include "optimizer.h"
#include "reducer.h"
#include "sampler.h"
#include "trainer.h"

namespace lockstep::trainer {

using Clock = std::chrono::steady_clock;
inline constexpr auto kHeartbeatInterval = std::chrono::seconds(1);

// What the main thread is doing, for heartbeats: written by the main thread, read by the
// heartbeat thread. Under an agent it goes to the rank's progress record too (LOCKSTEP_PROGRESS),
// which the agent reads to see a stall; the reducer marks its collectives there.
class Progress {
 public:
  void enter(RankPhase phase) {
    phase_.store(phase);
    since_.store(Clock::now().time_since_epoch().count());
    record_.phase(recordPhase(phase), phase == RankPhase::kCheckpoint);
  }
  void completed(std::uint64_t step) {
    step_.store(static_cast<std::int64_t>(step));
    record_.stepDone(static_cast<std::int64_t>(step));
  }
  progress::Writer& record() { return record_; }
  std::int64_t step() const { return step_.load(); }
  RankPhase phase() const { return phase_.load(); }
  std::int64_t millisInPhase() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch() - Clock::duration(since_.load()))
        .count();
  }

 private:
  std::atomic<std::int64_t> step_{0};
  std::atomic<RankPhase> phase_{RankPhase::kStartup};
  std::atomic<Clock::rep> since_{Clock::now().time_since_epoch().count()};
  progress::Writer record_ = progress::Writer::fromEnvironment();

  static std::string_view recordPhase(RankPhase phase) {
    switch (phase) {
      case RankPhase::kStartup: return "start-up";
      case RankPhase::kCompute: return "compute";
      case RankPhase::kCommunicate: return "all-reduce";
      case RankPhase::kCheckpoint: return "checkpoint";
    }
    return "";
  }
};

// Sends the main thread's progress to the store every second, so that a rank whose collective
// times out can tell which peer is not in it (computing, writing a checkpoint, or frozen).
class Heartbeat {
 public:
  Heartbeat(StoreClient& store, const Progress& progress) : store_(store), progress_(progress) {
    thread_ = std::thread([this] { run(); });
  }
  ~Heartbeat() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, kHeartbeatInterval, [this] { return stop_; })) {
      lock.unlock();
      // A failed heartbeat is not fatal: the collectives detect lost peers, this only explains them.
      (void)store_.heartbeat(progress_.step(), progress_.phase(), progress_.millisInPhase());
      lock.lock();
    }
  }

  StoreClient& store_;
  const Progress& progress_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// Everything a running rank holds, in the order it is built (and the reverse of teardown).
class RankRunner::State {
 public:
  Dataset data;
  std::unique_ptr<ParamLayout> layout;
  std::vector<float> params;
  float* grads = nullptr;  // the communicator's in-place buffer (reducibleBuffer), or ownGrads
  std::vector<float> ownGrads;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<GlobalBatchSampler> sampler;
  std::unique_ptr<Mlp> model;
  std::unique_ptr<MetricsSink> metrics;
  std::unique_ptr<StoreServer> storeServer;
  std::unique_ptr<StoreClient> store;
  std::unique_ptr<Comm> comm;
  std::unique_ptr<GradientReducer> reducer;
  std::unique_ptr<PlanWatch> planWatch;  // buckets chosen by measurement (no --bucket-mb)
  Progress progress;
  std::unique_ptr<Heartbeat> heartbeat;
  std::unique_ptr<CheckpointWriter> checkpoints;  // rank 0, with --checkpoint-dir
  ResumeSettings resume;
  std::uint32_t maxRows = 0;    // the most rows of a micro-step this rank may get (the split's cap)
  double slowdown = 1.0;        // LOCKSTEP_TEST_SLOWDOWN: this rank computes this many times slower
  // The ranks' times per sample for a re-split. One buffer for the run: Gloo keeps an algorithm per
  // buffer address, and every rank must reduce the same buffers in the same order.
  std::vector<float> rankCosts;
  std::uint64_t firstStep = 0;
  std::uint64_t totalSteps = 0;
};


// What both loops do with a finished step: write its report, count it for the summary, print the
// periodic log line (rank 0), and smooth the loss for --target-loss.
class StepAccounting {
 public:
  StepAccounting(const TrainerOptions& options, const DistEnv& env, RankRunner::State& state, RunSummary& summary);
  void printStart(std::size_t buckets) const;
  // `globalSamples` and `globalLoss` are the step's, over all ranks. Returns whether the smoothed
  // loss reached the target.
  Result<bool> record(const StepReport& report, std::uint64_t globalSamples, double globalLoss, bool finalStep);
  double smoothedLoss() const { return smoothedLoss_.value_or(0); }
  void finish(Clock::time_point runStart, std::uint64_t samplesSeen);

 private:
  const TrainerOptions& options_;
  const DistEnv& env_;
  RankRunner::State& state_;
  RunSummary& summary_;
  bool logging_;
  std::uint64_t logEvery_;
  std::optional<double> smoothedLoss_;
  std::int64_t sumStepUs_ = 0, sumExposedUs_ = 0;
  Clock::time_point logStart_ = Clock::now();
  std::uint64_t logSamples_ = 0, logSteps_ = 0;
  std::int64_t logStepUs_ = 0, logDataUs_ = 0, logComputeUs_ = 0, logExposedUs_ = 0;
};

}  // namespace lockstep::trainer
