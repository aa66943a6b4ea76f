#pragma once
// The rank a training loop runs in (RankRunner, trainer.h), as the loops (rank_loop.h) see it:
// the job's settings, the state both backends share, and what both ask of the rank.

#include <chrono>
#include <cstdint>
#include <string>

#include "comm.h"
#include "dist_env.h"
#include "lockstep/common/result.h"
#include "lockstep/common/store.h"
#include "lockstep/jobflags/options.h"
#include "rank_progress.h"

namespace lockstep::trainer {

class RankState;  // rank_state.h

class RankHost {
 public:
  virtual const jobflags::TrainerOptions& options() const = 0;
  virtual const DistEnv& env() const = 0;
  virtual RankState& state() = 0;
  // The signal that asked this process to stop (the handler sets it), or 0.
  virtual int stopSignal() const = 0;
  // Rank 0 tells the job's events (through its agent) and its log what it decided.
  virtual void note(const std::string& text) const = 0;
  // A phase that began then and ends now, for the timeline (lockstep.proto's PhaseReport).
  virtual void notePhase(const char* name, Clock::time_point began, std::uint64_t step) const = 0;
  // A collective failed `when` ("during step 4"): the error, naming the peer the store says is
  // lost or not in it. Needs the store (a world of more than one). Marks the communicator broken.
  virtual Error diagnoseCommFailure(const Error& error, const std::string& when) = 0;
  // Marks the communicator broken where no store can name a peer.
  virtual void markCommBroken() = 0;

 protected:
  ~RankHost() = default;
};

// Every collective's bound: --timeout-s.
inline std::chrono::milliseconds commTimeout(const JobSpec& spec) {
  return std::chrono::milliseconds(std::int64_t{spec.timeoutS} * 1000);
}

// A Gloo mesh of `worldSize` members, this one `rank`, met through the job's store under `prefix`
// (the ranks' collectives, the workers and their parameter server), bounded by --timeout-s.
inline GlooOptions glooMesh(const JobSpec& spec, StoreClient& store, std::string prefix, int rank, int worldSize) {
  GlooOptions gloo;
  gloo.rank = rank;
  gloo.worldSize = worldSize;
  gloo.storePrefix = std::move(prefix);
  gloo.localHost = store.localAddress();
  gloo.timeout = commTimeout(spec);
  return gloo;
}

}  // namespace lockstep::trainer
