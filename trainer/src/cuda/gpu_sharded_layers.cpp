#include "gpu_sharded_layers.h"

#include <algorithm>

#include "cuda_check.h"
#include "dist_env.h"
#include "kernels.cuh"

namespace lockstep::trainer::gpu {

namespace {

Result<float*> zeroed(std::size_t floats) {
  void* p = nullptr;
  LOCKSTEP_CUDA(cudaMalloc(&p, std::max<std::size_t>(1, floats) * sizeof(float)));
  LOCKSTEP_CUDA(cudaMemset(p, 0, std::max<std::size_t>(1, floats) * sizeof(float)));
  return static_cast<float*>(p);
}

}  // namespace

GpuShardedLayers::GpuShardedLayers(NcclComm& nccl, const ParamLayout& layout, const ShardPlan& plan,
                                   bool shardParameters)
    : nccl_(nccl),
      layout_(layout),
      plan_(plan),
      shardParameters_(shardParameters),
      begin_(plan.begin(nccl.rank())),
      end_(plan.end(nccl.rank())),
      widest_(layout.widestLayerFloats()) {}

Result<std::unique_ptr<GpuShardedLayers>> GpuShardedLayers::create(NcclComm& nccl, const ParamLayout& layout,
                                                                   const ShardPlan& plan, bool shardParameters) {
  std::unique_ptr<GpuShardedLayers> layers(new GpuShardedLayers(nccl, layout, plan, shardParameters));
  LOCKSTEP_TRY(layers->allocate());
  return layers;
}

Result<void> GpuShardedLayers::allocate() {
  LOCKSTEP_ASSIGN_OR_RETURN(ownGrads_, zeroed(end_ - begin_));
  for (int b = 0; b < 2; ++b) {
    LOCKSTEP_ASSIGN_OR_RETURN(slots_[b], zeroed(widest_));
    LOCKSTEP_CUDA(cudaEventCreateWithFlags(&slotFree_[b], cudaEventDisableTiming));
    if (shardParameters_) {
      LOCKSTEP_ASSIGN_OR_RETURN(layers_[b], zeroed(widest_));
      LOCKSTEP_CUDA(cudaEventCreateWithFlags(&gathered_[b], cudaEventDisableTiming));
    }
  }
  LOCKSTEP_CUDA(cudaEventCreateWithFlags(&used_, cudaEventDisableTiming));
  return {};
}

GpuShardedLayers::~GpuShardedLayers() {
  cudaStreamSynchronize(nccl_.stream());
  for (float* p : {ownGrads_, slots_[0], slots_[1], layers_[0], layers_[1]}) {
    if (p) cudaFree(p);
  }
  for (cudaEvent_t e : {slotFree_[0], slotFree_[1], gathered_[0], gathered_[1], used_}) {
    if (e) cudaEventDestroy(e);
  }
}

void GpuShardedLayers::start(cudaStream_t compute, const float* params) {
  compute_ = compute;
  params_ = params;
  started_ = true;
}

void GpuShardedLayers::newStep(std::uint64_t step) {
  delayUs_ = static_cast<std::uint32_t>(testCommDelay(nccl_.rank(), step).count());
  held_ = {};
  gathers_ = 0;
  gatheredFloats_ = 0;
}

int GpuShardedLayers::holding(std::size_t layer) const {
  for (int b = 0; b < 2; ++b) {
    if (held_[b] == layer) return b;
  }
  return -1;
}

Result<float*> GpuShardedLayers::gradients(std::size_t layer) {
  const std::size_t s = layer % 2;
  if (started_) {
    LOCKSTEP_CUDA(cudaStreamWaitEvent(compute_, slotFree_[s]));
    // Backward writes the tensors alone: the padding between them, which held another layer's
    // tensors, is summed too and must be zeros.
    LOCKSTEP_CUDA(cudaMemsetAsync(slots_[s], 0, layout_.layerFloats(layer) * sizeof(float), compute_));
  }
  return slots_[s];
}

Result<void> GpuShardedLayers::reduce(std::size_t layer, cudaEvent_t ready, bool firstMicroStep) {
  const cudaStream_t comm = nccl_.stream();
  const std::size_t s = layer % 2;
  const std::size_t lb = layout_.layerBegin(layer), le = layout_.layerEnd(layer);
  LOCKSTEP_CUDA(cudaStreamWaitEvent(comm, ready));
  launchSpin(delayUs_, comm);
  LOCKSTEP_TRY(nccl_.reduceToOwnersAsync({slots_[s], plan_.partsOf(lb, le)}));
  const std::size_t a = std::max(lb, begin_), b = std::min(le, end_);
  if (a < b) {
    const float* sum = slots_[s] + (a - lb);
    float* mine = ownGrads_ + (a - begin_);
    if (firstMicroStep) {
      LOCKSTEP_CUDA(cudaMemcpyAsync(mine, sum, (b - a) * sizeof(float), cudaMemcpyDeviceToDevice, comm));
    } else {
      launchAddInto<float>(sum, mine, b - a, /*accumulate=*/true, comm);
    }
  }
  LOCKSTEP_CUDA(cudaEventRecord(slotFree_[s], comm));
  return {};
}

Result<const float*> GpuShardedLayers::parameters(std::size_t layer, std::optional<std::size_t> next) {
  if (!shardParameters_) return nullptr;
  if (!started_) return static_cast<const float*>(layers_[0]);
  // Whatever the compute stream enqueued so far is what uses the buffers now.
  LOCKSTEP_CUDA(cudaEventRecord(used_, compute_));
  int b = holding(layer);
  if (b < 0) {
    // An empty buffer, else the one that does not hold the layer asked for next.
    b = held_[0] && (!held_[1] || held_[0] == next) ? 1 : 0;
    LOCKSTEP_TRY(gather(layer, b));
  }
  LOCKSTEP_CUDA(cudaStreamWaitEvent(compute_, gathered_[b]));
  if (next && *next != layer && holding(*next) < 0) LOCKSTEP_TRY(gather(*next, 1 - b));
  return static_cast<const float*>(layers_[b]);
}

Result<void> GpuShardedLayers::gather(std::size_t layer, int b) {
  const cudaStream_t comm = nccl_.stream();
  const std::size_t lb = layout_.layerBegin(layer), le = layout_.layerEnd(layer);
  LOCKSTEP_CUDA(cudaStreamWaitEvent(comm, used_));
  launchSpin(delayUs_, comm);
  const std::size_t a = std::max(lb, begin_), e = std::min(le, end_);
  if (a < e) {
    LOCKSTEP_CUDA(cudaMemcpyAsync(layers_[b] + (a - lb), params_ + (a - begin_), (e - a) * sizeof(float),
                                  cudaMemcpyDeviceToDevice, comm));
  }
  LOCKSTEP_TRY(nccl_.broadcastFromOwnersAsync({layers_[b], plan_.partsOf(lb, le)}));
  LOCKSTEP_CUDA(cudaEventRecord(gathered_[b], comm));
  held_[b] = layer;
  ++gathers_;
  gatheredFloats_ += le - lb;
  return {};
}

std::uint64_t GpuShardedLayers::gradBytes() const { return (end_ - begin_ + 2 * widest_) * sizeof(float); }

std::uint64_t GpuShardedLayers::gatheredLayerBytes() const {
  return shardParameters_ ? 2 * widest_ * sizeof(float) : 0;
}

}  // namespace lockstep::trainer::gpu
