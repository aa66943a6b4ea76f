// Downsampling the history's samples older than its raw horizon (docs/history.md).

#include "lockstep/history/history.h"
#include "sqlite.h"
#include "tables.h"

namespace lockstep::history {

using detail::pragmaInt;
using detail::Statement;
using detail::Transaction;

namespace {
constexpr std::int64_t kClockBucketUs = 3'600'000'000;  // an hour
}  // namespace

Result<CompactStats> History::compact(std::int64_t nowUnixUs) {
  sqlite3* db = db_.get();
  const std::int64_t bucket = options_.bucketSeconds * 1'000'000;
  // Whole buckets only, so a bucket is written once and later raw rows never fall into it.
  const std::int64_t cutoff = (nowUnixUs - options_.rawHorizonSeconds * 1'000'000) / bucket * bucket;
  CompactStats stats;
  LOCKSTEP_ASSIGN_OR_RETURN(stats.gpuRowsBefore, pragmaInt(db, "SELECT count(*) FROM gpu_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(stats.processRowsBefore, pragmaInt(db, "SELECT count(*) FROM process_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(stats.netRowsBefore, pragmaInt(db, "SELECT count(*) FROM net_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
  // Per bucket: mean utilization, power, CPU % and clock; peak memory, RSS and temperature; the
  // last energy counter reading (energy is a difference of readings, so it survives intact). A
  // network interface's counters are totals too: each bucket keeps its newest raw row, whose
  // differences give the same bytes, and a rate per bucket.
  const char* statements[] = {
      R"sql(CREATE TEMP TABLE gpu_buckets AS
        SELECT job_id, node, gpu, (time_us / ?1) * ?1 AS t, ?1 AS span, avg(utilization) AS u, max(memory_bytes) AS m,
               CAST(avg(power_mw) AS INTEGER) AS p, max(energy_mj) AS e, max(temperature_c) AS c,
               CAST(avg(sm_clock_mhz) AS INTEGER) AS s
        FROM gpu_samples WHERE span_us = 0 AND time_us < ?2 GROUP BY job_id, node, gpu, time_us / ?1)sql",
      "DELETE FROM gpu_samples WHERE span_us = 0 AND time_us < ?2",
      "INSERT OR REPLACE INTO gpu_samples SELECT * FROM gpu_buckets",
      "DROP TABLE gpu_buckets",
      R"sql(CREATE TEMP TABLE process_buckets AS
        SELECT job_id, node, rank, (time_us / ?1) * ?1 AS t, ?1 AS span, max(pid) AS pid, avg(cpu_pct) AS c,
               max(rss_bytes) AS r
        FROM process_samples WHERE span_us = 0 AND time_us < ?2 GROUP BY job_id, rank, time_us / ?1)sql",
      "DELETE FROM process_samples WHERE span_us = 0 AND time_us < ?2",
      "INSERT OR REPLACE INTO process_samples SELECT * FROM process_buckets",
      "DROP TABLE process_buckets",
      R"sql(DELETE FROM net_samples WHERE span_us = 0 AND time_us < ?2 AND EXISTS (
        SELECT 1 FROM net_samples n WHERE n.node = net_samples.node AND n.interface = net_samples.interface
          AND n.time_us > net_samples.time_us AND n.time_us < (net_samples.time_us / ?1) * ?1 + ?1))sql",
      "UPDATE net_samples SET span_us = ?1 WHERE span_us = 0 AND time_us < ?2",
      // A node's clock, measured every minute while a client watches: outside the recorded jobs'
      // parts on it (and the minute either side History::clocks looks at), the least uncertain
      // measurement of each hour is kept.
      // (A range of the key, not time_us / hour, so that SQLite looks up the hour rather than scan.)
      R"sql(DELETE FROM node_clocks WHERE time_us < ?2 AND EXISTS (
        SELECT 1 FROM node_clocks k WHERE k.node = node_clocks.node
          AND k.time_us >= (node_clocks.time_us / ?3) * ?3 AND k.time_us < (node_clocks.time_us / ?3) * ?3 + ?3
          AND (k.uncertainty_us < node_clocks.uncertainty_us
               OR (k.uncertainty_us = node_clocks.uncertainty_us AND k.time_us < node_clocks.time_us)))
        AND NOT EXISTS (SELECT 1 FROM job_parts p WHERE p.node = node_clocks.node AND p.started_us > 0
          AND node_clocks.time_us >= p.started_us - ?4 AND (p.ended_us = 0 OR node_clocks.time_us <= p.ended_us + ?4)))sql",
  };
  for (const char* sql : statements) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, sql));
    if (std::string_view(sql).find("?1") != std::string_view::npos) stmt.bind(1, bucket);
    if (std::string_view(sql).find("?2") != std::string_view::npos) stmt.bind(2, cutoff);
    if (std::string_view(sql).find("?3") != std::string_view::npos) stmt.bind(3, kClockBucketUs).bind(4, detail::kClockMarginUs);
    LOCKSTEP_TRY(stmt.run());
  }
  LOCKSTEP_TRY(tx.commit());
  LOCKSTEP_ASSIGN_OR_RETURN(stats.gpuRowsAfter, pragmaInt(db, "SELECT count(*) FROM gpu_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(stats.processRowsAfter, pragmaInt(db, "SELECT count(*) FROM process_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(stats.netRowsAfter, pragmaInt(db, "SELECT count(*) FROM net_samples"));
  return stats;
}

}  // namespace lockstep::history
