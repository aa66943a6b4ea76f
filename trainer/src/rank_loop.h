#pragma once
// A rank's training loop, one per backend behind one interface: CpuLoop (cpu_loop.h: BLAS and
// Gloo, buckets re-planned on drift, dynamic rebalancing) and CudaLoop (cuda/cuda_loop.h: cuBLASLt
// and NCCL), chosen at run time by --backend. RankRunner (trainer.h) does what both share around
// it: the rendezvous, the initial state, heartbeats, finishing the run, naming a lost peer.

#include <memory>
#include <string>

#include "comm.h"
#include "lockstep/common/result.h"
#include "lockstep/common/store.h"
#include "lockstep/protocol/types.h"
#include "rank_host.h"

namespace lockstep::trainer {

class StepAccounting;  // step_accounting.h

class RankLoop {
 public:
  virtual ~RankLoop() = default;
  // Whether each local rank computes on its own share of the CPUs (cpu_share.h).
  virtual bool pinsCpus() const = 0;
  // What the loop builds from the data set and the layout, before the rendezvous.
  virtual Result<void> setUp() = 0;
  // This backend's communicator among the job's ranks, through the store under `keyPrefix`; for
  // a world of one, store is null and the result may be null (nothing to reduce with).
  virtual Result<std::unique_ptr<Comm>> connect(StoreClient* store, const std::string& keyPrefix) = 0;
  // The steps from the state's firstStep on, each handed to `accounting`. Leaves the final
  // parameters and optimizer state in the rank's state, and no collective of its own in flight.
  virtual Result<void> train(StepAccounting& accounting) = 0;
};

// The loop for `backend`, over `host`, which outlives it.
Result<std::unique_ptr<RankLoop>> makeRankLoop(Backend backend, RankHost& host);

// The CUDA loop (cuda/cuda_loop.cpp); in a build without CUDA, an error that says so (no_cuda.cpp).
Result<std::unique_ptr<RankLoop>> makeCudaLoop(RankHost& host);

// Whether this build has the CUDA backend (--backend cuda).
bool cudaBackendBuilt();

}  // namespace lockstep::trainer
