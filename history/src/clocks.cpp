// Each node's clock against the recording client's (common/clock.h): measured when a client
// connects to its agent and every minute after, kept per node and time, so that a job's records
// from several nodes are put on one clock (its trace, the app's timeline).

#include <limits>

#include "lockstep/history/history.h"
#include "sqlite.h"
#include "tables.h"

namespace lockstep::history {

using detail::Statement;


Result<void> History::recordClock(const std::string& node, const ClockOffset& offset) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), R"sql(
    INSERT OR REPLACE INTO node_clocks (node, time_us, offset_us, uncertainty_us) VALUES (?1, ?2, ?3, ?4))sql"));
  return stmt.bind(1, node).bind(2, offset.measuredUnixUs).bind(3, offset.offsetUs).bind(4, offset.uncertaintyUs).run();
}

Result<std::map<std::string, ClockOffset, NaturalLess>> History::clocks(const JobRecord& job) const {
  // While it ran (a minute either side) the least uncertain; failing that, the nearest in time, before or after.
  LOCKSTEP_ASSIGN_OR_RETURN(auto during, Statement::prepare(db_.get(), R"sql(
    SELECT time_us, offset_us, uncertainty_us FROM node_clocks WHERE node = ?1 AND time_us BETWEEN ?2 AND ?3
    ORDER BY uncertainty_us LIMIT 1)sql"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto before, Statement::prepare(db_.get(), R"sql(
    SELECT time_us, offset_us, uncertainty_us FROM node_clocks WHERE node = ?1 AND time_us < ?2
    ORDER BY time_us DESC LIMIT 1)sql"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto after, Statement::prepare(db_.get(), R"sql(
    SELECT time_us, offset_us, uncertainty_us FROM node_clocks WHERE node = ?1 AND time_us > ?2
    ORDER BY time_us LIMIT 1)sql"));
  const auto first = [](Statement& stmt) -> Result<std::optional<ClockOffset>> {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    std::optional<ClockOffset> out;
    if (row) out = ClockOffset{stmt.i64(1), stmt.i64(2), stmt.i64(0)};
    LOCKSTEP_TRY(stmt.reset());
    return out;
  };
  std::map<std::string, ClockOffset, NaturalLess> out;
  for (const auto& part : job.parts) {
    // The part's own time on its node (with the margin), as History::compact keeps it.
    const std::int64_t from = (part.startedUnixUs > 0 ? part.startedUnixUs : job.startedUnixUs) - detail::kClockMarginUs;
    const std::int64_t to = part.endedUnixUs > 0 ? part.endedUnixUs + detail::kClockMarginUs : std::numeric_limits<std::int64_t>::max();
    during.bind(1, part.node).bind(2, from).bind(3, to);
    LOCKSTEP_ASSIGN_OR_RETURN(auto best, first(during));
    if (!best) {
      before.bind(1, part.node).bind(2, from);
      after.bind(1, part.node).bind(2, to);
      LOCKSTEP_ASSIGN_OR_RETURN(const auto earlier, first(before));
      LOCKSTEP_ASSIGN_OR_RETURN(const auto later, first(after));
      best = !later || (earlier && from - earlier->measuredUnixUs <= later->measuredUnixUs - to) ? earlier : later;
    }
    if (best) out[part.node] = *best;
  }
  return out;
}

}  // namespace lockstep::history
