#pragma once
// The peak each rank's model FLOPs utilization is taken against (docs/kpis.md, MFU). The agent
// sets it on the step reports its ranks push that count FLOPs (a rank's own figure is replaced):
// a GPU rank's from its GPU's datasheet at the precision its reports say (lockstep/kpi/peaks.h), a
// CPU rank's as its cores' share of the node's measured sgemm (sensors/cpu_peak.h). Where it came
// from, or why there is none, it says as a `peak` job event: once per job and text, and again
// every `resay` for clients that attach after the stream's replay buffer moved on.

#include <chrono>
#include <functional>
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
  using Hardware = std::function<std::optional<RankHardware>()>;

  Peaks(std::string node, std::vector<GpuInfo> gpus, std::chrono::milliseconds resay = std::chrono::minutes(1));

  void setCpu(CpuPeak cpu);
  // Sets `report`'s peak (clears it when the report counts no FLOPs, or the rank is not known
  // here: `hardware` says what it computes on, asked only for a rank not seen yet); the event that
  // says where it came from, when it is due.
  std::optional<JobEvent> stamp(StepReport& report, const Hardware& hardware);

 private:
  struct Peak {
    std::optional<double> flops;
    std::string basis;
  };
  Peak peakOf(const RankHardware& hardware, std::optional<Precision> precision) const;
  Peak gpuPeakOf(std::uint32_t gpu, std::optional<Precision> precision) const;
  Peak cpuPeakOf(std::uint32_t cores, std::optional<Precision> precision) const;

  struct Said {
    std::set<std::string> bases;
    std::chrono::steady_clock::time_point at;
  };

  std::string node_;
  std::vector<GpuInfo> gpus_;
  std::chrono::milliseconds resay_;
  CpuPeak cpu_;
  // By job, rank, attempt and precision: what peakOf said (the same for every report of a rank).
  std::map<std::tuple<std::string, std::uint32_t, std::uint32_t, int>, Peak> known_;
  std::map<std::string, Said> said_;  // by job: the bases its events said since `at`
};

}  // namespace lockstep::agent
