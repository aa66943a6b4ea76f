#pragma once
// SGD (momentum, Nesterov, weight decay) and AdamW with PyTorch's update rules, applied to ranges of
// the flat parameter buffer so that each gradient bucket is applied as soon as it is reduced.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "element_math.h"
#include "lockstep/protocol/types.h"
#include "model.h"

namespace lockstep::trainer {

class Optimizer {
 public:
  // A named state buffer with the parameter layout (e.g. "momentum_buffer"), for checkpoints.
  struct StateBuffer {
    std::string name;
    std::vector<float>* data;
  };

  // Keeps state for, and applies to, the flat range [begin, end) of the parameter buffer: all of it
  // (the default), or a rank's part of it when the optimizer state is sharded (shard.h).
  Optimizer(const OptimizerSpec& spec, const ParamLayout& layout);
  Optimizer(const OptimizerSpec& spec, std::size_t begin, std::size_t end);

  // Starts optimizer step number stepsTaken()+1 with this learning rate.
  void beginStep(double lr);
  // Applies the step to params[begin, end) within the optimizer's range (header floats are skipped). gradScale turns the raw
  // summed gradient into the mean (1 / samples in the global step).
  void apply(float* params, const float* grads, std::size_t begin, std::size_t end, float gradScale);
  // Applies the step to the whole range, given as arrays of its own: element i is parameter
  // rangeBegin() + i (a rank's part when the gradients or parameters are sharded too).
  void applyToRange(float* params, const float* grads, float gradScale);

  // The current step's per-parameter rule (for the GPU backend, which applies it on the device).
  kernels::SgdParams sgdParams(float gradScale) const;
  kernels::AdamWParams adamwParams(float gradScale) const;

  std::int64_t stepsTaken() const { return steps_; }
  void setStepsTaken(std::int64_t steps) { steps_ = steps; }
  // Its state, over its range: buffer element i is the state of parameter rangeBegin() + i.
  std::vector<StateBuffer> stateBuffers();
  std::size_t rangeBegin() const { return begin_; }
  std::size_t rangeEnd() const { return end_; }
  std::uint64_t stateBytes() const { return (first_.size() + second_.size()) * sizeof(float); }
  const OptimizerSpec& spec() const { return spec_; }

 private:
  // params[0, n) and grads[0, n) with their state from element `state` of the range's.
  void update(float* params, const float* grads, std::size_t state, std::size_t n, float gradScale);

  OptimizerSpec spec_;
  std::size_t begin_ = 0, end_ = 0;
  std::int64_t steps_ = 0;
  double lr_ = 0;
  std::vector<float> first_;   // SGD momentum buffer, or AdamW exp_avg
  std::vector<float> second_;  // AdamW exp_avg_sq
};

// The learning rate after the job's scaling rule, for an update of the global batch, or of
// `updateBatch` samples (an asynchronous parameter server's update is one rank's batch).
double effectiveLearningRate(const JobSpec& spec);
double learningRateFor(const JobSpec& spec, std::uint64_t updateBatch);

}  // namespace lockstep::trainer
