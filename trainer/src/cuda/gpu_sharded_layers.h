#pragma once
// --shard gradients and --shard parameters (ZeRO stages 2 and 3) on GPUs: where the GPU model
// writes a layer's gradients and, at stage 3, reads its parameters (gpu_model.h's LayerSource),
// and the NCCL calls that move them, on the communication stream. The CPU backend's counterpart
// is sharded_layers.h; the design is the same, a layer at a time.
//
// Gradients: backward writes layer l into staging slot l % 2 (each as large as the widest layer);
// once the layer is written, its parts are summed onto their owners (one ncclReduce per owner,
// in place in the slot: the parts are uneven), the owner copies its part into the gradients it
// keeps (adds, after a step's first micro-step), and the slot is free again. So a rank holds its
// part of the gradients and two layers, not the whole.
//
// Parameters (stage 3): a rank keeps its part of the fp32 master weights. When forward or backward
// asks for layer l, it is gathered into one of two layer buffers (the owners' parts copied in,
// then one ncclBroadcast per owner), and the layer asked for next is gathered into the other one
// while l computes. A step's first ask gathers afresh: the optimizer changed the parts.
//
// The model asks on the host, as it enqueues its work, in the same order on every rank (an empty
// slice asks for the same layers), so the ranks' collectives match. Every ask makes the compute
// stream wait for what it needs with events; nothing here blocks the host.

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>

#include "gpu_model.h"
#include "model.h"
#include "nccl_comm.h"
#include "shard.h"

namespace lockstep::trainer::gpu {

class GpuShardedLayers final : public LayerSource {
 public:
  // Allocates the staging slots, this rank's part of the gradients and, at stage 3, the two layer
  // buffers (zeros: the model's warm-up computes on them before start()).
  static Result<std::unique_ptr<GpuShardedLayers>> create(NcclComm& nccl, const ParamLayout& layout,
                                                          const ShardPlan& plan, bool shardParameters);
  ~GpuShardedLayers() override;
  GpuShardedLayers(const GpuShardedLayers&) = delete;
  GpuShardedLayers& operator=(const GpuShardedLayers&) = delete;

  // From now on asks move data (before it, the model's warm-up's asks return buffers of zeros):
  // `compute` is the model's stream and `params` its master weights (stage 3: this rank's part,
  // from partBegin()).
  void start(cudaStream_t compute, const float* params);
  // Step `step` (1-based) begins: the layers gathered so far hold the weights before the last
  // optimizer.
  void newStep(std::uint64_t step);

  // LayerSource
  std::size_t partBegin() const override { return begin_; }
  std::size_t partEnd() const override { return end_; }
  bool shardsParameters() const override { return shardParameters_; }
  float* partGradients() override { return ownGrads_; }
  Result<const float*> parameters(std::size_t layer, std::optional<std::size_t> next) override;
  Result<float*> gradients(std::size_t layer) override;

  // On the communication stream, after `ready` (recorded on the compute stream once the model
  // wrote layer l): the layer's parts summed onto their owners, this rank's into its gradients,
  // written on a step's first micro-step and added on the others.
  Result<void> reduce(std::size_t layer, cudaEvent_t ready, bool firstMicroStep);

  // What a rank holds beyond the model's own buffers: the part of the gradients and the two slots;
  // the gathered layers.
  std::uint64_t gradBytes() const;
  std::uint64_t gatheredLayerBytes() const;
  // Gathers since newStep(), and the floats they moved.
  std::uint32_t gathers() const { return gathers_; }
  std::uint64_t gatheredFloats() const { return gatheredFloats_; }

 private:
  GpuShardedLayers(NcclComm& nccl, const ParamLayout& layout, const ShardPlan& plan, bool shardParameters);
  Result<void> allocate();
  // Stage 3: layer l gathered into buffer b, after the compute stream's uses so far.
  Result<void> gather(std::size_t layer, int b);
  int holding(std::size_t layer) const;  // the buffer that holds layer l, or -1

  NcclComm& nccl_;
  const ParamLayout& layout_;
  const ShardPlan& plan_;
  bool shardParameters_;
  std::size_t begin_, end_;   // this rank's part of the flat buffer
  std::size_t widest_;        // the floats of the largest layer: a slot's and a layer buffer's size
  bool started_ = false;
  cudaStream_t compute_ = nullptr;
  const float* params_ = nullptr;

  float* ownGrads_ = nullptr;              // [begin_, end_)
  std::array<float*, 2> slots_{};          // staged gradients, a layer each
  std::array<cudaEvent_t, 2> slotFree_{};  // on the communication stream: the slot's layer is reduced
  std::array<float*, 2> layers_{};         // stage 3: gathered layers
  std::array<std::optional<std::size_t>, 2> held_;
  std::array<cudaEvent_t, 2> gathered_{};  // on the communication stream: the buffer's layer is in
  cudaEvent_t used_ = nullptr;             // on the compute stream: its uses of the buffers so far
  std::uint32_t delayUs_ = 0;              // LOCKSTEP_TEST_COMM_DELAY: before each collective, this step
  std::uint32_t gathers_ = 0;
  std::uint64_t gatheredFloats_ = 0;
};

}  // namespace lockstep::trainer::gpu
