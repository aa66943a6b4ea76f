#pragma once
// What the bucket planner (bucket_plan.h) needs, measured on the GPU: NCCL all-reduce time against
// size on the job's communicator, and when each layer's gradients are final in a step of the
// first batch (CUDA events). Collective: every rank calls it before its first step.
//
// The GPU loop launches a layer's buckets when the layer is done, so readiness is per layer; the
// optimizer runs on the communication stream after each bucket (not timed: 0), and the
// all-reduce's kernels do not slow the compute stream (contention 0).

#include <vector>

#include "bucket_plan.h"
#include "gpu_model.h"
#include "nccl_comm.h"

namespace lockstep::trainer::gpu {

Result<PlanFigures> measureGpuStep(NcclComm& nccl, GpuModel& model, const ParamLayout& layout,
                                   const std::vector<std::uint32_t>& firstBatch);

}  // namespace lockstep::trainer::gpu
