#pragma once
// One rank of a data-parallel job, from rendezvous to the last step.

#include <atomic>
#include <chrono>
#include <vector>
#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/common/result.h"
#include "lockstep/common/store.h"
#include "lockstep/jobflags/options.h"
#include "lockstep/protocol/types.h"
#include "bucket_plan.h"
#include "comm.h"
#include "model.h"

namespace lockstep::trainer {

// The rank's place in the job, from torchrun's environment variables.
struct DistEnv {
  std::uint32_t rank = 0;
  std::uint32_t worldSize = 1;
  std::uint32_t localRank = 0;
  std::uint32_t localWorldSize = 1;
  std::string masterAddr = "127.0.0.1";
  std::uint16_t masterPort = 0;
  // LOCKSTEP_AGENT_STORE=1: the launcher (or agent) hosts the store, not rank 0.
  bool storeHostedByLauncher = false;
  std::string storeSecret;     // LOCKSTEP_STORE_SECRET: the job's, for the rendezvous store; "" open
  std::string reportEndpoint;  // LOCKSTEP_REPORT
  std::uint32_t attempt = 0;   // LOCKSTEP_ATTEMPT: restarts of the job so far
};

// Reads RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT (all absent: a world of
// one) and the LOCKSTEP_* variables. Malformed or inconsistent values are InvalidArgument.
Result<DistEnv> distEnvFromEnvironment();

struct RunSummary {
  std::uint64_t firstStep = 0;  // 0, or the checkpoint's step when resumed
  std::uint64_t stepsDone = 0;  // the last completed step
  std::uint64_t totalSteps = 0;
  double finalLoss = 0;
  double seconds = 0;
  double samplesPerSecond = 0;
  double exposedCommFraction = 0;  // exposed all-reduce time / step time, this rank
  bool reachedTargetLoss = false;
  int stoppedBySignal = 0;  // the signal that stopped the run, or 0
  std::uint64_t droppedReports = 0;
};

// Whether this build has the CUDA backend (--backend cuda).
bool cudaBackendBuilt();

class RankRunner {
 public:
  // stopSignal is set (to the signal number) by the process's signal handler.
  RankRunner(TrainerOptions options, DistEnv env, const std::atomic<int>& stopSignal);
  ~RankRunner();
  RankRunner(const RankRunner&) = delete;
  RankRunner& operator=(const RankRunner&) = delete;

  Result<RunSummary> run();

  // True after a collective failed. The communication thread may then be blocked inside Gloo until
  // its timeout, so a caller about to exit should skip destroying the runner.
  bool commBroken() const { return commBroken_; }

  // When this rank hosts the rendezvous store, serves it until the other ranks have disconnected
  // (or the timeout passes), so that they can still ask it which peer they lost.
  void waitForPeersToLeave(std::chrono::milliseconds timeout) const;

  class State;

 private:
  Result<void> setUp();
  Result<void> connect();
  Result<void> restoreOrInit();
  // Gradient buckets: --bucket-mb's, or chosen by measurement (bucket_plan.h) and re-chosen when
  // the measurements drift.
  std::vector<Bucket> fixedBuckets() const;
  Result<void> setUpCpuBuckets();
  Result<std::pair<BucketPlan, PlanFigures>> agreeAndChoose(Comm& comm, const PlanFigures& mine,
                                                            std::chrono::steady_clock::time_point since);
  Result<void> replanIfDrifted(std::uint64_t step);
  void reduceIn(std::vector<Bucket> buckets);
  std::chrono::milliseconds commTimeout() const;
  void note(const std::string& text) const;
  // A phase that began then and ends now, for the timeline (lockstep.proto's PhaseReport).
  void notePhase(const char* name, std::chrono::steady_clock::time_point began, std::uint64_t step) const;
  Result<RunSummary> train();
  Result<RunSummary> trainCuda();  // cuda/gpu_train.cpp; without CUDA, an error that says so
  StepReport stepReport(std::uint64_t step, std::uint32_t localSamples, double localLossSum, double globalLoss,
                        double lr) const;
  Result<void> finishRun(const float* params, std::uint64_t stepsDone);
  // --balance dynamic: shares each rank's time per sample (per step since the last re-split) and
  // re-splits.
  Result<void> rebalance(std::vector<double> costs, std::uint64_t step);
  Error diagnoseCommFailure(const Error& error, const std::string& when);
  std::string describeStragglers(const std::vector<RankLiveness>& status) const;

  TrainerOptions options_;
  DistEnv env_;
  const std::atomic<int>& stopSignal_;
  std::unique_ptr<State> state_;
  bool commBroken_ = false;
};

}  // namespace lockstep::trainer
