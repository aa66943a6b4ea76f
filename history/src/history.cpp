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
#include "tables.h"

namespace lockstep::history {

using detail::kApplicationId;
using detail::kMigrations;
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
    INSERT INTO job_parts VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
    ON CONFLICT (job_id, node) DO UPDATE SET state = ?3, started_us = ?4, ended_us = ?5, message = ?6, owner = ?7
      WHERE state != ?3 OR started_us != ?4 OR ended_us != ?5 OR message != ?6 OR owner != ?7)sql"));
  part.bind(1, spec.jobId).bind(2, node).bind(3, static_cast<std::int64_t>(status.state));
  part.bind(4, status.startedUnixUs).bind(5, status.endedUnixUs).bind(6, status.message).bind(7, status.owner);
  LOCKSTEP_TRY(part.step());
  if (sqlite3_changes(db) > 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stale, Statement::prepare(db, "UPDATE jobs SET kpis_stale = 1 WHERE job_id = ?1"));
    LOCKSTEP_TRY(stale.bind(1, spec.jobId).run());
    changed = true;
  }
  LOCKSTEP_TRY(tx.commit());
  return changed;
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
  sqlite3* db = db_.get();
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
  // The job's nodes' network goes with it, but for what another job's part on a node still covers.
  LOCKSTEP_ASSIGN_OR_RETURN(auto network, Statement::prepare(db, R"sql(
    DELETE FROM net_samples WHERE node IN (SELECT node FROM job_parts WHERE job_id = ?1) AND NOT EXISTS (
      SELECT 1 FROM job_parts p WHERE p.job_id != ?1 AND p.node = net_samples.node
        AND p.started_us - ?2 <= net_samples.time_us AND (p.ended_us = 0 OR p.ended_us + ?2 >= net_samples.time_us)))sql"));
  LOCKSTEP_TRY(network.bind(1, jobId).bind(2, detail::kNodeMarginUs).run());
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, "DELETE FROM jobs WHERE job_id = ?1"));
  LOCKSTEP_TRY(stmt.bind(1, jobId).run());
  if (sqlite3_changes(db) == 0) {
    return Error{ErrorCode::kNotFound, "no job " + jobId + " in the history (lockstepctl history lists them)"};
  }
  return tx.commit();
}

// ---- reading ----

namespace {

Result<std::vector<PartRecord>> readParts(sqlite3* db, const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, R"sql(
    SELECT node, state, started_us, ended_us, message, owner FROM job_parts WHERE job_id = ?1 ORDER BY node)sql"));
  stmt.bind(1, jobId);
  std::vector<PartRecord> parts;
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) break;
    parts.push_back(
        PartRecord{stmt.text(0), static_cast<JobState>(stmt.i64(1)), stmt.i64(2), stmt.i64(3), stmt.text(4), stmt.text(5)});
  }
  std::stable_sort(parts.begin(), parts.end(), [](const PartRecord& a, const PartRecord& b) { return naturalLess(a.node, b.node); });
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
  std::vector<std::string> owners;
  for (const auto& part : record.parts) {
    states.push_back(part.state);
    owners.push_back(part.owner);
    if (record.startedUnixUs == 0 || (part.startedUnixUs != 0 && part.startedUnixUs < record.startedUnixUs)) {
      record.startedUnixUs = part.startedUnixUs;
    }
    record.endedUnixUs = std::max(record.endedUnixUs, part.endedUnixUs);
    if (record.message.empty()) record.message = part.message;
  }
  record.state = combinedState(states);
  record.owner = combinedOwner(owners);
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

kpi::Settings liveTrackerSettings(const std::string& historyPath, const JobSpec& spec) {
  kpi::Settings settings;
  if (historyPath.empty() || spec.worldSize <= 1) return settings;
  auto history = History::open(historyPath);
  if (!history) return settings;
  if (auto single = history->calibration(spec); single && *single) settings.calibratedSingleRankSamplesPerSecond = *single;
  return settings;
}

}  // namespace lockstep::history
