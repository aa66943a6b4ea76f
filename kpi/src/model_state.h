#pragma once
// What a rank holds of the model's state and how stale an asynchronous job's gradients are
// (issue 45; docs/kpis.md): from the step reports' param_bytes, grad_bytes,
// optimizer_state_bytes and staleness. Private to the KPI engine.

#include <vector>

#include "lockstep/kpi/kpi.h"
#include "rank_window.h"

namespace lockstep::kpi::detail {

// Over one rank's reports in the window (rank_window.h): its newest bytes, its staleness; the staleness values
// are added to `jobStaleness` too.
class ModelState {
 public:
  explicit ModelState(const HeldReports& held) : newest_(held.newestStateBytes), staleness_(held.staleness) {}
  void finish(RankKpis& rank, std::vector<double>& jobStaleness);

 private:
  const StepReport* newest_ = nullptr;
  std::vector<double> staleness_;
};

// The job's: the most any rank holds, and the staleness over every rank's gradients.
void jobModelState(JobKpis& job, std::vector<double> staleness);

}  // namespace lockstep::kpi::detail
