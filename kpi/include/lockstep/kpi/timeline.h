#pragma once
// Where every rank's steps went, on one clock: what the app's timeline draws, the trace export
// writes (report/trace.h) and the report's timeline figure shows.
//
// A step report says when its step ended (the node's clock), how long it took, and how long its
// data, compute and exposed communication took (they add up to the step), and, where measured,
// the optimizer's part of compute. Its boxes lie end to end in the order data, compute (forward
// and backward), exposed communication, optimizer, ending at the report's time. A phase report
// (lockstep.phase("checkpoint")) is a box of its own at the time it ran, drawn after the steps'
// boxes: its time is not a step's (a checkpoint between steps lies in a gap of its lane; an eval
// before step() reports lies over that step's boxes). Each node's clock offset to this client
// (common/clock.h) puts its ranks' times on this client's clock.
//
// A step report may also list its collectives one by one (StepReport::collectiveSpans, on the
// node's clock): each is a box at the time it ran (collectiveBoxesOf), over the step's own boxes,
// since it overlaps them (an FSDP all-gather runs during the forward pass). Its last exposedUs are
// the time the rank waited on it: the part a view fills, the rest it only outlines.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/clock.h"
#include "lockstep/protocol/types.h"

namespace lockstep::kpi {

enum class Phase : std::uint8_t {
  kData,
  kCompute,
  kCommunication,  // exposed: waiting for the all-reduce
  kOptimizer,
  kStep,           // a step whose split was not measured
  kNamed,          // a phase the program named (its name is the TimelinePhase's)
  kCollective,     // one collective (a CollectiveBox), over the step's boxes
};
// "data", "compute", "communication", "optimizer", "step", "phase", "collective"
std::string_view phaseName(Phase phase);
// Every phase, in the order a legend lists them.
inline constexpr Phase kEveryPhase[] = {Phase::kData, Phase::kCompute, Phase::kCommunication, Phase::kOptimizer,
                                        Phase::kStep, Phase::kNamed,   Phase::kCollective};

// One step of one rank, as its report said, on its node's clock.
struct TimelineStep {
  std::uint64_t step = 0;
  std::uint32_t attempt = 0;
  std::uint32_t samples = 0;
  std::int64_t endUs = 0;
  std::int64_t stepUs = 0;
  std::optional<std::int64_t> dataUs, computeUs, commUs;  // all or none (a split not measured)
  std::optional<std::int64_t> optimizerUs;                // its part of computeUs, where measured
  // Its collectives one by one, as its report listed them (durations and exposed parts made sane);
  // a Timeline keeps them only for its lanes' newest steps.
  std::vector<CollectiveSpan> collectives;

  static TimelineStep of(const StepReport& r);
  std::int64_t startUs() const { return endUs - stepUs; }
};

struct Box {
  Phase phase;
  std::int64_t startUs;  // on the timeline's clock
  std::int64_t durationUs;
};

// One collective a step ran, on the timeline's clock.
struct CollectiveBox {
  Box box;  // Phase::kCollective, issue to completion
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::int64_t exposedUs = 0;  // at most box.durationUs
  std::uint64_t bytes = 0;
  // Its last exposedUs: the rank waited for it to finish.
  Box exposed() const { return {Phase::kCollective, box.startUs + box.durationUs - exposedUs, exposedUs}; }
};

// A phase the program named, as its report said, on its node's clock.
struct TimelinePhase {
  std::string name;
  std::uint64_t step = 0;  // the last step before its end
  std::uint32_t attempt = 0;
  std::int64_t endUs = 0;
  std::int64_t durationUs = 0;

  static TimelinePhase of(const PhaseReport& r);
  std::int64_t startUs() const { return endUs - durationUs; }
};

// The step's boxes in order, moved by `offsetUs` (a node's clock offset: t - offset), leaving out
// the empty ones.
std::vector<Box> boxesOf(const TimelineStep& s, std::int64_t offsetUs = 0);
// The phase's box (Phase::kNamed), moved the same way.
Box boxOf(const TimelinePhase& p, std::int64_t offsetUs = 0);
// The step's collectives, moved the same way, in the order its report listed them.
std::vector<CollectiveBox> collectiveBoxesOf(const TimelineStep& s, std::int64_t offsetUs = 0);
// Where each box's label has to end, the boxes by start: at its end, or where the next one starts
// inside it (an FSDP all-gather prefetched under the last layer's reduce-scatter).
std::vector<std::int64_t> labelEnds(const std::vector<CollectiveBox>& byStart);
// Boxes that overlap or lie less than `gapUs` apart as one (of the first's phase), by start: what a
// view draws of a thousand collectives that a pixel or two hold.
std::vector<Box> mergedBoxes(std::vector<Box> boxes, std::int64_t gapUs);
// How much of each of `columns` equal slices of [fromUs, toUs) the boxes cover, 0 to 1 (overlaps add
// up, to at most 1): what a view draws of parts too thin for a pixel each, such as the exposed
// ends of a thousand collectives, without widening each to a pixel.
std::vector<double> coverage(const std::vector<Box>& boxes, std::int64_t fromUs, std::int64_t toUs, std::size_t columns);

class Timeline {
 public:
  struct Lane {
    std::uint32_t rank = 0;
    std::string node;
    std::deque<TimelineStep> steps;  // in the order they came (a restart's steps after the last's)
    std::deque<TimelinePhase> phases;  // likewise
    std::size_t collectives = 0;       // the spans its steps hold
    std::size_t bare = 0;              // its oldest steps whose spans were let go
  };

  static constexpr std::size_t kEveryCollective = static_cast<std::size_t>(-1);

  // Keeps the newest `stepsPerRank` steps of each lane, and as many phases (0: all of them), and
  // the collectives of its newest steps that hold at most `collectivesPerRank` of them (up to 64 a
  // step: 1024 ranks' 512 steps of them would be gigabytes).
  explicit Timeline(std::size_t stepsPerRank = 0, std::size_t collectivesPerRank = kEveryCollective)
      : stepsPerRank_(stepsPerRank), collectivesPerRank_(collectivesPerRank) {}

  void add(const StepReport& report, const std::string& node);
  void add(const PhaseReport& report, const std::string& node);
  // How far `node`'s clock is from this client's; applies to every step of its ranks, before and after.
  void setClock(const std::string& node, const ClockOffset& clock) { clocks_[node] = clock; }
  const std::map<std::string, ClockOffset>& clocks() const { return clocks_; }
  std::int64_t offsetOf(const std::string& node) const;

  // Lanes by node (natural order), then rank.
  std::vector<const Lane*> lanes() const;
  std::size_t laneCount() const { return lanes_.size(); }  // a rank on two nodes (a restart) has two
  // The first box's start and the last box's end, on this client's clock; {0, 0} when empty.
  std::pair<std::int64_t, std::int64_t> span() const;
  // The 60 s (or the whole job, when shorter) in which the job got the fewest samples through:
  // the one a report shows. Windows start every 10 s, from the first step to the last.
  std::pair<std::int64_t, std::int64_t> slowestMinute() const;

 private:
  std::size_t stepsPerRank_;
  std::size_t collectivesPerRank_;
  // By node and rank: a restart that puts a rank on another node starts it a lane there, whose
  // steps take that node's clock.
  std::map<std::pair<std::string, std::uint32_t>, Lane> lanes_;
  std::map<std::string, ClockOffset> clocks_;

  Lane& laneOf(const std::string& node, std::uint32_t rank);
  void dropOldest(Lane& lane);
  void keepCollectives(Lane& lane);
  std::pair<std::int64_t, std::int64_t> spanOf(bool withPhases) const;
};

}  // namespace lockstep::kpi
