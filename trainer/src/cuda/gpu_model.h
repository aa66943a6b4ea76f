#pragma once
// The MLP on one GPU: the data set, the batches, forward and backward through cuBLASLt, and the
// optimizer, all enqueued on streams so that the host never waits inside a step.
//
// Buffers use the CPU backend's flat layout (model.h): fp32 master parameters, gradients and
// optimizer state in [header | last layer .. first layer], so that buckets, checkpoints and the
// header (loss sum, sample count, stop votes) mean the same on both backends. In bf16 the GEMMs
// read a bf16 copy of the parameters that the optimizer refreshes as it updates them.
//
// Streams: `data` gathers the next batch while `compute` runs the current step; the caller's
// communication stream all-reduces buckets and applies the optimizer (applyOptimizer). The caller
// makes the compute stream wait for the previous step's optimizer before beginStep.

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dataset.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"
#include "model.h"
#include "optimizer.h"

namespace lockstep::trainer::gpu {

// Where a sharded model (--shard gradients|parameters) writes a layer's gradients and, at stage 3,
// reads its parameters: gpu_sharded_layers.h. The model asks on the host as it enqueues its work,
// in the same order on every rank; each ask makes the compute stream wait for what it needs.
class LayerSource {
 public:
  virtual ~LayerSource() = default;
  // This rank's part of the flat buffer: the gradients (and at stage 3 the parameters) it keeps.
  virtual std::size_t partBegin() const = 0;
  virtual std::size_t partEnd() const = 0;
  virtual bool shardsParameters() const = 0;
  virtual float* partGradients() = 0;  // device, from partBegin()
  // Stage 3: layer l's fp32 parameters, from layerBegin(l); `next`, the layer wanted after it, is
  // gathered meanwhile. Null at stage 2 (the model keeps the whole parameters).
  virtual Result<const float*> parameters(std::size_t layer, std::optional<std::size_t> next) = 0;
  // Where backward writes layer l's gradients, from layerBegin(l) (written, never added to).
  virtual Result<float*> gradients(std::size_t layer) = 0;
};

class GpuModel {
 public:
  // Picks the device, uploads the data set, allocates everything for batches of up to
  // spec.batchPerRank rows and spec.accumSteps micro-steps in flight, and the optimizer's state
  // for params[stateBegin, stateEnd) (the rank optimizer's range: all of it, this rank's part
  // with --shard, none where a parameter server applies the optimizer). `layers`: where a sharded
  // model's layers are (--shard gradients|parameters), or null: its own flat buffers.
  static Result<std::unique_ptr<GpuModel>> create(const ParamLayout& layout, const JobSpec& spec, const Dataset& data,
                                                  int device, std::size_t stateBegin, std::size_t stateEnd,
                                                  LayerSource* layers = nullptr);
  virtual ~GpuModel() = default;

  // Host <-> device copies of the parameters and optimizer state (synchronous; between steps).
  // The state buffers are the optimizer's range's (create); none: the parameters alone. At stage 3
  // only this rank's part of `params` moves.
  virtual Result<void> upload(const float* params, const std::vector<std::vector<float>*>& optimizerState) = 0;
  virtual Result<void> download(float* params, const std::vector<std::vector<float>*>& optimizerState) = 0;

  // Copies the indices of micro-step `micro` of the step in buffer `slot` (0 or 1) and gathers
  // their rows on the data stream. The slot must not be in use by a step still computing: pass
  // the event after which it is free (the step two back's compute end), or nullptr.
  virtual Result<void> prepareBatch(int slot, std::uint32_t micro, const std::vector<std::uint32_t>& indices,
                                    cudaEvent_t slotFree) = 0;

  // Starts a step on the compute stream: writes the header (sample count, stop vote; the loss
  // kernel sums the loss into it).
  virtual void beginStep(float samples, float stopVote) = 0;

  // Forward and backward of one micro-step from buffer `slot` (waiting for its batch). Gradients are written (the first
  // micro-step) or added. On the last micro-step, after each layer's gradients are final,
  // `layerDone(end)` is called with the event recorded on the compute stream: grads[0, end) is
  // final once it fires. Sharded (LayerSource), every micro-step calls it, for the layer ending at
  // `end`, whose gradients the source's slot then holds.
  virtual Result<void> forwardBackward(int slot, std::uint32_t micro, std::uint32_t rows, bool last,
                                       const std::function<void(std::size_t end, cudaEvent_t ready)>& layerDone) = 0;

  // The gradients after the compute stream's work so far, into host memory (synchronous).
  virtual Result<void> downloadGradients(float* host) = 0;

  // The optimizer's current step on params[begin, end), within the state's range, on `stream`
  // (after that range's all-reduce there).
  virtual void applyOptimizer(std::size_t begin, std::size_t end, const Optimizer& optimizer, cudaStream_t stream) = 0;

  // Device, the flat layout; grads()[kSampleCount] etc. are the header (sharded: the header alone).
  virtual float* grads() = 0;
  virtual float* params() = 0;  // device, the flat layout: the fp32 master weights (stage 3: the part)
  // After params[begin, end) changed other than through applyOptimizer (sharded training's
  // all-gather): their bf16 copy, on `stream`. Nothing in fp32.
  virtual void refreshLowCopy(std::size_t begin, std::size_t end, cudaStream_t stream) = 0;
  // The device memory that holds the weights: the fp32 master, and its bf16 copy.
  virtual std::uint64_t paramBytes() const = 0;
  virtual cudaStream_t computeStream() = 0;
  virtual cudaStream_t dataStream() = 0;
  // The data stream's event for a slot's micro-step: its batch is ready.
  virtual cudaEvent_t batchReady(int slot, std::uint32_t micro) = 0;
  // Which cuBLASLt epilogues the GEMMs use: "bias", "bias + GELU forward", or also "dGELU + bias
  // gradient backward"; what they leave out, the trainer's own kernels do.
  virtual std::string epilogues() const = 0;
  // How many GEMM shapes had their algorithm picked by timing cuBLASLt's candidates at start-up
  // (0 with LOCKSTEP_GEMM_TUNING=0: the heuristic's first choice everywhere).
  virtual int tunedGemms() const = 0;
};

}  // namespace lockstep::trainer::gpu
