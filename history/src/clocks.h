#pragma once
// Each node's clock against the recording client's (common/clock.h): measured when a client
// connects to its agent and every minute after, kept per node and time, so that a job's records
// from several nodes are put on one clock (its trace, the app's timeline). Which measurements a
// job's parts look up, and which therefore survive the compactor's thinning, is decided here.
// Private to history/.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "lockstep/history/history.h"
#include "sqlite.h"

namespace lockstep::history::detail {

// A job's nodes' clocks are looked up from a minute before each part's start to a minute after its
// end; every measurement there is kept.
inline constexpr std::int64_t kClockMarginUs = 60'000'000;

class NodeClocks {
 public:
  explicit NodeClocks(sqlite3* db);

  Result<void> record(const std::string& node, const ClockOffset& offset);
  // Each of the job's nodes' offset: the least uncertain while its part ran, else the nearest in time.
  Result<std::map<std::string, ClockOffset, NaturalLess>> of(const JobRecord& job);
  // Outside the recorded jobs' parts on a node (with the margin), keeps the least uncertain
  // measurement of each hour older than `cutoffUs` (Compactor::compact, in its transaction).
  Result<void> thin(std::int64_t cutoffUs);

 private:
  Result<std::optional<ClockOffset>> of(const JobRecord& job, const PartRecord& part);

  Prepared insert_, during_, before_, after_, thin_;
};

}  // namespace lockstep::history::detail
