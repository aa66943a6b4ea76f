#pragma once
// The peak each rank's model FLOPs utilization is taken against (docs/kpis.md, MFU). The agent
// sets it on the step reports its ranks push that count FLOPs (a rank's own figure is replaced):
// a GPU rank's from its GPU's datasheet at the precision its reports say (lockstep/kpi/peaks.h), a
// CPU rank's as its cores' share of the node's measured sgemm (sensors/cpu_peak.h). Where it came
// from, or why there is none, it says once per job and text as a `peak` job event.

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "jobs/rank_launch.h"
#include "lockstep/protocol/types.h"
#include "sensors/cpu_peak.h"

namespace lockstep::agent {

class Peaks {
 public:
  Peaks(std::string node, std::vector<GpuInfo> gpus);

  void setCpu(CpuPeak cpu);
  // Sets `report`'s peak for a rank that computes on `hardware`; the event that says where it came
  // from, when this job has not been told so yet.
  std::optional<JobEvent> stamp(StepReport& report, const RankHardware& hardware);

 private:
  struct Peak {
    std::optional<double> flops;
    std::string basis;
  };
  Peak peakOf(const RankHardware& hardware, std::optional<Precision> precision) const;
  Peak gpuPeakOf(std::uint32_t gpu, std::optional<Precision> precision) const;
  Peak cpuPeakOf(std::uint32_t cores, std::optional<Precision> precision) const;

  std::string node_;
  std::vector<GpuInfo> gpus_;
  CpuPeak cpu_;
  // By job, rank and precision: what peakOf said (the same for every report of a rank).
  std::map<std::tuple<std::string, std::uint32_t, int>, Peak> known_;
  std::map<std::string, std::set<std::string>> said_;  // by job: the bases its events said
};

}  // namespace lockstep::agent
