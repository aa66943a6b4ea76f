#include "timeline_figure.h"

#include <algorithm>

#include "lockstep/report/trace.h"

namespace lockstep::report::detail {

Result<std::optional<TimelineFigure>> slowestMinuteFigure(const history::History& history, const history::JobRecord& job) {
  LOCKSTEP_ASSIGN_OR_RETURN(const kpi::Timeline timeline, loadTimeline(history, job));
  if (timeline.laneCount() == 0) return std::optional<TimelineFigure>();
  TimelineFigure figure;
  std::tie(figure.fromUs, figure.toUs) = timeline.slowestMinute();
  figure.zeroUs = timeline.span().first;
  figure.ranks = timeline.laneCount();
  struct Candidate {
    TimelineFigure::Lane lane;
    std::int64_t busyUs = 0;  // its steps' time in the window
    std::size_t order = 0;
  };
  std::vector<Candidate> candidates;
  for (const auto* lane : timeline.lanes()) {
    Candidate c{{"rank " + std::to_string(lane->rank) + " (" + lane->node + ")", {}, {}}, 0, candidates.size()};
    const std::int64_t offset = timeline.offsetOf(lane->node);
    const auto inWindow = [&](const kpi::Box& box) -> std::optional<kpi::Box> {
      const std::int64_t from = std::max(box.startUs, figure.fromUs), to = std::min(box.startUs + box.durationUs, figure.toUs);
      if (to <= from) return std::nullopt;
      return kpi::Box{box.phase, from, to - from};
    };
    for (const auto& step : lane->steps) {
      for (auto box : kpi::boxesOf(step, offset)) {
        const auto shown = inWindow(box);
        if (!shown) continue;
        c.busyUs += box.phase == kpi::Phase::kCommunication ? 0 : shown->durationUs;
        c.lane.boxes.push_back(*shown);
      }
    }
    for (const auto& phase : lane->phases) {
      if (const auto shown = inWindow(kpi::boxOf(phase, offset))) c.lane.phases.emplace_back(*shown, phase.name);
    }
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
