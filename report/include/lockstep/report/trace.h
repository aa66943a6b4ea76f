#pragma once
// A recorded job's steps as a timeline (kpi/timeline.h) and as Chrome trace event JSON, which
// Perfetto's UI and chrome://tracing open (docs/timeline.md): a process per rank, named and sorted
// by rank, with a complete event per phase of every step; counters for each rank's samples/s and
// each GPU's utilization; every node's records put on the recording client's clock with the offsets
// the history keeps. Timestamps count from `baseTimeNanoseconds` (Unix time, top level), as
// PyTorch's traces do since 2.4, so that tools which merge those line them up with ours.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "lockstep/common/clock.h"
#include "lockstep/common/natural.h"
#include "lockstep/common/result.h"
#include "lockstep/history/history.h"
#include "lockstep/kpi/timeline.h"

namespace lockstep::report {

// On the client's clock, Unix microseconds; a step is kept if any of it falls within.
struct TimeRange {
  std::optional<std::int64_t> fromUnixUs, toUnixUs;
  bool overlaps(std::int64_t startUs, std::int64_t endUs) const {
    return (!fromUnixUs || endUs >= *fromUnixUs) && (!toUnixUs || startUs <= *toUnixUs);
  }
};

// The job's steps within `range`, with its nodes' clocks (History::clocks) set, and the collectives
// of each lane's newest steps that hold at most `collectivesPerRank` (kpi::Timeline).
Result<kpi::Timeline> loadTimeline(const history::History& history, const history::JobRecord& job, const TimeRange& range = {},
                                   std::size_t collectivesPerRank = kpi::Timeline::kEveryCollective);

struct TraceSummary {
  std::size_t ranks = 0;
  std::size_t events = 0;
  std::map<std::string, ClockOffset, NaturalLess> clocks;  // the nodes whose clock was measured
  std::vector<std::string> unmeasured;                     // nodes taken as they stamped
  // The clocks as the trace's otherData.clock_offsets and `lockstepctl trace --json` give them:
  // {"node": {"offset_us": N, "uncertainty_us": N}, ...}.
  std::string clocksJson() const;
};

// Writes the trace to `path`, gzip-compressed when it ends in ".gz"; nothing is left there on
// failure. NotFound for an unknown job; InvalidArgument when the range holds no step.
Result<TraceSummary> writeTrace(const history::History& history, const std::string& jobId, const TimeRange& range,
                                const std::string& path);

}  // namespace lockstep::report
