#pragma once
// The GPU training loop (--backend cuda): the same steps, reports and checkpoints as the CPU loop
// (cpu_loop.h), with the work enqueued on three streams and the host one step ahead of the GPU.
//
// Per step k (slot k % 2):
//   compute stream: wait for step k-1's optimizer, wait for batch k, header, forward, loss, backward;
//                   after each layer's gradients, an event;
//   comm stream:    per layer event, the buckets it completed: one NCCL group, then the optimizer on
//                   them; at the end the reduced header (loss sum, samples, stop votes) to the host;
//   data stream:    batch k+1 gathered while step k computes.
// The host never waits inside a step: it reads step k-1's header and event times while step k
// runs, so decisions taken from them (stop votes, the target loss) take effect one step later,
// on every rank alike.
//
// With --sync parameter-server the steps go one at a time instead (cuda_server_steps.cpp): the
// gradient to the host and to the server, the weights it sends back to the GPU.
//
// Only files in cuda/ include this header: the rest of the trainer reaches the loop through
// RankLoop (makeCudaLoop).

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpu_model.h"
#include "gpu_sharded_layers.h"
#include "nccl_comm.h"
#include "ps_worker.h"
#include "rank_loop.h"
#include "rank_state.h"
#include "step_accounting.h"
#include "step_slots.h"

namespace lockstep::trainer::gpu {

class CudaLoop final : public RankLoop {
 public:
  explicit CudaLoop(RankHost& host);
  ~CudaLoop() override;
  CudaLoop(const CudaLoop&) = delete;
  CudaLoop& operator=(const CudaLoop&) = delete;

  bool pinsCpus() const override { return false; }
  Result<void> setUp() override { return {}; }
  // NCCL on this rank's GPU, even for a world of one (it reduces as a larger one would); Gloo
  // between the hosts when a parameter server does the reducing (ps_worker.h).
  Result<std::unique_ptr<Comm>> connect(StoreClient* store, const std::string& keyPrefix) override;
  Result<void> train(StepAccounting& accounting) override;

 private:
  // --shard gradients|parameters (ZeRO 2, 3): backward stages a layer at a time (gpu_sharded_layers.h).
  bool stagesGradients() const;
  // Whether the ranks train with a parameter server: a world of more than one with --sync
  // parameter-server (alone, a rank trains as all-reduce would).
  bool withServer() const;
  // The model on the device, with the rank's parameters, and its optimizer state unless a server
  // keeps that.
  Result<void> start(bool keepsOptimizer);
  // --bucket-mb's, or chosen from this job's measurements (bucket_plan.h, gpu_plan.h).
  Result<void> chooseBuckets();
  Result<void> runSteps(StepAccounting& accounting);
  // Gathers step `step`'s micro-batches into its slot once the step two back is done with it;
  // returns their row counts.
  Result<std::vector<std::uint32_t>> prepare(std::uint64_t step, cudaEvent_t slotFree);
  // Enqueues 0-based `step` in `slot`, after the step that ends with `previousEnd`.
  Result<void> enqueueStep(std::uint64_t step, StepSlot& slot, cudaEvent_t previousEnd);
  // After a layer's gradients (grads[0, end) final once `ready` fires): the buckets it completed,
  // reduced and applied on the communication stream.
  void launchReady(StepSlot& slot, std::size_t& launched, std::size_t end, cudaEvent_t ready, Result<void>& commError);
  // --shard optimizer (ZeRO 1): a bucket's gradients summed onto their owners (its header part,
  // owned by nobody, all-reduced), then the optimizer on this rank's part of it.
  Result<void> reduceShardedBucket(const Bucket& bucket);
  // Sharded: the optimizer's current step on this rank's part of params[begin, end), on the
  // communication stream (after that range's reduce there).
  void applyOptimizerToOwnPart(std::size_t begin, std::size_t end);
  // --shard gradients|parameters: micro-step `micro`'s layer ending at `end`, staged, reduced onto
  // its owners; on the last micro-step the header first (at the first layer) and the optimizer after.
  Result<void> reduceStagedLayer(StepSlot& slot, std::uint32_t micro, std::size_t end, cudaEvent_t ready);
  // The parameters from the device into s_.params; at stage 3 every rank's part, gathered.
  Result<void> downloadParameters();
  // After every bucket's optimizer: each rank's part of the parameters, to every rank.
  Result<void> gatherParameters(StepSlot& slot);
  // What the step's report says the rank holds, and, sharded, its collectives by kind.
  void addMemoryAndKinds(const StepSlot& slot, StepReport& report) const;
  // Reads a finished step's header and times, and reports it. Returns whether to stop after the
  // step now in flight.
  Result<bool> report(StepSlot& slot, cudaEvent_t previousEnd, bool lastStep, StepAccounting& accounting);
  Result<void> checkpointIfDue(std::uint64_t step, StepSlot& slot);
  // The checkpoint when a signal stopped the run between due checkpoints.
  Result<void> checkpointAtSignal(const RunSummary& summary);
  // Sharded with --checkpoint-dir: every rank takes part in a checkpoint (gathering the optimizer state).
  bool gathersForCheckpoints() const;
  // Rank 0, which writes them, and every rank that gathers for them.
  bool takesPartInCheckpoints() const;
  // The checkpoint of 1-based `step` from the device's state, once the GPU is done with the step
  // (on a rank that takes part in checkpoints); rank 0 writes it.
  Result<void> checkpoint(std::uint64_t step);
  // --sync parameter-server: each step computed on the weights the server sent last.
  Result<void> trainWithServer(StepAccounting& accounting);
  // One step on the data of 0-based `dataStep`: returns whether the run is over.
  Result<bool> serverStep(std::uint64_t dataStep, double lr, StepAccounting& accounting);

  // A failed collective during 1-based `step`: aborts NCCL and names the lost peer where it can.
  Error fail(const Error& error, std::uint64_t step);

  RankHost& host_;
  const jobflags::TrainerOptions& options_;
  const DistEnv& env_;
  RankState& s_;

  NcclComm* nccl_ = nullptr;  // the rank's communicator (RankState::comm)
  int device_ = 0;
  std::unique_ptr<GpuShardedLayers> sharded_;  // --shard gradients|parameters; outlives the model
  std::unique_ptr<GpuModel> model_;
  std::vector<std::vector<float>*> optimizerState_;
  StepSlots slots_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t comm_ = nullptr;
  float* grads_ = nullptr;  // the model's, on the device
  double lr_ = 0;
  std::vector<Bucket> buckets_;
  std::uint64_t bytesPerStep_ = 0;
  std::vector<std::uint32_t> indices_;

  // With a parameter server.
  std::string keyPrefix_;  // the job's keys in the store
  std::unique_ptr<PsWorker> psWorker_;
  std::vector<float> hostGrads_;  // the step's gradient, pushed from the host
  double slowdown_ = 1.0;         // LOCKSTEP_TEST_SLOWDOWN: this rank computes this many times slower
  bool voteToStop_ = false;       // the target loss was reached: the next push says so
};

}  // namespace lockstep::trainer::gpu
