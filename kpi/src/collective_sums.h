#pragma once
// A window's collectives, summed for JobTracker::snapshot (snapshot.cpp): each kind's count, time,
// exposed time and bytes over a rank's reports (every report's collectives through
// lockstep::collectivesOf, the trainer's all-reduce included), and where in the ranks' steps the
// exposed time sits (their spans' first and last collective). docs/kpis.md has the definitions.

#include <cstdint>
#include <map>
#include <vector>

#include "lockstep/kpi/kpi.h"

namespace lockstep::kpi::detail {

// Sums of integers a report may carry at any size (bytes, tokens, FLOPs), exact: a window's sums
// take a report out as exactly as they took it in (rank_window.h). GCC's and Clang's 128 bits.
__extension__ typedef __int128 ExactSum;

// One rank's reports in the window, by kind of collective.
class CollectiveSums {
 public:
  // Adds a report's collectives (sign 1) or takes them out again (-1).
  void add(const StepReport& report, int sign = 1);
  // The reports summed that had collectives.
  int reports() const { return reports_; }
  // The world size the bus bandwidths are for: the newest report's with collectives.
  void setWorldSize(std::uint32_t worldSize) { worldSize_ = worldSize; }
  // Per step over `steps` reports of `stepUs` step time in all; the kinds seen, in
  // kCollectiveKindNames' order.
  std::vector<CollectiveKpis> kpis(double steps, double stepUs) const;
  // Bytes over the time of the collectives of `kind` that were timed and counted their bytes, among
  // more than one rank: the algorithm bandwidth. Unknown otherwise.
  Maybe algBandwidth(CollectiveKind kind) const;

 private:
  struct Sums {
    int reports = 0;  // that had this kind; at 0 the kind is gone
    double count = 0, timeUs = 0, exposedUs = 0;  // integers, bounded by validation: exact in doubles
    ExactSum bytes = 0;
    ExactSum timedBytes = 0;  // of the entries with both a time and bytes
    double timedUs = 0;
  };
  std::map<CollectiveKind, Sums> kinds_;
  int reports_ = 0;
  std::uint32_t worldSize_ = 1;
};

// The job's: each kind's figures, the mean over the ranks that reported that kind.
std::vector<CollectiveKpis> meanOverRanks(const std::vector<RankKpis>& ranks);

// Every rank's spans in the window: the share of a step's exposed collective time in its first
// collective (by start) and in its last, where the spans hold all of the step's collectives.
class ExposedEndsSums {
 public:
  // Adds a report's spans (sign 1) or takes them out again (-1).
  void add(const StepReport& report, int sign = 1);
  void merge(const ExposedEndsSums& other);
  ExposedEnds ends() const;

 private:
  double firstUs_ = 0, firstOfUs_ = 0, lastUs_ = 0, lastOfUs_ = 0;
  std::map<CollectiveKind, int> firstKinds_, lastKinds_;  // steps in which that kind came first (last)
};

}  // namespace lockstep::kpi::detail
