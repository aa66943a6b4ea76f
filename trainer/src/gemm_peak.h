#pragma once
// The CPU's ceiling for a CPU job's model FLOPs utilization (issue 46; docs/kpis.md): one core's
// sgemm with the kernels this trainer computes with, measured on every core the process may use at
// once (so that what the cores share, their clock and caches under load, is in the figure). The
// agent runs `lockstep-trainer --gemm-peak` once per node and keeps the result
// (agent/src/sensors/cpu_peak.h).

#include <string>

namespace lockstep::trainer {

struct GemmPeak {
  double flopsPerCore = 0;  // the mean over the cores of each one's best rate, FLOP/s
  unsigned cores = 0;
  std::string corename;     // OpenBLAS's kernels in force
};

GemmPeak measureGemmPeak(double seconds);

// {"flops_per_core": ..., "cores": ..., "corename": "..."}: one line, what the agent reads.
std::string gemmPeakJson(const GemmPeak& peak);

}  // namespace lockstep::trainer
