#pragma once
// The MLP: parameter layout, forward and backward on OpenBLAS.
//
// Parameters, gradients and optimizer state live in flat float buffers that share one layout:
//   [header | layer L-1 bias, weight | layer L-2 bias, weight | ... | layer 0 bias, weight]
// Last layer first, because backward produces gradients in that order: a gradient bucket is then a
// contiguous range that is complete as soon as backward has passed it. The header carries, in the
// gradient buffer, the values that are all-reduced with the gradients (loss sum, sample count,
// stop votes). Each tensor starts on a 512-byte boundary (256 bytes in the GPU's bf16 copy): the
// alignment cuBLASLt's fastest GEMM kernels assume, and a whole number of AVX-512 vectors. Shapes and names follow PyTorch's
// nn.Linear: layers.{i}.weight [out, in], layers.{i}.bias [out].

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lockstep/kpi/step_model.h"
#include "lockstep/protocol/types.h"

namespace lockstep::trainer {

struct TensorSlot {
  std::string name;                    // layers.{i}.weight or layers.{i}.bias
  std::vector<std::uint64_t> shape;    // [out, in] or [out]
  std::size_t offset = 0;              // in floats, into the flat buffer
  std::size_t count = 0;               // elements (without padding)
  std::size_t paddedCount = 0;         // elements up to the next tensor
};

// Header slots in the gradient buffer.
enum HeaderSlot : std::size_t { kLossSum = 0, kSampleCount = 1, kStopVotes = 2 };

class ParamLayout {
 public:
  static constexpr std::size_t kAlignFloats = 128;
  static constexpr std::size_t kHeaderFloats = kAlignFloats;

  explicit ParamLayout(std::vector<std::uint32_t> layers);

  const std::vector<std::uint32_t>& layers() const { return layers_; }
  std::size_t layerCount() const { return layers_.size() - 1; }
  std::size_t totalFloats() const { return total_; }
  std::uint64_t parameterCount() const;
  // The model FLOPs of training on one sample, as the steps compute them (docs/kpis.md, MFU): each
  // layer's three matrix products (forward, the weights' gradient, the input's gradient: 2 x in x
  // out FLOPs each), less the first layer's input gradient, which nothing needs. Bias, activation
  // and loss are left out, as MFU leaves them.
  double flopsPerSample() const;
  const TensorSlot& weight(std::size_t layer) const { return tensors_[2 * layer]; }
  const TensorSlot& bias(std::size_t layer) const { return tensors_[2 * layer + 1]; }
  // PyTorch state_dict order: layers.0.weight, layers.0.bias, layers.1.weight, ...
  const std::vector<TensorSlot>& tensors() const { return tensors_; }
  // Layer l's range of the flat buffer: its bias, then its weight (with their padding).
  std::size_t layerBegin(std::size_t layer) const { return bias(layer).offset; }
  std::size_t layerEnd(std::size_t layer) const { return weight(layer).offset + weight(layer).paddedCount; }
  std::size_t layerFloats(std::size_t layer) const { return layerEnd(layer) - layerBegin(layer); }
  // The floats of the largest layer's range: what holds any one layer (sharded training's buffers).
  std::size_t widestLayerFloats() const;

 private:
  std::vector<std::uint32_t> layers_;
  std::vector<TensorSlot> tensors_;
  std::size_t total_ = 0;
};

// A contiguous range [begin, end) of the flat gradient buffer, all-reduced as one.
using Bucket = kpi::BufferRange;

// Cuts the gradient buffer into buckets of at most `bucketBytes` (the first at most
// `firstBucketBytes`, so that communication starts early), cutting only between tensors or between
// weight rows. A single row larger than the cap gets a bucket of its own.
std::vector<Bucket> planBuckets(const ParamLayout& layout, std::size_t bucketBytes, std::size_t firstBucketBytes);

// PyTorch's nn.Linear default init: U(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
void initParameters(const ParamLayout& layout, std::uint64_t seed, float* params);

// Where forward reads a layer's parameters and backward writes the gradients: the flat buffers
// (FlatLayers), or, sharded (--shard gradients|parameters, sharded_layers.h), a layer gathered when
// it is needed and the gradients staged a bucket at a time.
class LayerStore {
 public:
  virtual ~LayerStore() = default;
  // Layer l's parameters, laid out as in the flat buffer from layerBegin(l).
  virtual const float* parameters(std::size_t layer) = 0;
  // Where backward writes the gradient of the flat range [offset, offset + count), which lies in one
  // bucket (between two cuts).
  virtual float* gradients(std::size_t offset, std::size_t count) = 0;
  // The gradient of [0, end) is final.
  virtual void ready(std::size_t end) = 0;
};

// The flat buffers themselves.
class FlatLayers final : public LayerStore {
 public:
  FlatLayers(const ParamLayout& layout, const float* params, float* grads, const std::function<void(std::size_t)>& ready)
      : layout_(layout), params_(params), grads_(grads), ready_(ready) {}
  const float* parameters(std::size_t layer) override { return params_ + layout_.layerBegin(layer); }
  float* gradients(std::size_t offset, std::size_t) override { return grads_ + offset; }
  void ready(std::size_t end) override { ready_(end); }

 private:
  const ParamLayout& layout_;
  const float* params_;
  float* grads_;
  const std::function<void(std::size_t)>& ready_;
};

// Forward and backward for batches of up to maxBatch samples. Holds the activations between
// forward and backward; one instance per thread.
class Mlp {
 public:
  Mlp(const ParamLayout& layout, Activation activation, std::uint32_t maxBatch);

  // Runs the batch and returns the summed (not averaged) cross-entropy over its samples.
  double forward(const float* params, const float* x, const std::int32_t* labels, std::uint32_t batch);
  double forward(LayerStore& layers, const float* x, const std::int32_t* labels, std::uint32_t batch);

  // Gradient of the summed loss of the last forward. Writes (accumulate=false) or adds to `grads`,
  // except the header. Follows the buffer order and splits weight gradients at `cuts` (bucket ends),
  // calling ready(end) after each piece: grads[0, end) is then final.
  void backward(const float* params, float* grads, bool accumulate, const std::vector<std::size_t>& cuts,
                const std::function<void(std::size_t)>& ready);
  void backward(LayerStore& layers, bool accumulate, const std::vector<std::size_t>& cuts);

 private:
  const ParamLayout& layout_;
  Activation activation_;
  std::uint32_t maxBatch_;
  std::uint32_t batch_ = 0;
  const float* input_ = nullptr;
  const std::int32_t* labels_ = nullptr;
  std::vector<std::vector<float>> pre_;   // pre_[i]: layer i's output before activation (logits for the last)
  std::vector<std::vector<float>> act_;   // act_[i]: the input of layer i+1
  std::vector<float> dOut_;               // gradient w.r.t. the current layer's pre-activation output
  std::vector<float> dIn_;                // gradient w.r.t. its input
};

}  // namespace lockstep::trainer
