#include "schema.h"

namespace lockstep::history::detail {

const std::array<const char*, kSchemaVersion> kMigrations = {
    R"sql(
CREATE TABLE nodes (
  node TEXT PRIMARY KEY, host TEXT NOT NULL, cpu_cores INTEGER NOT NULL, memory_bytes INTEGER NOT NULL,
  gpus_json TEXT NOT NULL, agent_version TEXT NOT NULL, seen_us INTEGER NOT NULL);
CREATE TABLE jobs (
  job_id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_json TEXT NOT NULL, world_size INTEGER NOT NULL,
  recorded_us INTEGER NOT NULL, step_reports INTEGER NOT NULL DEFAULT 0,
  kpis_stale INTEGER NOT NULL DEFAULT 1);
CREATE TABLE job_parts (
  job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, node TEXT NOT NULL, state INTEGER NOT NULL,
  started_us INTEGER NOT NULL, ended_us INTEGER NOT NULL, message TEXT NOT NULL,
  PRIMARY KEY (job_id, node)) WITHOUT ROWID;
CREATE TABLE events (
  job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, node TEXT NOT NULL, time_us INTEGER NOT NULL,
  kind INTEGER NOT NULL, rank INTEGER NOT NULL, exit_code INTEGER, signal INTEGER, step INTEGER,
  message TEXT NOT NULL, log_tail TEXT NOT NULL,
  PRIMARY KEY (job_id, node, time_us, kind, rank)) WITHOUT ROWID;
CREATE TABLE steps (
  job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
  step INTEGER NOT NULL, node TEXT NOT NULL, world_size INTEGER NOT NULL, epoch INTEGER NOT NULL,
  samples INTEGER NOT NULL, loss REAL, global_loss REAL, data_us INTEGER NOT NULL, compute_us INTEGER NOT NULL,
  exposed_us INTEGER NOT NULL, allreduce_us INTEGER NOT NULL, bytes_reduced INTEGER NOT NULL,
  step_us INTEGER NOT NULL, time_us INTEGER NOT NULL, lr REAL NOT NULL,
  PRIMARY KEY (job_id, attempt, rank, step)) WITHOUT ROWID;
CREATE INDEX steps_by_time ON steps (job_id, time_us);
CREATE TABLE gpu_samples (
  job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, node TEXT NOT NULL, gpu INTEGER NOT NULL,
  time_us INTEGER NOT NULL, span_us INTEGER NOT NULL, utilization REAL, memory_bytes INTEGER,
  power_mw INTEGER, energy_mj INTEGER, temperature_c INTEGER, sm_clock_mhz INTEGER,
  PRIMARY KEY (job_id, node, gpu, time_us)) WITHOUT ROWID;
CREATE INDEX gpu_samples_by_time ON gpu_samples (job_id, time_us);
CREATE TABLE process_samples (
  job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, node TEXT NOT NULL, rank INTEGER NOT NULL,
  time_us INTEGER NOT NULL, span_us INTEGER NOT NULL, pid INTEGER NOT NULL, cpu_pct REAL, rss_bytes INTEGER,
  PRIMARY KEY (job_id, rank, time_us)) WITHOUT ROWID;
CREATE INDEX process_samples_by_time ON process_samples (job_id, time_us);
CREATE TABLE final_kpis (
  job_id TEXT PRIMARY KEY REFERENCES jobs ON DELETE CASCADE, computed_us INTEGER NOT NULL,
  world_size INTEGER NOT NULL, attempts INTEGER NOT NULL, step INTEGER NOT NULL, total_steps INTEGER NOT NULL,
  elapsed_s REAL NOT NULL, samples_per_s REAL, comm_overhead REAL, scaling_efficiency REAL,
  scaling_basis INTEGER NOT NULL, gpu_utilization_pct REAL, load_imbalance REAL, slowest_rank INTEGER,
  slowest_cause INTEGER NOT NULL, last_global_loss REAL, smoothed_loss REAL, time_to_convergence_s REAL,
  energy_kwh REAL, gpu_hours REAL, core_hours REAL, cost REAL, cost_complete INTEGER NOT NULL,
  missing_json TEXT NOT NULL);
)sql",
    // 2: a step's split may be unknown (a program that reports steps without timing them), and
    // steps count tokens. SQLite cannot drop NOT NULL in place: the table is copied.
    R"sql(
CREATE TABLE steps_v2 (
  job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
  step INTEGER NOT NULL, node TEXT NOT NULL, world_size INTEGER NOT NULL, epoch INTEGER NOT NULL,
  samples INTEGER NOT NULL, loss REAL, global_loss REAL, data_us INTEGER, compute_us INTEGER,
  exposed_us INTEGER, allreduce_us INTEGER, bytes_reduced INTEGER,
  step_us INTEGER NOT NULL, time_us INTEGER NOT NULL, lr REAL NOT NULL, tokens INTEGER,
  PRIMARY KEY (job_id, attempt, rank, step)) WITHOUT ROWID;
INSERT INTO steps_v2 (job_id, attempt, rank, step, node, world_size, epoch, samples, loss, global_loss, data_us,
                      compute_us, exposed_us, allreduce_us, bytes_reduced, step_us, time_us, lr)
  SELECT job_id, attempt, rank, step, node, world_size, epoch, samples, loss, global_loss, data_us, compute_us,
         exposed_us, allreduce_us, bytes_reduced, step_us, time_us, lr FROM steps;
DROP TABLE steps;
ALTER TABLE steps_v2 RENAME TO steps;
CREATE INDEX steps_by_time ON steps (job_id, time_us);
-- The samples and tokens every report counted: a job's mean throughput without its batch size.
ALTER TABLE final_kpis ADD COLUMN total_samples INTEGER;
ALTER TABLE final_kpis ADD COLUMN total_tokens INTEGER;
UPDATE jobs SET kpis_stale = 1;
)sql",
    // 3: final_kpis is written and read by column name (final_kpis.cpp); the throughput it keeps
    // is the one at the end (the last 10 s), named so, beside the whole job's samples.
    R"sql(
ALTER TABLE final_kpis RENAME COLUMN samples_per_s TO end_samples_per_s;
)sql",
    // 4: the all-reduce's bus bandwidth (a cluster's measured peak, for the diagnosis of exposed
    // communication) and the cost of waiting; every job's final KPIs are computed again.
    R"sql(
ALTER TABLE final_kpis ADD COLUMN bus_bandwidth REAL;
ALTER TABLE final_kpis ADD COLUMN waiting_share REAL;
ALTER TABLE final_kpis ADD COLUMN straggler_share REAL;
ALTER TABLE final_kpis ADD COLUMN waiting_cost REAL;
ALTER TABLE final_kpis ADD COLUMN straggler_cost REAL;
ALTER TABLE final_kpis ADD COLUMN waiting_gpu_hours REAL;
ALTER TABLE final_kpis ADD COLUMN straggler_gpu_hours REAL;
UPDATE jobs SET kpis_stale = 1;
)sql",
    // 5: the mean rank's step, which a projection to other rank counts starts from; every job's
    // final KPIs are computed again.
    R"sql(
ALTER TABLE final_kpis ADD COLUMN bytes_reduced_per_step REAL;
ALTER TABLE final_kpis ADD COLUMN samples_per_rank_step REAL;
ALTER TABLE final_kpis ADD COLUMN mean_busy_us REAL;
ALTER TABLE final_kpis ADD COLUMN mean_exposed_us REAL;
ALTER TABLE final_kpis ADD COLUMN mean_step_us REAL;
UPDATE jobs SET kpis_stale = 1;
)sql",
    // 6 (issue 31): an event of no rank keeps its rank NULL, as every record's unknown field is
    // kept (record_rows.h), and is stored once by a unique index; the nodes' network interfaces,
    // kept while a recorded job runs on them (span_us: 0 raw, else the bucket whose newest
    // counters the row is, History::compact).
    R"sql(
CREATE TABLE events_v6 (
  job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, node TEXT NOT NULL, time_us INTEGER NOT NULL,
  kind INTEGER NOT NULL, rank INTEGER, exit_code INTEGER, signal INTEGER, step INTEGER,
  message TEXT NOT NULL, log_tail TEXT NOT NULL);
INSERT INTO events_v6 SELECT job_id, node, time_us, kind, nullif(rank, -1), exit_code, signal, step, message, log_tail
  FROM events;
DROP TABLE events;
ALTER TABLE events_v6 RENAME TO events;
CREATE UNIQUE INDEX events_once ON events (job_id, node, time_us, kind, ifnull(rank, -1));
CREATE TABLE IF NOT EXISTS net_samples (
  node TEXT NOT NULL, interface TEXT NOT NULL, time_us INTEGER NOT NULL, span_us INTEGER NOT NULL,
  rx_bytes INTEGER NOT NULL, tx_bytes INTEGER NOT NULL, rx_packets INTEGER NOT NULL, tx_packets INTEGER NOT NULL,
  rx_errors INTEGER, tx_errors INTEGER, rx_drops INTEGER, tx_drops INTEGER, link_bits_per_second INTEGER,
  PRIMARY KEY (node, interface, time_us)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS net_samples_by_time ON net_samples (node, time_us);
CREATE INDEX IF NOT EXISTS job_parts_by_node ON job_parts (node);
)sql",
    // 7 (issue 33): who each part ran as.
    R"sql(
ALTER TABLE job_parts ADD COLUMN owner TEXT NOT NULL DEFAULT '';
)sql",
    // 8 (issue 35): each node's clock against the recording client's, measured when it connected
    // and every minute after (clocks.cpp), to line up its records with other nodes'.
    R"sql(
CREATE TABLE IF NOT EXISTS node_clocks (
  node TEXT NOT NULL, time_us INTEGER NOT NULL, offset_us INTEGER NOT NULL, uncertainty_us INTEGER NOT NULL,
  PRIMARY KEY (node, time_us)) WITHOUT ROWID;
)sql",
    // 9 (issue 35): the optimizer's part of a step's compute, and the phases a rank's program
    // named (checkpoint, eval), which the timeline draws.
    R"sql(
ALTER TABLE steps ADD COLUMN optimizer_us INTEGER;
CREATE TABLE IF NOT EXISTS phases (
  job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, node TEXT NOT NULL, attempt INTEGER NOT NULL,
  rank INTEGER NOT NULL, world_size INTEGER NOT NULL, name TEXT NOT NULL, time_us INTEGER NOT NULL,
  duration_us INTEGER NOT NULL, step INTEGER NOT NULL,
  PRIMARY KEY (job_id, attempt, rank, time_us, name)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS phases_by_time ON phases (job_id, time_us);
)sql",
    // 10 (issue 42): each step's collectives by kind, and the first ones one by one, as JSON arrays
    // (NULL: none).
    R"sql(
ALTER TABLE steps ADD COLUMN collectives TEXT;
ALTER TABLE steps ADD COLUMN collective_spans TEXT;
)sql",
    // 11 (issue 45): what each rank holds of the model's state (a sharded job holds a part), and
    // an asynchronous job's staleness of each gradient.
    R"sql(
ALTER TABLE steps ADD COLUMN param_bytes INTEGER;
ALTER TABLE steps ADD COLUMN grad_bytes INTEGER;
ALTER TABLE steps ADD COLUMN optimizer_state_bytes INTEGER;
ALTER TABLE steps ADD COLUMN staleness INTEGER;
ALTER TABLE final_kpis ADD COLUMN param_bytes_per_rank REAL;
ALTER TABLE final_kpis ADD COLUMN grad_bytes_per_rank REAL;
ALTER TABLE final_kpis ADD COLUMN optimizer_state_bytes_per_rank REAL;
ALTER TABLE final_kpis ADD COLUMN staleness_mean REAL;
ALTER TABLE final_kpis ADD COLUMN staleness_p99 REAL;
)sql",
    // 12 (issue 46): each step's model FLOPs, how they were known, the precision of its math and
    // the peak its agent took it against; the job's model FLOP/s, peak and MFU, and what they came from.
    R"sql(
ALTER TABLE steps ADD COLUMN flops REAL;
ALTER TABLE steps ADD COLUMN flops_basis INTEGER;
ALTER TABLE steps ADD COLUMN precision INTEGER;
ALTER TABLE steps ADD COLUMN peak_flops REAL;
ALTER TABLE final_kpis ADD COLUMN model_flops_per_second REAL;
ALTER TABLE final_kpis ADD COLUMN peak_flops REAL;
ALTER TABLE final_kpis ADD COLUMN model_flops_utilization REAL;
ALTER TABLE final_kpis ADD COLUMN flops_basis TEXT;
ALTER TABLE final_kpis ADD COLUMN peak_basis TEXT;
)sql",
    // 13: the supervisor's verdict on a job once its supervision ended (NULL before, or with no
    // supervisor), which the job reads as over its parts' combined state, as clients show it live.
    R"sql(
ALTER TABLE jobs ADD COLUMN outcome INTEGER;
ALTER TABLE jobs ADD COLUMN outcome_message TEXT;
)sql",
};

}  // namespace lockstep::history::detail

namespace lockstep::history::detail {

namespace {

// Whether the file is a history this build can read, read under the write lock: another connection
// may be creating it at this moment, and its tables and its stamp come in one transaction.
Result<void> checkIsHistory(sqlite3* db) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
  LOCKSTEP_ASSIGN_OR_RETURN(const auto appId, pragmaInt(db, "PRAGMA application_id"));
  LOCKSTEP_ASSIGN_OR_RETURN(const auto version, pragmaInt(db, "PRAGMA user_version"));
  LOCKSTEP_ASSIGN_OR_RETURN(const auto tables, pragmaInt(db, "SELECT count(*) FROM sqlite_schema"));
  if (appId != kApplicationId && (appId != 0 || tables != 0)) {
    return Error{ErrorCode::kFailedPrecondition,
                 "this SQLite file is not a Lockstep history: move it away, or set LOCKSTEP_HISTORY to another path"};
  }
  if (version > kSchemaVersion) {
    return Error{ErrorCode::kFailedPrecondition,
                 "written by a newer Lockstep (schema " + std::to_string(version) + "; this build knows up to " +
                     std::to_string(kSchemaVersion) + "): use a newer Lockstep, or set LOCKSTEP_HISTORY to another path"};
  }
  return tx.commit();
}

}  // namespace

Result<void> migrate(sqlite3* db) {
  LOCKSTEP_TRY(checkIsHistory(db));
  LOCKSTEP_TRY(exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON"));
  for (;;) {
    // Each step under the write lock, from the version read there: another process (or another
    // connection of this one) may have migrated since. An app that opened its history twice at
    // once used to apply a migration twice ("duplicate column name"), and recorded nothing.
    LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
    LOCKSTEP_ASSIGN_OR_RETURN(const auto v, pragmaInt(db, "PRAGMA user_version"));
    if (v >= kSchemaVersion) return tx.commit();
    LOCKSTEP_TRY(exec(db, kMigrations[static_cast<std::size_t>(v)]));
    const std::string stamp = "PRAGMA application_id=" + std::to_string(kApplicationId) +
                              "; PRAGMA user_version=" + std::to_string(v + 1);
    LOCKSTEP_TRY(exec(db, stamp.c_str()));
    LOCKSTEP_TRY(tx.commit());
  }
}

}  // namespace lockstep::history::detail
