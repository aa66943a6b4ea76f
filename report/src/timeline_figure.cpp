#include "timeline_figure.h"

#include <algorithm>
#include <map>

#include "lockstep/report/trace.h"

namespace lockstep::report::detail {
namespace {

std::optional<kpi::Box> inWindow(const kpi::Box& box, std::int64_t fromUs, std::int64_t toUs) {
  const std::int64_t from = std::max(box.startUs, fromUs), to = std::min(box.startUs + box.durationUs, toUs);
  if (to <= from) return std::nullopt;
  return kpi::Box{box.phase, from, to - from};
}

// Its part in the window, and of its exposed part (its end) what is left of it.
std::optional<kpi::CollectiveBox> inWindow(kpi::CollectiveBox c, std::int64_t fromUs, std::int64_t toUs) {
  const auto shown = inWindow(c.box, fromUs, toUs);
  if (!shown) return std::nullopt;
  const std::int64_t waitedFrom = c.exposed().startUs, end = shown->startUs + shown->durationUs;
  c.exposedUs = std::max<std::int64_t>(0, end - std::max(waitedFrom, shown->startUs));
  c.box = *shown;
  return c;
}

using LaneKey = std::pair<std::string, std::uint32_t>;

// The lanes' collectives in the window, read again for the window alone: a whole job's (up to 64
// a step) would not fit in memory at 1024 ranks.
Result<std::map<LaneKey, std::vector<kpi::CollectiveBox>>> collectivesIn(const history::History& history,
                                                                          const history::JobRecord& job, std::int64_t fromUs,
                                                                          std::int64_t toUs) {
  LOCKSTEP_ASSIGN_OR_RETURN(const kpi::Timeline timeline, loadTimeline(history, job, TimeRange{fromUs, toUs}));
  std::map<LaneKey, std::vector<kpi::CollectiveBox>> out;
  for (const auto* lane : timeline.lanes()) {
    auto& boxes = out[{lane->node, lane->rank}];
    for (const auto& step : lane->steps) {
      for (const auto& c : kpi::collectiveBoxesOf(step, timeline.offsetOf(lane->node))) {
        if (const auto shown = inWindow(c, fromUs, toUs)) boxes.push_back(*shown);
      }
    }
  }
  return out;
}

}  // namespace

Result<std::optional<TimelineFigure>> slowestMinuteFigure(const history::History& history, const history::JobRecord& job) {
  LOCKSTEP_ASSIGN_OR_RETURN(const kpi::Timeline timeline, loadTimeline(history, job, {}, 0));
  if (timeline.laneCount() == 0) return std::optional<TimelineFigure>();
  TimelineFigure figure;
  std::tie(figure.fromUs, figure.toUs) = timeline.slowestMinute();
  figure.zeroUs = timeline.span().first;
  figure.ranks = timeline.laneCount();
  LOCKSTEP_ASSIGN_OR_RETURN(auto collectives, collectivesIn(history, job, figure.fromUs, figure.toUs));
  struct Candidate {
    TimelineFigure::Lane lane;
    std::int64_t busyUs = 0;  // its steps' time in the window
    std::size_t order = 0;
  };
  std::vector<Candidate> candidates;
  for (const auto* lane : timeline.lanes()) {
    Candidate c{{"rank " + std::to_string(lane->rank) + " (" + lane->node + ")", {}, {}, {}}, 0, candidates.size()};
    const std::int64_t offset = timeline.offsetOf(lane->node);
    for (const auto& step : lane->steps) {
      for (auto box : kpi::boxesOf(step, offset)) {
        const auto shown = inWindow(box, figure.fromUs, figure.toUs);
        if (!shown) continue;
        c.busyUs += box.phase == kpi::Phase::kCommunication ? 0 : shown->durationUs;
        c.lane.boxes.push_back(*shown);
      }
    }
    for (const auto& phase : lane->phases) {
      if (const auto shown = inWindow(kpi::boxOf(phase, offset), figure.fromUs, figure.toUs)) c.lane.phases.emplace_back(*shown, phase.name);
    }
    c.lane.collectives = std::move(collectives[{lane->node, lane->rank}]);
    candidates.push_back(std::move(c));
  }
  // The slowest ranks (the most data and compute in the window), shown in the lanes' order.
  if (candidates.size() > kTimelineLanes) {
    std::partial_sort(candidates.begin(), candidates.begin() + kTimelineLanes, candidates.end(),
                      [](const Candidate& a, const Candidate& b) { return a.busyUs > b.busyUs; });
    candidates.resize(kTimelineLanes);
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) { return a.order < b.order; });
  }
  for (auto& c : candidates) figure.lanes.push_back(std::move(c.lane));
  return std::optional<TimelineFigure>(std::move(figure));
}

}  // namespace lockstep::report::detail
