#pragma once
// The hardware's peak that a rank's model FLOPs utilization is taken against (issue 46;
// docs/kpis.md): for GPUs the datasheet's dense (not 2:4 sparse) tensor-core figure at the
// precision the job's math runs in; for CPUs a measured sgemm (the agent's, agent/src/stream/peaks.h).

#include <optional>
#include <string_view>

#include "lockstep/protocol/types.h"

namespace lockstep::kpi {

struct GpuPeak {
  double flops = 0;        // FLOP/s
  std::string_view model;  // the datasheet it came from: "H100 SXM"
};

// A GPU as NVML names it ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"), at a precision:
// its datasheet's dense peak, or nothing where the table has no such GPU or the GPU no such math.
std::optional<GpuPeak> gpuPeak(std::string_view nvmlName, Precision precision);

}  // namespace lockstep::kpi
