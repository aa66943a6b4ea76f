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
};
// "data", "compute", "communication", "optimizer", "step", "phase"
std::string_view phaseName(Phase phase);
// Every phase, in the order a legend lists them.
inline constexpr Phase kEveryPhase[] = {Phase::kData,      Phase::kCompute, Phase::kCommunication,
                                        Phase::kOptimizer, Phase::kStep,    Phase::kNamed};

// One step of one rank, as its report said, on its node's clock.
struct TimelineStep {
  std::uint64_t step = 0;
  std::uint32_t attempt = 0;
  std::uint32_t samples = 0;
  std::int64_t endUs = 0;
  std::int64_t stepUs = 0;
  std::optional<std::int64_t> dataUs, computeUs, commUs;  // all or none (a split not measured)
  std::optional<std::int64_t> optimizerUs;                // its part of computeUs, where measured

  static TimelineStep of(const StepReport& r);
  std::int64_t startUs() const { return endUs - stepUs; }
};

struct Box {
  Phase phase;
  std::int64_t startUs;  // on the timeline's clock
  std::int64_t durationUs;
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

class Timeline {
 public:
  struct Lane {
    std::uint32_t rank = 0;
    std::string node;
    std::deque<TimelineStep> steps;  // in the order they came (a restart's steps after the last's)
    std::deque<TimelinePhase> phases;  // likewise
  };

  // Keeps the newest `stepsPerRank` steps of each lane, and as many phases (0: all of them).
  explicit Timeline(std::size_t stepsPerRank = 0) : stepsPerRank_(stepsPerRank) {}

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
  // By node and rank: a restart that puts a rank on another node starts it a lane there, whose
  // steps take that node's clock.
  std::map<std::pair<std::string, std::uint32_t>, Lane> lanes_;
  std::map<std::string, ClockOffset> clocks_;

  Lane& laneOf(const std::string& node, std::uint32_t rank);
  std::pair<std::int64_t, std::int64_t> spanOf(bool withPhases) const;
};

}  // namespace lockstep::kpi
