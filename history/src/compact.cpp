// Downsampling the history's samples older than its raw horizon (docs/history.md). Its statements
// are prepared for each run (once an hour): they go through temporary tables made and dropped.

#include "compact.h"

#include <string_view>

#include "sqlite.h"

namespace lockstep::history::detail {

namespace {

// Per bucket (?1) of the rows older than ?2: mean utilization, power, CPU % and clock; peak memory,
// RSS and temperature; the last energy counter reading (energy is a difference of readings, so it
// survives intact). A network interface's counters are totals too: each bucket keeps its newest raw
// row, whose differences give the same bytes, and a rate per bucket.
constexpr const char* kDownsample[] = {
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
};

}  // namespace

Compactor::Compactor(sqlite3* db, Options options, NodeClocks& clocks) : db_(db), options_(options), clocks_(clocks) {}

Result<CompactStats> Compactor::compact(std::int64_t nowUnixUs) {
  const std::int64_t bucket = options_.bucketSeconds * 1'000'000;
  // Whole buckets only, so a bucket is written once and later raw rows never fall into it.
  const std::int64_t cutoff = (nowUnixUs - options_.rawHorizonSeconds * 1'000'000) / bucket * bucket;
  CompactStats stats;
  LOCKSTEP_TRY(count(stats.gpuRowsBefore, stats.processRowsBefore, stats.netRowsBefore));
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db_));
  LOCKSTEP_TRY(downsample(bucket, cutoff));
  LOCKSTEP_TRY(clocks_.thin(cutoff));
  LOCKSTEP_TRY(tx.commit());
  LOCKSTEP_TRY(count(stats.gpuRowsAfter, stats.processRowsAfter, stats.netRowsAfter));
  return stats;
}

Result<void> Compactor::downsample(std::int64_t bucketUs, std::int64_t cutoffUs) {
  for (const char* sql : kDownsample) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_, sql));
    if (std::string_view(sql).find("?1") != std::string_view::npos) stmt.bind(1, bucketUs);
    if (std::string_view(sql).find("?2") != std::string_view::npos) stmt.bind(2, cutoffUs);
    LOCKSTEP_TRY(stmt.run());
  }
  return {};
}

Result<void> Compactor::count(std::uint64_t& gpu, std::uint64_t& process, std::uint64_t& net) {
  LOCKSTEP_ASSIGN_OR_RETURN(gpu, pragmaInt(db_, "SELECT count(*) FROM gpu_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(process, pragmaInt(db_, "SELECT count(*) FROM process_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(net, pragmaInt(db_, "SELECT count(*) FROM net_samples"));
  return {};
}

}  // namespace lockstep::history::detail
