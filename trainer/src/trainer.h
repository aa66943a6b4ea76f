#pragma once
// One rank of a data-parallel job, from rendezvous to the last step: RankRunner does what every
// backend shares (the rendezvous and the communicator, the initial state, heartbeats, finishing
// the run, naming a lost peer) and hands the steps to the backend's loop (rank_loop.h).

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist_env.h"
#include "lockstep/common/result.h"
#include "lockstep/common/store.h"
#include "lockstep/jobflags/options.h"
#include "rank_host.h"
#include "rank_loop.h"
#include "run_summary.h"

namespace lockstep::trainer {

class RankState;  // rank_state.h

class RankRunner final : private RankHost {
 public:
  // stopSignal is set (to the signal number) by the process's signal handler.
  RankRunner(jobflags::TrainerOptions options, DistEnv env, const std::atomic<int>& stopSignal);
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

 private:
  Result<void> setUp();
  void placeThreads() const;
  Result<void> connect();
  Result<void> rendezvous();
  Result<void> restoreOrInit();
  Result<void> shareInitialState();
  Result<void> finishRun(std::uint64_t stepsDone);
  std::string describeStragglers(const std::vector<RankLiveness>& status) const;

  // RankHost, for the loop.
  const jobflags::TrainerOptions& options() const override { return options_; }
  const DistEnv& env() const override { return env_; }
  RankState& state() override { return *state_; }
  int stopSignal() const override { return stopSignal_.load(); }
  void note(const std::string& text) const override;
  void notePhase(const char* name, Clock::time_point began, std::uint64_t step) const override;
  Error diagnoseCommFailure(const Error& error, const std::string& when) override;
  void markCommBroken() override { commBroken_ = true; }

  jobflags::TrainerOptions options_;
  DistEnv env_;
  const std::atomic<int>& stopSignal_;
  std::unique_ptr<RankState> state_;
  std::unique_ptr<RankLoop> loop_;  // after state_: it holds on to the state and goes first
  bool commBroken_ = false;
};

}  // namespace lockstep::trainer
