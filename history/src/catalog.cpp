// Reading the recorded jobs: each as a JobRecord (its parts, nodes and final KPIs), and the
// questions asked across jobs.

#include "catalog.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "final_kpis.h"
#include "lockstep/protocol/codec.h"

namespace lockstep::history::detail {

namespace {

std::string likePattern(std::string_view text) {
  std::string out = "%";
  for (char c : text) {
    if (c == '%' || c == '_' || c == '\\') out += '\\';
    out += c;
  }
  return out + "%";
}

// The job's state, span, message and owner, from its parts' (its state and message from its
// supervisor's verdict where it has one).
void summarizeParts(JobRecord& record, std::optional<std::pair<JobState, std::string>> outcome) {
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
  if (outcome) {
    record.state = outcome->first;
    if (!outcome->second.empty()) record.message = outcome->second;
  }
  record.owner = combinedOwner(owners);
  if (!jobStateEnded(record.state)) record.endedUnixUs = 0;
}

}  // namespace

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

Error noSuchJob(const std::string& jobId) {
  return Error{ErrorCode::kNotFound, "no job " + jobId + " in the history (lockstepctl history lists them)"};
}

Catalog::Catalog(sqlite3* db)
    : db_(db),
      matching_(db, R"sql(
        SELECT job_id, spec_json, recorded_us, step_reports, outcome, outcome_message FROM jobs
        WHERE ?1 = '' OR job_id LIKE ?2 ESCAPE '\' OR name LIKE ?2 ESCAPE '\'
           OR EXISTS (SELECT 1 FROM job_parts p WHERE p.job_id = jobs.job_id AND p.node LIKE ?2 ESCAPE '\')
        ORDER BY recorded_us DESC, job_id DESC)sql"),
      byId_(db, "SELECT job_id, spec_json, recorded_us, step_reports, outcome, outcome_message FROM jobs WHERE job_id = ?1"),
      // A 1-rank run's pace over its last steps (what a job's scaling efficiency divides its own
      // pace over its last steps by): finished, newest first (not the job itself).
      singleRank_(db, R"sql(
        SELECT job_id, spec_json, recorded_us, step_reports, outcome, outcome_message FROM jobs
        WHERE world_size = 1 AND job_id != ?1 AND step_reports > 0 ORDER BY recorded_us DESC)sql"),
      parts_(db, "SELECT node, state, started_us, ended_us, message, owner FROM job_parts WHERE job_id = ?1 ORDER BY node"),
      node_(db, "SELECT node, host, cpu_cores, memory_bytes, gpus_json, agent_version FROM nodes WHERE node = ?1"),
      busBandwidths_(db, R"sql(
        SELECT f.job_id, f.bus_bandwidth, p.node FROM final_kpis f JOIN job_parts p ON p.job_id = f.job_id
        WHERE f.bus_bandwidth IS NOT NULL AND f.job_id != ?1 ORDER BY f.job_id)sql") {}

Result<std::vector<JobRecord>> Catalog::jobs(const Filter& filter) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, matching_.use());
  stmt->bind(1, filter.text).bind(2, likePattern(filter.text));
  std::vector<JobRecord> out;
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt->step());
    if (!row) break;
    LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, readRecord(*stmt));
    if (filter.state && record.state != *filter.state) continue;
    if (filter.sinceUnixUs && record.startedUnixUs < filter.sinceUnixUs) continue;
    out.push_back(std::move(record));
    if (filter.limit && out.size() == filter.limit) break;
  }
  return out;
}

Result<JobRecord> Catalog::job(const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, byId_.use());
  stmt->bind(1, jobId);
  LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt->step());
  if (!row) return noSuchJob(jobId);
  return readRecord(*stmt);
}

Result<kpi::Maybe> Catalog::calibration(const JobSpec& spec) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, singleRank_.use());
  stmt->bind(1, spec.jobId);
  const std::string key = kpi::workloadKey(spec);
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt->step());
    if (!row) return kpi::Maybe{};
    auto spec1 = jobSpecFromJson(stmt->text(1));
    if (!spec1 || kpi::workloadKey(*spec1) != key) continue;
    LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, readRecord(*stmt));
    if (record.state == JobState::kFinished && record.finalKpis && record.finalKpis->samplesPerSecond) {
      return record.finalKpis->samplesPerSecond;
    }
  }
}

Result<std::optional<BandwidthPeak>> Catalog::peakBusBandwidth(const std::vector<std::string>& nodes,
                                                               const std::string& exceptJobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, busBandwidths_.use());
  stmt->bind(1, exceptJobId);
  const std::set<std::string> wanted(nodes.begin(), nodes.end());
  std::optional<BandwidthPeak> best;
  std::string jobId;
  double bandwidth = 0;
  std::set<std::string> its;
  const auto consider = [&] {
    if (!jobId.empty() && its == wanted && (!best || bandwidth > best->bytesPerSecond)) best = BandwidthPeak{bandwidth, jobId};
  };
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt->step());
    if (!row || stmt->text(0) != jobId) {
      consider();
      if (!row) return best;
      jobId = stmt->text(0);
      bandwidth = stmt->real(1);
      its.clear();
    }
    its.insert(stmt->text(2));
  }
}

// Fills a JobRecord from a `jobs` row read as (job_id, spec_json, recorded_us, step_reports, outcome,
// outcome_message).
Result<JobRecord> Catalog::readRecord(const Statement& row) {
  JobRecord record;
  const std::string jobId = row.text(0);
  auto spec = jobSpecFromJson(row.text(1));
  if (!spec) return spec.error().withContext("history: the stored spec of job " + jobId);
  record.spec = std::move(*spec);
  record.recordedUnixUs = row.i64(2);
  record.stepReports = static_cast<std::uint64_t>(row.i64(3));
  LOCKSTEP_ASSIGN_OR_RETURN(record.parts, readParts(jobId));
  std::optional<std::pair<JobState, std::string>> outcome;
  if (!row.null(4)) outcome.emplace(static_cast<JobState>(row.i64(4)), row.text(5));
  summarizeParts(record, std::move(outcome));
  LOCKSTEP_ASSIGN_OR_RETURN(record.nodes, readNodes(record.parts));
  LOCKSTEP_ASSIGN_OR_RETURN(record.finalKpis, readFinalKpis(db_, jobId));
  return record;
}

Result<std::vector<PartRecord>> Catalog::readParts(const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, parts_.use());
  stmt->bind(1, jobId);
  std::vector<PartRecord> parts;
  LOCKSTEP_TRY(forEachRow(*stmt, [&](const Statement& s) {
    parts.push_back(PartRecord{s.text(0), static_cast<JobState>(s.i64(1)), s.i64(2), s.i64(3), s.text(4), s.text(5)});
  }));
  std::stable_sort(parts.begin(), parts.end(), [](const PartRecord& a, const PartRecord& b) { return naturalLess(a.node, b.node); });
  return parts;
}

Result<std::vector<NodeRecord>> Catalog::readNodes(const std::vector<PartRecord>& parts) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, node_.use());
  std::vector<NodeRecord> nodes;
  for (const auto& part : parts) {
    stmt->bind(1, part.node);
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt->step());
    if (row) {
      nodes.push_back(NodeRecord{stmt->text(0), stmt->text(1), static_cast<std::uint32_t>(stmt->i64(2)),
                                 static_cast<std::uint64_t>(stmt->i64(3)), gpusFromJson(stmt->text(4)), stmt->text(5)});
    }
    LOCKSTEP_TRY(stmt->reset());
  }
  return nodes;
}

}  // namespace lockstep::history::detail
