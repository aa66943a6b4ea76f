#pragma once
// What a running rank holds whichever loop trains it (RankLoop: CpuLoop, CudaLoop), as RankRunner
// builds it in setUp/connect/restoreOrInit, in the order it is built (and the reverse of teardown).
// What only one backend needs (the CPU model and its reducer, the GPU model) is that loop's own.
// Private to the trainer.

#include <cstdint>
#include <memory>
#include <vector>

#include "checkpoint.h"
#include "comm.h"
#include "dataset.h"
#include "heartbeat.h"
#include "lockstep/common/store.h"
#include "metrics.h"
#include "model.h"
#include "optimizer.h"
#include "rank_progress.h"
#include "sampler.h"
#include "shard.h"

namespace lockstep::trainer {

class RankState {
 public:
  Dataset data;
  std::unique_ptr<ParamLayout> layout;
  std::vector<float> params;
  std::unique_ptr<Optimizer> optimizer;  // sharded (--shard): this rank's part only
  std::unique_ptr<ShardPlan> shards;      // --shard with a communicator (CPU: more than one rank; GPU: NCCL, even alone); else null
  std::unique_ptr<GlobalBatchSampler> sampler;
  std::unique_ptr<MetricsSink> metrics;
  std::unique_ptr<StoreServer> storeServer;
  std::unique_ptr<StoreClient> store;
  std::unique_ptr<Comm> comm;  // null for a CPU world of one
  Progress progress;
  std::unique_ptr<Heartbeat> heartbeat;
  std::unique_ptr<CheckpointWriter> checkpoints;  // rank 0, with --checkpoint-dir
  ResumeSettings resume;
  std::uint64_t firstStep = 0;
  std::uint64_t totalSteps = 0;
};

}  // namespace lockstep::trainer
