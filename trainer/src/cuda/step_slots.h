#pragma once
// The events and pinned headers of the GPU loop's steps in flight (cuda_loop.h).

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep::trainer::gpu {

// The events and pinned header of one step in flight.
struct StepSlot {
  cudaEvent_t computeStart = nullptr, backwardEnd = nullptr, commStart = nullptr, end = nullptr;
  cudaEvent_t gatherStart = nullptr;  // --shard: the parameters' all-gather, after the optimizers
  float* header = nullptr;     // reduced: loss sum, samples, stop votes (pinned)
  float* localLoss = nullptr;  // this rank's loss sum before the reduction (pinned)
  std::uint64_t step = 0;      // 1-based; 0: empty
  std::uint32_t localSamples = 0;
  std::vector<std::uint32_t> rows;  // per micro-step
  bool commStarted = false;
  std::uint32_t layerGathers = 0;  // --shard parameters: the layers gathered, and their floats
  std::uint64_t gatheredFloats = 0;
};

class StepSlots {
 public:
  StepSlots() = default;
  ~StepSlots();
  StepSlots(const StepSlots&) = delete;
  StepSlots& operator=(const StepSlots&) = delete;

  Result<void> init();
  // Three: the step being enqueued, the one reported meanwhile, and the one before it, whose end
  // event is the reported step's start.
  StepSlot& operator[](std::uint64_t step) { return slots_[step % 3]; }
  cudaEvent_t start() const { return start_; }

 private:
  StepSlot slots_[3];
  cudaEvent_t start_ = nullptr;
};

// Microseconds between two recorded events; 0 where they cannot tell.
double elapsedUs(cudaEvent_t from, cudaEvent_t to);

}  // namespace lockstep::trainer::gpu
