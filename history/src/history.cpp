#include "lockstep/history/history.h"

#include <sqlite3.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"
#include "lockstep/protocol/codec.h"
#include "final_kpis.h"
#include "schema.h"
#include "sqlite.h"

namespace lockstep::history {

using detail::kApplicationId;
using detail::kMigrations;
using detail::kStepColumns;
using detail::exec;
using detail::pragmaInt;
using detail::sqliteError;
using detail::Statement;
using detail::Transaction;

namespace {

std::string gpusToJson(const std::vector<GpuInfo>& gpus) {
  auto array = nlohmann::json::array();
  for (const auto& g : gpus) {
    array.push_back({{"index", g.index}, {"name", g.name}, {"uuid", g.uuid}, {"memory_total_bytes", g.memoryTotalBytes}});
  }
  return array.dump();
}

std::vector<GpuInfo> gpusFromJson(const std::string& text) {
  std::vector<GpuInfo> gpus;
  const auto array = nlohmann::json::parse(text, nullptr, false);
  if (!array.is_array()) return gpus;
  for (const auto& g : array) {
    gpus.push_back(GpuInfo{g.value("index", 0u), g.value("name", ""), g.value("uuid", ""),
                           g.value("memory_total_bytes", std::uint64_t{0})});
  }
  return gpus;
}

std::string likePattern(std::string_view text) {
  std::string out = "%";
  for (char c : text) {
    if (c == '%' || c == '_' || c == '\\') out += '\\';
    out += c;
  }
  return out + "%";
}

}  // namespace

void History::Closer::operator()(sqlite3* db) const { sqlite3_close_v2(db); }

History::History(sqlite3* db, std::string path, Options options) : db_(db), path_(std::move(path)), options_(options) {}
History::History(History&&) noexcept = default;
History& History::operator=(History&&) noexcept = default;
History::~History() = default;

std::string History::defaultPath() {
  if (const char* explicitPath = std::getenv("LOCKSTEP_HISTORY"); explicitPath && *explicitPath) return explicitPath;
  std::filesystem::path base;
  if (const char* xdg = std::getenv("XDG_DATA_HOME"); xdg && *xdg) {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    base = std::filesystem::path(home) / ".local" / "share";
  } else {
    base = ".";
  }
  return (base / "lockstep" / "history.db").string();
}

Result<History> History::open(const std::string& path, Options options) {
  if (options.rawHorizonSeconds < 0 || options.bucketSeconds <= 0) {
    return invalidArgument("history: the raw horizon must be >= 0 and the bucket > 0 seconds");
  }
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) LOCKSTEP_TRY(makeDirectories(dir.string(), 0700));
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  History history(raw, path, options);
  if (rc != SQLITE_OK) return sqliteError(raw, "opening history " + path);
  sqlite3_busy_timeout(raw, 5000);
  sqlite3_extended_result_codes(raw, 0);
  if (auto migrated = history.migrate(); !migrated) return migrated.error().withContext("history " + path);
  return history;
}

Result<void> History::migrate() {
  sqlite3* db = db_.get();
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
  LOCKSTEP_TRY(exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON"));
  for (auto v = version; v < kSchemaVersion; ++v) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
    LOCKSTEP_TRY(exec(db, kMigrations[static_cast<std::size_t>(v)]));
    const std::string stamp = "PRAGMA application_id=" + std::to_string(kApplicationId) +
                              "; PRAGMA user_version=" + std::to_string(v + 1);
    LOCKSTEP_TRY(exec(db, stamp.c_str()));
    LOCKSTEP_TRY(tx.commit());
  }
  return {};
}

// ---- writing ----

Result<void> History::recordNode(const NodeHello& hello) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), R"sql(
    INSERT INTO nodes VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
    ON CONFLICT (node) DO UPDATE SET host = ?2, cpu_cores = ?3, memory_bytes = ?4, gpus_json = ?5,
      agent_version = ?6, seen_us = ?7)sql"));
  const std::int64_t now = unixMicrosNow();
  stmt.bind(1, hello.nodeName).bind(2, hello.host).bind(3, hello.cpuCores).bind(4, hello.memoryTotalBytes);
  stmt.bind(5, gpusToJson(hello.gpus)).bind(6, hello.agentVersion).bind(7, now);
  return stmt.run();
}

Result<bool> History::recordJob(const std::string& node, const JobStatus& status) {
  sqlite3* db = db_.get();
  const JobSpec& spec = status.spec;
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
  LOCKSTEP_ASSIGN_OR_RETURN(auto stored, Statement::prepare(db, R"sql(
    SELECT coalesce(json_extract(spec_json, '$.attempt'), 0) FROM jobs WHERE job_id = ?1)sql"));
  stored.bind(1, spec.jobId);
  LOCKSTEP_ASSIGN_OR_RETURN(const bool known, stored.step());
  const std::int64_t storedAttempt = known ? stored.i64(0) : 0;
  if (known && spec.attempt < storedAttempt) return false;  // a part of an attempt a restart replaced
  bool changed = false;
  if (!known) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto job, Statement::prepare(db, R"sql(
      INSERT INTO jobs (job_id, name, spec_json, world_size, recorded_us) VALUES (?1, ?2, ?3, ?4, ?5))sql"));
    job.bind(1, spec.jobId).bind(2, spec.name).bind(3, jobSpecToJson(spec)).bind(4, spec.worldSize);
    LOCKSTEP_TRY(job.bind(5, unixMicrosNow()).run());
    changed = true;
  } else if (spec.attempt > storedAttempt) {
    // A restart: the job is now this attempt's spec and parts (its reports keep their attempts).
    LOCKSTEP_ASSIGN_OR_RETURN(auto job, Statement::prepare(db, R"sql(
      UPDATE jobs SET spec_json = ?2, world_size = ?3, kpis_stale = 1 WHERE job_id = ?1)sql"));
    LOCKSTEP_TRY(job.bind(1, spec.jobId).bind(2, jobSpecToJson(spec)).bind(3, spec.worldSize).run());
    LOCKSTEP_ASSIGN_OR_RETURN(auto parts, Statement::prepare(db, "DELETE FROM job_parts WHERE job_id = ?1"));
    LOCKSTEP_TRY(parts.bind(1, spec.jobId).run());
    changed = true;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto part, Statement::prepare(db, R"sql(
    INSERT INTO job_parts VALUES (?1, ?2, ?3, ?4, ?5, ?6)
    ON CONFLICT (job_id, node) DO UPDATE SET state = ?3, started_us = ?4, ended_us = ?5, message = ?6
      WHERE state != ?3 OR started_us != ?4 OR ended_us != ?5 OR message != ?6)sql"));
  part.bind(1, spec.jobId).bind(2, node).bind(3, static_cast<std::int64_t>(status.state));
  part.bind(4, status.startedUnixUs).bind(5, status.endedUnixUs).bind(6, status.message);
  LOCKSTEP_TRY(part.step());
  if (sqlite3_changes(db) > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stale, Statement::prepare(db, "UPDATE jobs SET kpis_stale = 1 WHERE job_id = ?1"));
    LOCKSTEP_TRY(stale.bind(1, spec.jobId).run());
    changed = true;
  }
  LOCKSTEP_TRY(tx.commit());
  return changed;
}

Result<void> History::recordMessages(std::span<const StreamMessage> messages) {
  if (messages.empty()) return {};
  sqlite3* db = db_.get();
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
  LOCKSTEP_ASSIGN_OR_RETURN(auto known, Statement::prepare(db, "SELECT 1 FROM jobs WHERE job_id = ?1"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto step, Statement::prepare(db, std::string("INSERT OR IGNORE INTO steps (") + kStepColumns +
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto gpu, Statement::prepare(db, R"sql(
    INSERT OR IGNORE INTO gpu_samples VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?7, ?8, ?9, ?10))sql"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto process, Statement::prepare(db, R"sql(
    INSERT OR IGNORE INTO process_samples VALUES (?1, ?2, ?3, ?4, 0, ?5, ?6, ?7))sql"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto event, Statement::prepare(db, R"sql(
    INSERT OR IGNORE INTO events VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10))sql"));

  std::map<std::string, bool, std::less<>> isKnown;
  std::map<std::string, std::int64_t, std::less<>> newSteps;
  std::set<std::string, std::less<>> touched;
  for (const StreamMessage& m : messages) {
    const std::string& jobId = jobOf(m.payload);
    if (jobId.empty()) continue;  // a node's own figures: an idle GPU's sample, its network
    auto [it, fresh] = isKnown.try_emplace(jobId, false);
    if (fresh) {
      known.bind(1, jobId);
      LOCKSTEP_ASSIGN_OR_RETURN(it->second, known.step());
      LOCKSTEP_TRY(known.reset());
    }
    if (!it->second) continue;
    Statement* insert = nullptr;
    if (const auto* r = std::get_if<StepReport>(&m.payload)) {
      step.bind(1, r->jobId).bind(2, r->attempt).bind(3, r->rank).bind(4, r->step).bind(5, m.node);
      step.bind(6, r->worldSize).bind(7, r->epoch).bind(8, r->samples);
      // NaN is stored as NULL by SQLite: a diverged loss reads back as unknown, never as a number.
      step.bind(9, static_cast<double>(r->loss));
      if (r->globalLoss) step.bind(10, static_cast<double>(*r->globalLoss)); else step.bindNull(10);
      step.bind(11, r->dataTimeUs).bind(12, r->computeTimeUs).bind(13, r->exposedCommTimeUs);
      step.bind(14, r->allreduceTimeUs).bind(15, r->bytesReduced).bind(16, r->stepTimeUs);
      step.bind(17, r->timeUnixUs).bind(18, r->lr).bind(19, r->tokens);
      insert = &step;
    } else if (const auto* g = std::get_if<GpuSample>(&m.payload)) {
      gpu.bind(1, g->jobId).bind(2, g->node.empty() ? m.node : g->node).bind(3, g->gpuIndex).bind(4, g->timeUnixUs);
      if (g->utilizationPct) gpu.bind(5, static_cast<double>(*g->utilizationPct)); else gpu.bindNull(5);
      gpu.bind(6, g->memoryUsedBytes).bind(7, g->powerMilliwatts).bind(8, g->energyMillijoules);
      gpu.bind(9, g->temperatureC).bind(10, g->smClockMhz);
      insert = &gpu;
    } else if (const auto* p = std::get_if<ProcessSample>(&m.payload)) {
      process.bind(1, p->jobId).bind(2, m.node).bind(3, p->rank).bind(4, p->timeUnixUs).bind(5, p->pid);
      if (p->cpuPct) process.bind(6, static_cast<double>(*p->cpuPct)); else process.bindNull(6);
      process.bind(7, p->rssBytes);
      insert = &process;
    } else if (const auto* e = std::get_if<JobEvent>(&m.payload)) {
      event.bind(1, e->jobId).bind(2, m.node).bind(3, e->timeUnixUs).bind(4, static_cast<std::int64_t>(e->kind));
      event.bind(5, e->rank ? static_cast<std::int64_t>(*e->rank) : std::int64_t{-1});
      event.bind(6, e->exitCode).bind(7, e->signal).bind(8, e->step).bind(9, e->message).bind(10, e->logTail);
      insert = &event;
    }
    LOCKSTEP_TRY(insert->step());
    const int inserted = sqlite3_changes(db);
    LOCKSTEP_TRY(insert->reset());
    if (inserted == 0) continue;  // replayed: stored already
    touched.insert(jobId);
    if (insert == &step) ++newSteps[jobId];
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto update, Statement::prepare(db, R"sql(
    UPDATE jobs SET kpis_stale = 1, step_reports = step_reports + ?2 WHERE job_id = ?1)sql"));
  for (const auto& jobId : touched) {
    auto n = newSteps.find(jobId);
    LOCKSTEP_TRY(update.bind(1, jobId).bind(2, n == newSteps.end() ? std::int64_t{0} : n->second).run());
  }
  return tx.commit();
}

Result<std::vector<std::string>> History::refreshFinalKpis() {
  sqlite3* db = db_.get();
  std::vector<std::string> stale;
  {
    // Only jobs whose parts all ended: a running job is written to all the time, and is computed
    // once it ends.
    LOCKSTEP_ASSIGN_OR_RETURN(auto query, Statement::prepare(db, R"sql(
      SELECT job_id FROM jobs WHERE kpis_stale = 1 AND NOT EXISTS (
        SELECT 1 FROM job_parts p WHERE p.job_id = jobs.job_id AND p.state IN (?1, ?2)))sql"));
    query.bind(1, static_cast<std::int64_t>(JobState::kStarting)).bind(2, static_cast<std::int64_t>(JobState::kRunning));
    for (;;) {
      LOCKSTEP_ASSIGN_OR_RETURN(bool row, query.step());
      if (!row) break;
      stale.push_back(query.text(0));
    }
  }
  std::vector<std::string> refreshed;
  for (const auto& jobId : stale) {
    LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, job(jobId));
    if (!jobStateEnded(record.state)) continue;  // computed once it ends
    LOCKSTEP_ASSIGN_OR_RETURN(auto t, tracker(jobId));
    const kpi::JobKpis k = t->snapshot(std::max(record.endedUnixUs, t->lastReportUnixUs()));
    const std::int64_t now = unixMicrosNow();

    LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
    LOCKSTEP_TRY(detail::writeFinalKpis(db, jobId, k, now));
    LOCKSTEP_ASSIGN_OR_RETURN(auto done, Statement::prepare(db, "UPDATE jobs SET kpis_stale = 0 WHERE job_id = ?1"));
    LOCKSTEP_TRY(done.bind(1, jobId).run());
    LOCKSTEP_TRY(tx.commit());
    refreshed.push_back(jobId);
  }
  return refreshed;
}

Result<void> History::remove(const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), "DELETE FROM jobs WHERE job_id = ?1"));
  LOCKSTEP_TRY(stmt.bind(1, jobId).run());
  if (sqlite3_changes(db_.get()) == 0) {
    return Error{ErrorCode::kNotFound, "no job " + jobId + " in the history (lockstepctl history lists them)"};
  }
  return {};
}

Result<CompactStats> History::compact(std::int64_t nowUnixUs) {
  sqlite3* db = db_.get();
  const std::int64_t bucket = options_.bucketSeconds * 1'000'000;
  // Whole buckets only, so a bucket is written once and later raw rows never fall into it.
  const std::int64_t cutoff = (nowUnixUs - options_.rawHorizonSeconds * 1'000'000) / bucket * bucket;
  CompactStats stats;
  LOCKSTEP_ASSIGN_OR_RETURN(stats.gpuRowsBefore, pragmaInt(db, "SELECT count(*) FROM gpu_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(stats.processRowsBefore, pragmaInt(db, "SELECT count(*) FROM process_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
  // Per bucket: mean utilization, power, CPU % and clock; peak memory, RSS and temperature; the
  // last energy counter reading (energy is a difference of readings, so it survives intact).
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
  };
  for (const char* sql : statements) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, sql));
    if (std::string_view(sql).find("?1") != std::string_view::npos) stmt.bind(1, bucket);
    if (std::string_view(sql).find("?2") != std::string_view::npos) stmt.bind(2, cutoff);
    LOCKSTEP_TRY(stmt.run());
  }
  LOCKSTEP_TRY(tx.commit());
  LOCKSTEP_ASSIGN_OR_RETURN(stats.gpuRowsAfter, pragmaInt(db, "SELECT count(*) FROM gpu_samples"));
  LOCKSTEP_ASSIGN_OR_RETURN(stats.processRowsAfter, pragmaInt(db, "SELECT count(*) FROM process_samples"));
  return stats;
}

// ---- reading ----

namespace {

Result<std::vector<PartRecord>> readParts(sqlite3* db, const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, R"sql(
    SELECT node, state, started_us, ended_us, message FROM job_parts WHERE job_id = ?1 ORDER BY node)sql"));
  stmt.bind(1, jobId);
  std::vector<PartRecord> parts;
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) break;
    parts.push_back(PartRecord{stmt.text(0), static_cast<JobState>(stmt.i64(1)), stmt.i64(2), stmt.i64(3), stmt.text(4)});
  }
  return parts;
}

Result<std::vector<NodeRecord>> readNodes(sqlite3* db, const std::vector<PartRecord>& parts) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, R"sql(
    SELECT node, host, cpu_cores, memory_bytes, gpus_json, agent_version FROM nodes WHERE node = ?1)sql"));
  std::vector<NodeRecord> nodes;
  for (const auto& part : parts) {
    stmt.bind(1, part.node);
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (row) {
      nodes.push_back(NodeRecord{stmt.text(0), stmt.text(1), static_cast<std::uint32_t>(stmt.i64(2)),
                                 static_cast<std::uint64_t>(stmt.i64(3)), gpusFromJson(stmt.text(4)), stmt.text(5)});
    }
    LOCKSTEP_TRY(stmt.reset());
  }
  return nodes;
}

// Fills a JobRecord from a `jobs` row read as (job_id, spec_json, recorded_us, step_reports).
Result<JobRecord> readRecord(sqlite3* db, const Statement& row) {
  JobRecord record;
  const std::string jobId = row.text(0);
  auto spec = jobSpecFromJson(row.text(1));
  if (!spec) return spec.error().withContext("history: the stored spec of job " + jobId);
  record.spec = std::move(*spec);
  record.recordedUnixUs = row.i64(2);
  record.stepReports = static_cast<std::uint64_t>(row.i64(3));
  LOCKSTEP_ASSIGN_OR_RETURN(record.parts, readParts(db, jobId));
  std::vector<JobState> states;
  for (const auto& part : record.parts) {
    states.push_back(part.state);
    if (record.startedUnixUs == 0 || (part.startedUnixUs != 0 && part.startedUnixUs < record.startedUnixUs)) {
      record.startedUnixUs = part.startedUnixUs;
    }
    record.endedUnixUs = std::max(record.endedUnixUs, part.endedUnixUs);
    if (record.message.empty()) record.message = part.message;
  }
  record.state = combinedState(states);
  if (!jobStateEnded(record.state)) record.endedUnixUs = 0;
  LOCKSTEP_ASSIGN_OR_RETURN(record.nodes, readNodes(db, record.parts));
  LOCKSTEP_ASSIGN_OR_RETURN(record.finalKpis, detail::readFinalKpis(db, jobId));
  return record;
}

}  // namespace

Result<std::vector<JobRecord>> History::jobs(const Filter& filter) const {
  sqlite3* db = db_.get();
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, R"sql(
    SELECT job_id, spec_json, recorded_us, step_reports FROM jobs
    WHERE ?1 = '' OR job_id LIKE ?2 ESCAPE '\' OR name LIKE ?2 ESCAPE '\'
       OR EXISTS (SELECT 1 FROM job_parts p WHERE p.job_id = jobs.job_id AND p.node LIKE ?2 ESCAPE '\')
    ORDER BY recorded_us DESC, job_id DESC)sql"));
  stmt.bind(1, filter.text).bind(2, likePattern(filter.text));
  std::vector<JobRecord> out;
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) break;
    LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, readRecord(db, stmt));
    if (filter.state && record.state != *filter.state) continue;
    if (filter.sinceUnixUs && record.startedUnixUs < filter.sinceUnixUs) continue;
    out.push_back(std::move(record));
    if (filter.limit && out.size() == filter.limit) break;
  }
  return out;
}

Result<JobRecord> History::job(const std::string& jobId) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), R"sql(
    SELECT job_id, spec_json, recorded_us, step_reports FROM jobs WHERE job_id = ?1)sql"));
  stmt.bind(1, jobId);
  LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
  if (!row) return Error{ErrorCode::kNotFound, "no job " + jobId + " in the history (lockstepctl history lists them)"};
  return readRecord(db_.get(), stmt);
}

Result<kpi::Maybe> History::calibration(const JobSpec& spec) const {
  // A 1-rank run's pace over its last steps (what a job's scaling efficiency divides its own pace
  // over its last steps by): the same workload, finished, newest first (not the job itself).
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), R"sql(
    SELECT job_id, spec_json, recorded_us, step_reports FROM jobs
    WHERE world_size = 1 AND job_id != ?1 AND step_reports > 0 ORDER BY recorded_us DESC)sql"));
  stmt.bind(1, spec.jobId);
  const std::string key = kpi::workloadKey(spec);
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) return kpi::Maybe{};
    auto spec1 = jobSpecFromJson(stmt.text(1));
    if (!spec1 || kpi::workloadKey(*spec1) != key) continue;
    LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, readRecord(db_.get(), stmt));
    if (record.state == JobState::kFinished && record.finalKpis && record.finalKpis->samplesPerSecond) {
      return record.finalKpis->samplesPerSecond;
    }
  }
}

Result<std::optional<BandwidthPeak>> History::peakBusBandwidth(const std::vector<std::string>& nodes,
                                                               const std::string& exceptJobId) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), R"sql(
    SELECT f.job_id, f.bus_bandwidth, p.node FROM final_kpis f JOIN job_parts p ON p.job_id = f.job_id
    WHERE f.bus_bandwidth IS NOT NULL AND f.job_id != ?1 ORDER BY f.job_id)sql"));
  stmt.bind(1, exceptJobId);
  const std::set<std::string> wanted(nodes.begin(), nodes.end());
  std::optional<BandwidthPeak> best;
  std::string jobId;
  double bandwidth = 0;
  std::set<std::string> its;
  const auto consider = [&] {
    if (!jobId.empty() && its == wanted && (!best || bandwidth > best->bytesPerSecond)) best = BandwidthPeak{bandwidth, jobId};
  };
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row || stmt.text(0) != jobId) {
      consider();
      if (!row) return best;
      jobId = stmt.text(0);
      bandwidth = stmt.real(1);
      its.clear();
    }
    its.insert(stmt.text(2));
  }
}

namespace {

// One table's rows of a job in time order, as stream messages.
struct Cursor {
  Statement stmt;
  StreamMessage (*read)(const Statement&);
  std::optional<StreamMessage> current;
  std::int64_t time = 0;

  Result<void> advance() {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    current.reset();
    if (row) {
      current = read(stmt);
      time = timeOf(current->payload);
    }
    return {};
  }
};

StreamMessage readEvent(const Statement& s) {
  JobEvent e;
  e.jobId = s.text(0);
  e.timeUnixUs = s.i64(2);
  e.kind = static_cast<JobEventKind>(s.i64(3));
  if (s.i64(4) >= 0) e.rank = static_cast<std::uint32_t>(s.i64(4));
  e.exitCode = s.maybeInt<std::int32_t>(5);
  e.signal = s.maybeInt<std::int32_t>(6);
  e.step = s.maybeInt<std::uint64_t>(7);
  e.message = s.text(8);
  e.logTail = s.text(9);
  return StreamMessage{0, s.text(1), std::move(e)};
}

StreamMessage readStep(const Statement& s) {
  StepReport r;
  r.jobId = s.text(0);
  r.attempt = static_cast<std::uint32_t>(s.i64(1));
  r.rank = static_cast<std::uint32_t>(s.i64(2));
  r.step = static_cast<std::uint64_t>(s.i64(3));
  r.worldSize = static_cast<std::uint32_t>(s.i64(5));
  r.epoch = static_cast<std::uint32_t>(s.i64(6));
  r.samples = static_cast<std::uint32_t>(s.i64(7));
  r.loss = s.null(8) ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(s.real(8));
  if (!s.null(9)) r.globalLoss = static_cast<float>(s.real(9));
  r.dataTimeUs = s.maybeInt<std::int64_t>(10);
  r.computeTimeUs = s.maybeInt<std::int64_t>(11);
  r.exposedCommTimeUs = s.maybeInt<std::int64_t>(12);
  r.allreduceTimeUs = s.maybeInt<std::int64_t>(13);
  r.bytesReduced = s.maybeInt<std::uint64_t>(14);
  r.stepTimeUs = s.i64(15);
  r.timeUnixUs = s.i64(16);
  r.lr = s.real(17);
  r.tokens = s.maybeInt<std::uint64_t>(18);
  return StreamMessage{0, s.text(4), std::move(r)};
}

GpuSample gpuSampleOf(const Statement& s) {
  GpuSample g;
  g.jobId = s.text(0);
  g.node = s.text(1);
  g.gpuIndex = static_cast<std::uint32_t>(s.i64(2));
  g.timeUnixUs = s.i64(3);
  if (!s.null(5)) g.utilizationPct = static_cast<float>(s.real(5));
  g.memoryUsedBytes = s.maybeInt<std::uint64_t>(6);
  g.powerMilliwatts = s.maybeInt<std::uint32_t>(7);
  g.energyMillijoules = s.maybeInt<std::uint64_t>(8);
  g.temperatureC = s.maybeInt<std::int32_t>(9);
  g.smClockMhz = s.maybeInt<std::uint32_t>(10);
  return g;
}

StreamMessage readGpu(const Statement& s) {
  GpuSample g = gpuSampleOf(s);
  std::string node = g.node;
  return StreamMessage{0, std::move(node), std::move(g)};
}

StreamMessage readProcess(const Statement& s) {
  ProcessSample p;
  p.jobId = s.text(0);
  p.rank = static_cast<std::uint32_t>(s.i64(2));
  p.timeUnixUs = s.i64(3);
  p.pid = static_cast<std::uint32_t>(s.i64(5));
  if (!s.null(6)) p.cpuPct = static_cast<float>(s.real(6));
  p.rssBytes = s.maybeInt<std::uint64_t>(7);
  return StreamMessage{0, s.text(1), std::move(p)};
}

}  // namespace

Result<void> History::replay(const std::string& jobId, const std::function<void(const StreamMessage&)>& visit) const {
  LOCKSTEP_TRY(job(jobId));  // NotFound says so
  sqlite3* db = db_.get();
  const std::pair<std::string, StreamMessage (*)(const Statement&)> tables[] = {
      {"SELECT * FROM events WHERE job_id = ?1 ORDER BY time_us", readEvent},
      {std::string("SELECT ") + kStepColumns + " FROM steps WHERE job_id = ?1 ORDER BY time_us, step, rank", readStep},
      {"SELECT * FROM gpu_samples WHERE job_id = ?1 ORDER BY time_us", readGpu},
      {"SELECT * FROM process_samples WHERE job_id = ?1 ORDER BY time_us", readProcess},
  };
  std::vector<Cursor> cursors;
  for (const auto& [sql, read] : tables) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, sql));
    stmt.bind(1, jobId);
    cursors.push_back(Cursor{std::move(stmt), read, std::nullopt, 0});
    LOCKSTEP_TRY(cursors.back().advance());
  }
  // Merge by time; on a tie the earlier table wins (an event before the reports of its moment).
  for (;;) {
    Cursor* next = nullptr;
    for (auto& c : cursors) {
      if (c.current && (!next || c.time < next->time)) next = &c;
    }
    if (!next) return {};
    visit(*next->current);
    LOCKSTEP_TRY(next->advance());
  }
}

Result<std::unique_ptr<kpi::JobTracker>> History::tracker(const std::string& jobId, kpi::Settings settings) const {
  LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, job(jobId));
  if (!settings.calibratedSingleRankSamplesPerSecond && record.spec.worldSize > 1) {
    LOCKSTEP_ASSIGN_OR_RETURN(settings.calibratedSingleRankSamplesPerSecond, calibration(record.spec));
  }
  auto t = std::make_unique<kpi::JobTracker>(record.spec, settings);
  LOCKSTEP_TRY(replay(jobId, [&](const StreamMessage& m) { t->add(m); }));
  return t;
}

Result<void> History::forEachStep(const std::string& jobId,
                                  const std::function<void(const StepReport&, const std::string& node)>& visit) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), std::string("SELECT ") + kStepColumns +
                                                                       " FROM steps WHERE job_id = ?1 ORDER BY attempt, step, rank"));
  stmt.bind(1, jobId);
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) return {};
    const StreamMessage m = readStep(stmt);
    visit(std::get<StepReport>(m.payload), m.node);
  }
}

Result<void> History::forEachGpuSample(const std::string& jobId,
                                       const std::function<void(const StoredGpuSample&)>& visit) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), R"sql(
    SELECT * FROM gpu_samples WHERE job_id = ?1 ORDER BY time_us, node, gpu)sql"));
  stmt.bind(1, jobId);
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) return {};
    visit(StoredGpuSample{gpuSampleOf(stmt), stmt.i64(4)});
  }
}

Result<std::vector<JobEvent>> History::events(const std::string& jobId) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), "SELECT * FROM events WHERE job_id = ?1 ORDER BY time_us"));
  stmt.bind(1, jobId);
  std::vector<JobEvent> out;
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) return out;
    out.push_back(std::get<JobEvent>(readEvent(stmt).payload));
  }
}

kpi::Settings liveTrackerSettings(const std::string& historyPath, const JobSpec& spec) {
  kpi::Settings settings;
  if (historyPath.empty() || spec.worldSize <= 1) return settings;
  auto history = History::open(historyPath);
  if (!history) return settings;
  if (auto single = history->calibration(spec); single && *single) settings.calibratedSingleRankSamplesPerSecond = *single;
  return settings;
}

}  // namespace lockstep::history
