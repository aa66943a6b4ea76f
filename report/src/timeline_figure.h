#pragma once
// The report's timeline figure: the job's slowest minute (kpi::Timeline::slowestMinute), lane by
// lane. Private to report/.

#include <optional>

#include "lockstep/report/report.h"

namespace lockstep::report::detail {

// At most this many lanes: beyond, the ranks whose steps in the window were the longest.
inline constexpr std::size_t kTimelineLanes = 16;

// None for a job without steps.
Result<std::optional<TimelineFigure>> slowestMinuteFigure(const history::History& history, const history::JobRecord& job);

}  // namespace lockstep::report::detail
