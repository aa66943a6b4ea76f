#pragma once
// One rank's step reports within the KPI window, and running sums over them (issue 46 §1). A
// snapshot reads a rank's figures from its sums, less the few reports at the window's edges that
// the moment it is taken for leaves out, instead of walking every report: at 16,384 ranks and 100
// reports each, the walk took a publication 200 ms. Private to the KPI engine (kpi.cpp,
// snapshot.cpp).
//
// Exact: the sums are of integers, in doubles where validation bounds them (microseconds, samples,
// counts: exact below 2^53) and in 128 bits where it does not (bytes, tokens, whole FLOPs). A rank
// that declares a fraction of a FLOP, reports staleness (asynchronous training) or whose clock went
// back has its held reports walked for what sums cannot give.

#include <cstdint>
#include <deque>
#include <vector>

#include "collective_sums.h"
#include "lockstep/protocol/types.h"

namespace lockstep::kpi::detail {

// Sums over a set of reports that take a report out as exactly as they took it in.
struct WindowSums {
  int reports = 0;
  double samples = 0, stepUs = 0;
  int withTokens = 0;
  ExactSum tokens = 0;
  int countedReports = 0;  // that counted their bytes reduced
  ExactSum countedBytes = 0;
  int timed = 0;  // with data, compute and exposed times
  double dataUs = 0, computeUs = 0, exposedUs = 0, timedSamples = 0, timedStepUs = 0;
  int withFlops = 0, fractionalFlops = 0, withBasis = 0, withPeak = 0, withStateBytes = 0, withStaleness = 0;
  ExactSum flops = 0;  // of the reports whose FLOPs are whole
  CollectiveSums collectives;
  ExposedEndsSums ends;

  void add(const StepReport& report, int sign);
};

// The reports held at a moment, summed, and the ones the figures that are not sums come from.
struct HeldReports {
  WindowSums sums;
  const StepReport* oldest = nullptr;
  const StepReport* newest = nullptr;
  // The newest that: had collectives, declared FLOPs with their basis, said the hardware's peak,
  // said what the rank holds of the model's state.
  const StepReport* newestCollectives = nullptr;
  const StepReport* newestBasis = nullptr;
  const StepReport* newestPeak = nullptr;
  const StepReport* newestStateBytes = nullptr;
  double flops = 0;                // all of them, fractional ones too
  std::vector<double> staleness;  // every report's that had one (asynchronous training), oldest first
};

class RankWindow {
 public:
  void push(const StepReport& report);
  // Drops the oldest reports while they are at or before `timeUs`.
  void trim(std::int64_t timeUs);
  void clear();
  // The reports in (fromUs, toUs].
  HeldReports held(std::int64_t fromUs, std::int64_t toUs) const;

 private:
  // Notes the newest reports of each kind, the staleness values and the FLOPs of those in
  // [begin, end) that are in (fromUs, toUs].
  void walk(HeldReports& h, std::size_t begin, std::size_t end, std::int64_t fromUs, std::int64_t toUs) const;

  // Reports in arrival order; in time order too unless a rank's clock went back (`sorted_`), when
  // `held` walks them all.
  std::deque<StepReport> reports_;
  WindowSums sums_;
  bool sorted_ = true;
};

}  // namespace lockstep::kpi::detail
