#include "lockstep/kpi/timeline.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "lockstep/common/natural.h"

namespace lockstep::kpi {

std::string_view phaseName(Phase phase) {
  switch (phase) {
    case Phase::kData: return "data";
    case Phase::kCompute: return "compute";
    case Phase::kCommunication: return "communication";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kStep: return "step";
    case Phase::kNamed: return "phase";
    case Phase::kCollective: return "collective";
  }
  return "step";
}

TimelineStep TimelineStep::of(const StepReport& r) {
  TimelineStep s;
  s.step = r.step;
  s.attempt = r.attempt;
  s.samples = r.samples;
  s.endUs = r.timeUnixUs;
  s.stepUs = std::max<std::int64_t>(0, r.stepTimeUs);
  if (r.dataTimeUs && r.computeTimeUs && r.exposedCommTimeUs) {
    s.dataUs = std::max<std::int64_t>(0, *r.dataTimeUs);
    s.computeUs = std::max<std::int64_t>(0, *r.computeTimeUs);
    s.commUs = std::max<std::int64_t>(0, *r.exposedCommTimeUs);
    if (r.optimizerTimeUs) s.optimizerUs = std::clamp<std::int64_t>(*r.optimizerTimeUs, 0, *s.computeUs);
  }
  s.collectives.reserve(r.collectiveSpans.size());
  for (CollectiveSpan c : r.collectiveSpans) {
    c.durationUs = std::max<std::int64_t>(0, c.durationUs);
    c.exposedUs = std::clamp<std::int64_t>(c.exposedUs, 0, c.durationUs);
    s.collectives.push_back(c);
  }
  return s;
}

TimelinePhase TimelinePhase::of(const PhaseReport& r) {
  return TimelinePhase{r.name, r.step, r.attempt, r.timeUnixUs, std::max<std::int64_t>(0, r.durationUs)};
}

std::vector<Box> boxesOf(const TimelineStep& s, std::int64_t offsetUs) {
  std::vector<Box> boxes;
  std::int64_t at = s.startUs() - offsetUs;
  if (!s.dataUs) {
    if (s.stepUs > 0) boxes.push_back({Phase::kStep, at, s.stepUs});
    return boxes;
  }
  const std::int64_t optimizer = s.optimizerUs.value_or(0);
  for (const auto& [phase, us] : {std::pair{Phase::kData, *s.dataUs}, std::pair{Phase::kCompute, *s.computeUs - optimizer},
                                  std::pair{Phase::kCommunication, *s.commUs}, std::pair{Phase::kOptimizer, optimizer}}) {
    if (us > 0) boxes.push_back({phase, at, us});
    at += us;
  }
  return boxes;
}

Box boxOf(const TimelinePhase& p, std::int64_t offsetUs) { return {Phase::kNamed, p.startUs() - offsetUs, p.durationUs}; }

std::vector<CollectiveBox> collectiveBoxesOf(const TimelineStep& s, std::int64_t offsetUs) {
  std::vector<CollectiveBox> boxes;
  boxes.reserve(s.collectives.size());
  for (const auto& c : s.collectives) {
    boxes.push_back({{Phase::kCollective, c.startUnixUs - offsetUs, c.durationUs}, c.kind, c.exposedUs, c.bytes});
  }
  return boxes;
}

std::vector<std::int64_t> labelEnds(const std::vector<CollectiveBox>& byStart) {
  std::vector<std::int64_t> ends;
  for (std::size_t i = 0; i < byStart.size(); ++i) {
    const Box& b = byStart[i].box;
    ends.push_back(i + 1 < byStart.size() ? std::min(b.startUs + b.durationUs, std::max(b.startUs, byStart[i + 1].box.startUs))
                                          : b.startUs + b.durationUs);
  }
  return ends;
}

std::vector<Box> mergedBoxes(std::vector<Box> boxes, std::int64_t gapUs) {
  std::sort(boxes.begin(), boxes.end(), [](const Box& a, const Box& b) { return a.startUs < b.startUs; });
  std::vector<Box> runs;
  for (const Box& b : boxes) {
    if (!runs.empty() && b.startUs < runs.back().startUs + runs.back().durationUs + gapUs) {
      Box& run = runs.back();
      run.durationUs = std::max(run.durationUs, b.startUs + b.durationUs - run.startUs);
    } else {
      runs.push_back(b);
    }
  }
  return runs;
}

std::vector<double> coverage(const std::vector<Box>& boxes, std::int64_t fromUs, std::int64_t toUs, std::size_t columns) {
  std::vector<double> out(columns, 0.0);
  if (columns == 0 || toUs <= fromUs) return out;
  const double wide = static_cast<double>(toUs - fromUs) / static_cast<double>(columns);  // µs a column
  for (const Box& b : boxes) {
    const double from = static_cast<double>(std::max(b.startUs, fromUs) - fromUs) / wide;
    const double to = static_cast<double>(std::min(b.startUs + b.durationUs, toUs) - fromUs) / wide;
    for (auto c = static_cast<std::size_t>(std::max(0.0, from)); static_cast<double>(c) < to && c < columns; ++c) {
      out[c] += std::min(to, static_cast<double>(c + 1)) - std::max(from, static_cast<double>(c));
    }
  }
  for (double& f : out) f = std::min(1.0, f);
  return out;
}

Timeline::Lane& Timeline::laneOf(const std::string& node, std::uint32_t rank) {
  Lane& lane = lanes_[{node, rank}];
  lane.rank = rank;
  lane.node = node;
  return lane;
}

void Timeline::add(const StepReport& report, const std::string& node) {
  Lane& lane = laneOf(node, report.rank);
  lane.steps.push_back(TimelineStep::of(report));
  lane.collectives += lane.steps.back().collectives.size();
  if (stepsPerRank_ > 0 && lane.steps.size() > stepsPerRank_) dropOldest(lane);
  keepCollectives(lane);
}

void Timeline::dropOldest(Lane& lane) {
  lane.collectives -= lane.steps.front().collectives.size();
  if (lane.bare > 0) --lane.bare;
  lane.steps.pop_front();
}

// Lets the oldest steps' spans go (their steps stay) until the lane holds no more than its share.
void Timeline::keepCollectives(Lane& lane) {
  while (lane.collectives > collectivesPerRank_ && lane.bare < lane.steps.size()) {
    auto& spans = lane.steps[lane.bare++].collectives;
    lane.collectives -= spans.size();
    std::vector<CollectiveSpan>().swap(spans);  // its memory too
  }
}

void Timeline::add(const PhaseReport& report, const std::string& node) {
  Lane& lane = laneOf(node, report.rank);
  lane.phases.push_back(TimelinePhase::of(report));
  if (stepsPerRank_ > 0 && lane.phases.size() > stepsPerRank_) lane.phases.pop_front();
}

std::int64_t Timeline::offsetOf(const std::string& node) const {
  const auto it = clocks_.find(node);
  return it == clocks_.end() ? 0 : it->second.offsetUs;
}

std::vector<const Timeline::Lane*> Timeline::lanes() const {
  std::vector<const Lane*> out;
  for (const auto& [key, lane] : lanes_) out.push_back(&lane);
  std::stable_sort(out.begin(), out.end(), [](const Lane* a, const Lane* b) {
    if (a->node != b->node) return naturalLess(a->node, b->node);
    return a->rank < b->rank;
  });
  return out;
}

std::pair<std::int64_t, std::int64_t> Timeline::span() const { return spanOf(true); }

std::pair<std::int64_t, std::int64_t> Timeline::spanOf(bool withPhases) const {
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = std::numeric_limits<std::int64_t>::min();
  const auto cover = [&](std::int64_t from, std::int64_t to) {
    first = std::min(first, from);
    last = std::max(last, to);
  };
  for (const auto& [key, lane] : lanes_) {
    const std::int64_t offset = offsetOf(lane.node);
    for (const auto& s : lane.steps) cover(s.startUs() - offset, s.endUs - offset);
    if (!withPhases) continue;
    for (const auto& p : lane.phases) cover(p.startUs() - offset, p.endUs - offset);
  }
  return first > last ? std::pair<std::int64_t, std::int64_t>{0, 0} : std::pair{first, last};
}

std::pair<std::int64_t, std::int64_t> Timeline::slowestMinute() const {
  constexpr std::int64_t kMinute = 60'000'000, kStride = 10'000'000;
  // Over the steps only: a phase before the first (loading a checkpoint) or after the last (a final
  // eval) holds no samples, and a window over it would always be the slowest.
  const auto [first, last] = spanOf(false);
  if (last - first <= kMinute) return {first, last};
  // Samples per 10 s by when their step ended (sparse: one stray time must not cost its decades);
  // a window is six of them, and holds at least one step's end.
  std::map<std::int64_t, std::uint64_t> perStride;
  for (const auto& [key, lane] : lanes_) {
    const std::int64_t offset = offsetOf(lane.node);
    for (const auto& s : lane.steps) perStride[(s.endUs - offset - first) / kStride] += s.samples;
  }
  constexpr std::int64_t kWide = kMinute / kStride;
  const std::int64_t lastStart = (last - first - kMinute) / kStride;  // windows end by `last`
  std::optional<std::int64_t> best;
  std::uint64_t fewest = std::numeric_limits<std::uint64_t>::max();
  for (const auto& [stride, samples] : perStride) {
    for (std::int64_t start = std::max<std::int64_t>(0, stride - kWide + 1); start <= std::min(stride, lastStart); ++start) {
      std::uint64_t sum = 0;
      for (auto it = perStride.lower_bound(start); it != perStride.end() && it->first < start + kWide; ++it) sum += it->second;
      if (sum < fewest) fewest = sum, best = start;
    }
  }
  const std::int64_t from = best ? first + *best * kStride : last - kMinute;
  return {from, from + kMinute};
}

}  // namespace lockstep::kpi
