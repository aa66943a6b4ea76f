#pragma once
// Stalls (docs/stalls.md): how long a rank's progress may stand still, and what a job's ranks'
// progress says when it stopped: which ranks did not reach the collective the others wait in
// (the wavefront), and where each one is. The agent judges its ranks with these; lockstepctl and
// the app diagnose the ranks of all of a job's agents with the same function.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep::kpi {

// 14 s: with the agent's judging at the deadline and a client's poll, a stall of sub-second steps
// is shown within 15 s of the last progress (docs/benchmarks.md, issue 46).
inline constexpr std::int64_t kMinStallMs = 14'000;
inline constexpr std::int64_t kMinStartupMs = 120'000;
inline constexpr double kStallTimesP99 = 5.0;
inline constexpr double kStartupTimesBase = 10.0;

// What a rank's allowance rests on.
struct StallBasis {
  std::uint32_t stallAfterS = 0;           // the job's --stall-after-s; 0: automatic
  std::optional<std::int64_t> stepP99Ms;   // its recent steps' p99; unset: no step yet
  bool announced = false;                  // in a phase the program named (checkpoint, eval)
  std::optional<std::int64_t> phaseMaxMs;  // that phase's longest earlier run; unset: first time
};

// How long the rank's progress may stand still before the job counts as stalled: the larger of
// 14 s and 5x its recent p99 step time (or --stall-after-s); before the first step, and in an
// announced phase's first run, the start-up allowance (10x that, at least 120 s); in an announced
// phase seen before, 5x its longest run (at least the step's allowance).
std::int64_t stallAllowanceMs(const StallBasis& basis);

struct StallDiagnosis {
  std::vector<std::uint32_t> behind;   // did not reach the collective the others wait in
  std::vector<std::uint32_t> waiting;  // wait in it
  std::string message;                 // the diagnosis in one paragraph
};

// From every rank's progress (any order; ranks without a record are named as such).
StallDiagnosis diagnoseStall(const std::vector<RankProgress>& ranks);

// A job's stall from all of its agents' parts: each agent sees its own ranks; the diagnosis is
// made again over every rank (the wavefront across nodes), since the earliest part's stall began.
// Unset while no part is stalled.
std::optional<Stall> jobStall(const std::vector<const JobStatus*>& parts);

// "all-reduce #15 (bucket 2 of 9) of step 40": where a rank is, in words.
std::string whereIs(const RankProgress& rank);
// "0-3, 5, 7-9": ranks as ranges, in order.
std::string rankRanges(std::vector<std::uint32_t> ranks);
// The evidence of one rank as text: its state and progress, threads, stacks, backtrace, log.
std::string evidenceText(const RankEvidence& evidence);

}  // namespace lockstep::kpi
