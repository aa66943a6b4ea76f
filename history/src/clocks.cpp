// Each node's clock offsets in the history: recorded, looked up for a job, thinned.

#include "clocks.h"

#include <limits>

namespace lockstep::history::detail {

namespace {

constexpr std::int64_t kClockBucketUs = 3'600'000'000;  // an hour: the thinning keeps one of each

// The first row of (time_us, offset_us, uncertainty_us), if any.
Result<std::optional<ClockOffset>> first(Prepared& query, const std::string& node, std::int64_t timeUs,
                                         std::optional<std::int64_t> toUs = std::nullopt) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, query.use());
  stmt->bind(1, node).bind(2, timeUs);
  if (toUs) stmt->bind(3, *toUs);
  LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt->step());
  if (!row) return std::optional<ClockOffset>();
  return std::optional(ClockOffset{stmt->i64(1), stmt->i64(2), stmt->i64(0)});
}

}  // namespace

NodeClocks::NodeClocks(sqlite3* db)
    : insert_(db, "INSERT OR REPLACE INTO node_clocks (node, time_us, offset_us, uncertainty_us) VALUES (?1, ?2, ?3, ?4)"),
      during_(db, R"sql(
        SELECT time_us, offset_us, uncertainty_us FROM node_clocks WHERE node = ?1 AND time_us BETWEEN ?2 AND ?3
        ORDER BY uncertainty_us LIMIT 1)sql"),
      before_(db, R"sql(
        SELECT time_us, offset_us, uncertainty_us FROM node_clocks WHERE node = ?1 AND time_us < ?2
        ORDER BY time_us DESC LIMIT 1)sql"),
      after_(db, R"sql(
        SELECT time_us, offset_us, uncertainty_us FROM node_clocks WHERE node = ?1 AND time_us > ?2
        ORDER BY time_us LIMIT 1)sql"),
      // (A range of the key, not time_us / hour, so that SQLite looks up the hour rather than scan.)
      thin_(db, R"sql(
        DELETE FROM node_clocks WHERE time_us < ?1 AND EXISTS (
          SELECT 1 FROM node_clocks k WHERE k.node = node_clocks.node
            AND k.time_us >= (node_clocks.time_us / ?2) * ?2 AND k.time_us < (node_clocks.time_us / ?2) * ?2 + ?2
            AND (k.uncertainty_us < node_clocks.uncertainty_us
                 OR (k.uncertainty_us = node_clocks.uncertainty_us AND k.time_us < node_clocks.time_us)))
          AND NOT EXISTS (SELECT 1 FROM job_parts p WHERE p.node = node_clocks.node AND p.started_us > 0
            AND node_clocks.time_us >= p.started_us - ?3 AND (p.ended_us = 0 OR node_clocks.time_us <= p.ended_us + ?3)))sql") {}

Result<void> NodeClocks::record(const std::string& node, const ClockOffset& offset) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, insert_.use());
  return stmt->bind(1, node).bind(2, offset.measuredUnixUs).bind(3, offset.offsetUs).bind(4, offset.uncertaintyUs).run();
}

Result<std::map<std::string, ClockOffset, NaturalLess>> NodeClocks::of(const JobRecord& job) {
  std::map<std::string, ClockOffset, NaturalLess> out;
  for (const auto& part : job.parts) {
    LOCKSTEP_ASSIGN_OR_RETURN(const auto best, of(job, part));
    if (best) out[part.node] = *best;
  }
  return out;
}

// While the part ran on its node (with the margin, as thin() keeps it) the least uncertain;
// failing that, the nearest in time, before or after.
Result<std::optional<ClockOffset>> NodeClocks::of(const JobRecord& job, const PartRecord& part) {
  const std::int64_t from = (part.startedUnixUs > 0 ? part.startedUnixUs : job.startedUnixUs) - kClockMarginUs;
  const std::int64_t to = part.endedUnixUs > 0 ? part.endedUnixUs + kClockMarginUs : std::numeric_limits<std::int64_t>::max();
  LOCKSTEP_ASSIGN_OR_RETURN(auto best, first(during_, part.node, from, to));
  if (best) return best;
  LOCKSTEP_ASSIGN_OR_RETURN(const auto earlier, first(before_, part.node, from));
  LOCKSTEP_ASSIGN_OR_RETURN(const auto later, first(after_, part.node, to));
  return !later || (earlier && from - earlier->measuredUnixUs <= later->measuredUnixUs - to) ? earlier : later;
}

Result<void> NodeClocks::thin(std::int64_t cutoffUs) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, thin_.use());
  return stmt->bind(1, cutoffUs).bind(2, kClockBucketUs).bind(3, kClockMarginUs).run();
}

}  // namespace lockstep::history::detail
