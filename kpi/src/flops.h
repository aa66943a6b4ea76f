#pragma once
// Model FLOPs utilization (issue 46; docs/kpis.md): from the step reports' flops, flops_basis and
// peak_flops (the agent's). Private to the KPI engine.

#include <set>

#include "lockstep/kpi/kpi.h"
#include "rank_window.h"

namespace lockstep::kpi::detail {

// Every rank's FLOPs together, for the job's figures.
struct FlopsTotals {
  double flopsPerSecond = 0;  // every rank's that counted them
  double peak = 0;            // the peaks of the ranks that have both
  double withPeak = 0;        // those ranks' FLOP/s
  bool counted = false;
  std::set<FlopsBasis> bases;
};

// Over one rank's reports in the window.
class RankFlops {
 public:
  explicit RankFlops(const HeldReports& held);
  // Its FLOP/s over `spanSeconds` (what its samples/s are taken over), its peak and MFU.
  void finish(RankKpis& rank, double spanSeconds, FlopsTotals& job) const;

 private:
  double flops_ = 0;
  bool counted_ = false;
  std::optional<FlopsBasis> basis_;  // the newest report's that said one
  const StepReport* newestPeak_ = nullptr;
};

void jobFlops(JobKpis& job, const FlopsTotals& totals);

}  // namespace lockstep::kpi::detail
