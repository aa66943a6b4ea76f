#pragma once
// What both loops (CpuLoop, CudaLoop) do with a finished step: build and write its report, count
// it for the summary, print the periodic log line (rank 0), and smooth the loss for --target-loss.

#include <cstdint>
#include <optional>

#include "dist_env.h"
#include "lockstep/common/result.h"
#include "lockstep/jobflags/options.h"
#include "lockstep/protocol/types.h"
#include "rank_state.h"
#include "run_summary.h"

namespace lockstep::trainer {

class StepAccounting {
 public:
  StepAccounting(const jobflags::TrainerOptions& options, const DistEnv& env, RankState& state);
  // The run's steps begin now, with `buckets` gradient buckets (rank 0 says so).
  void start(std::size_t buckets);
  // A report of 1-based `step` with who and when filled in; the loop adds the times.
  StepReport report(std::uint64_t step, std::uint32_t localSamples, double localLossSum, double globalLoss,
                    double lr) const;
  // `globalSamples` and `globalLoss` are the step's, over all ranks. Returns whether the smoothed
  // loss reached the target.
  Result<bool> record(const StepReport& report, std::uint64_t globalSamples, double globalLoss, bool finalStep);
  // The ranks voted to stop after the step just recorded; `signal` is this process's, or 0.
  void stopVoted(int signal) { summary_.stoppedBySignal = signal != 0 ? signal : 15; }
  // The run's figures once its steps are done (and the run finished: the time counts to now).
  void finish();
  const RunSummary& summary() const { return summary_; }

 private:
  void printStart(std::size_t buckets) const;
  void printProgress(const StepReport& report, double globalLoss);

  const jobflags::TrainerOptions& options_;
  const DistEnv& env_;
  RankState& state_;
  RunSummary summary_;
  bool logging_;
  std::uint64_t logEvery_;
  std::optional<double> smoothedLoss_;
  Clock::time_point runStart_ = Clock::now();
  std::uint64_t samplesSeen_ = 0;
  std::int64_t sumStepUs_ = 0, sumExposedUs_ = 0;
  Clock::time_point logStart_ = runStart_;
  std::uint64_t logSamples_ = 0, logSteps_ = 0;
  std::int64_t logStepUs_ = 0, logDataUs_ = 0, logComputeUs_ = 0, logExposedUs_ = 0;
};

}  // namespace lockstep::trainer
