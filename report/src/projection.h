#pragma once
// What more ranks would buy, in a report and in a comparison of jobs (kpi/projection.h; docs/kpis.md).
// Private to report/.

#include <optional>
#include <span>

#include "lockstep/kpi/projection.h"
#include "lockstep/report/report.h"

namespace lockstep::report::detail {

// A job's projection: what it starts from, and each rank count (kpi::projectionRanks).
struct Projection {
  kpi::ScalingInputs in;
  std::vector<kpi::Projected> rows;
};
// Empty without a timed step split.
std::optional<Projection> projection(const ReportData& data);

Section projectionSection(const ReportData& data);
// The projected throughput against ranks, from the jobs of one workload: the step of its 1-rank
// job where there is one, the communication of its largest job. Empty when nothing can be projected.
std::optional<Series> projectedScaling(std::span<const history::JobRecord* const> oneRank,
                                       const history::JobRecord& largest, std::uint32_t upTo);

}  // namespace lockstep::report::detail
