// Reading a job's stream back out of the history: each table's rows as records (record_rows.h),
// merged in time order, and fed to the one stream reader as the live views are.

#include <algorithm>
#include <limits>

#include "lockstep/common/clock.h"
#include "lockstep/history/history.h"
#include "record_rows.h"
#include "sqlite.h"
#include "tables.h"

namespace lockstep::history {

using detail::Statement;

namespace {


// "SELECT lead, R's columns FROM R's table WHERE `where`".
template <class R>
std::string selectSql(std::string_view where) {
  using T = detail::Table<R>;
  return "SELECT " + std::string(T::kLead) + ", " + detail::columnsOf<R>() + " FROM " + std::string(T::kName) + " WHERE " +
         std::string(where);
}

// A row of R's table as the message that brought it: the node is the table's, or the record's own.
template <class R>
StreamMessage messageOf(const Statement& s) {
  R record = detail::readRecord<R>(s, detail::Table<R>::kLeadCount);
  if constexpr (requires { record.node; }) {
    std::string node = record.node;
    return StreamMessage{0, std::move(node), std::move(record)};
  } else {
    return StreamMessage{0, s.text(0), std::move(record)};
  }
}

// One table's rows in time order, as stream messages.
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

// Where a job's nodes' samples are its: its start to its end (or now), with the margin.
std::pair<std::int64_t, std::int64_t> nodeWindow(const JobRecord& record) {
  const std::int64_t end = record.endedUnixUs != 0 ? record.endedUnixUs : std::numeric_limits<std::int64_t>::max() - detail::kNodeMarginUs;
  return {record.startedUnixUs - detail::kNodeMarginUs, end + detail::kNodeMarginUs};
}

constexpr const char* kNetOfJob =
    "node IN (SELECT node FROM job_parts WHERE job_id = ?1) AND time_us BETWEEN ?2 AND ?3 ORDER BY time_us, node, interface";

}  // namespace

Result<void> History::replay(const std::string& jobId, const std::function<void(const StreamMessage&)>& visit,
                             bool nodes) const {
  LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, job(jobId));  // NotFound says so
  sqlite3* db = db_.get();
  const auto [from, to] = nodeWindow(record);
  const std::pair<std::string, StreamMessage (*)(const Statement&)> tables[] = {
      {selectSql<JobEvent>("job_id = ?1 ORDER BY time_us"), messageOf<JobEvent>},
      {selectSql<StepReport>("job_id = ?1 ORDER BY time_us, step, rank"), messageOf<StepReport>},
      {selectSql<PhaseReport>("job_id = ?1 ORDER BY time_us, rank"), messageOf<PhaseReport>},
      {selectSql<GpuSample>("job_id = ?1 ORDER BY time_us"), messageOf<GpuSample>},
      {selectSql<ProcessSample>("job_id = ?1 ORDER BY time_us"), messageOf<ProcessSample>},
      {selectSql<NetSample>(kNetOfJob), messageOf<NetSample>},
  };
  std::vector<Cursor> cursors;
  for (const auto& [sql, read] : tables) {
    if (!nodes && read == messageOf<NetSample>) continue;
    LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db, sql));
    stmt.bind(1, jobId);
    if (sql.find("?2") != std::string::npos) stmt.bind(2, from).bind(3, to);
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

Result<Replay> History::replayJob(const std::string& jobId, kpi::Settings settings, bool nodes) const {
  LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, job(jobId));
  if (!settings.calibratedSingleRankSamplesPerSecond && record.spec.worldSize > 1) {
    LOCKSTEP_ASSIGN_OR_RETURN(settings.calibratedSingleRankSamplesPerSecond, calibration(record.spec));
  }
  Replay out;
  out.job = std::make_unique<kpi::JobTracker>(record.spec, settings);
  const std::int64_t end = record.endedUnixUs != 0 ? record.endedUnixUs : unixMicrosNow();
  const double seconds = static_cast<double>(std::max<std::int64_t>(0, end - record.startedUnixUs)) / 1e6;
  kpi::JobTracker* tracker = out.job.get();
  kpi::StreamReader reader([&](const std::string& id) -> RecordSink* { return id == jobId ? tracker : nullptr; },
                           kpi::NodeSettings{std::max(1.0, seconds / 1000), 2000});
  LOCKSTEP_TRY(replay(jobId, [&](const StreamMessage& m) { reader.read(m); }, nodes));
  out.nodes = reader.takeNodes();
  return out;
}

Result<std::unique_ptr<kpi::JobTracker>> History::tracker(const std::string& jobId, kpi::Settings settings) const {
  LOCKSTEP_ASSIGN_OR_RETURN(Replay replayed, replayJob(jobId, settings, false));  // the job's KPIs need no network
  return std::move(replayed.job);
}

Result<void> History::forEachStep(const std::string& jobId,
                                  const std::function<void(const StepReport&, const std::string& node)>& visit) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), selectSql<StepReport>("job_id = ?1 ORDER BY attempt, step, rank")));
  stmt.bind(1, jobId);
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) return {};
    visit(detail::readRecord<StepReport>(stmt, detail::Table<StepReport>::kLeadCount), stmt.text(0));
  }
}

Result<void> History::forEachGpuSample(const std::string& jobId,
                                       const std::function<void(const StoredGpuSample&)>& visit) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), selectSql<GpuSample>("job_id = ?1 ORDER BY time_us, node, gpu")));
  stmt.bind(1, jobId);
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) return {};
    visit(StoredGpuSample{detail::readRecord<GpuSample>(stmt, 1), stmt.i64(0)});
  }
}

Result<void> History::forEachNetSample(const std::string& jobId, const std::function<void(const NetSample&)>& visit) const {
  LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, job(jobId));
  const auto [from, to] = nodeWindow(record);
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), selectSql<NetSample>(kNetOfJob)));
  stmt.bind(1, jobId).bind(2, from).bind(3, to);
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) return {};
    visit(detail::readRecord<NetSample>(stmt, 1));
  }
}

Result<std::vector<JobEvent>> History::events(const std::string& jobId) const {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, Statement::prepare(db_.get(), selectSql<JobEvent>("job_id = ?1 ORDER BY time_us")));
  stmt.bind(1, jobId);
  std::vector<JobEvent> out;
  for (;;) {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt.step());
    if (!row) return out;
    out.push_back(detail::readRecord<JobEvent>(stmt, 1));
  }
}

}  // namespace lockstep::history
