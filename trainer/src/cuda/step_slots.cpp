#include "step_slots.h"

#include "cuda_check.h"

namespace lockstep::trainer::gpu {

StepSlots::~StepSlots() {
  for (auto& s : slots_) {
    for (auto e : {s.computeStart, s.backwardEnd, s.commStart, s.end, s.gatherStart}) {
      if (e) cudaEventDestroy(e);
    }
    if (s.header) cudaFreeHost(s.header);
  }
  if (start_) cudaEventDestroy(start_);
}

Result<void> StepSlots::init() {
  for (auto& s : slots_) {
    for (auto* e : {&s.computeStart, &s.backwardEnd, &s.commStart, &s.end, &s.gatherStart}) LOCKSTEP_CUDA(cudaEventCreate(e));
    void* pinned = nullptr;
    LOCKSTEP_CUDA(cudaMallocHost(&pinned, 4 * sizeof(float)));
    s.header = static_cast<float*>(pinned);
    s.localLoss = s.header + 3;
  }
  LOCKSTEP_CUDA(cudaEventCreate(&start_));
  return {};
}

double elapsedUs(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
    (void)cudaGetLastError();  // a sticky "not ready" would fail the next launch check
    return 0.0;
  }
  return static_cast<double>(ms) * 1e3;
}

}  // namespace lockstep::trainer::gpu
