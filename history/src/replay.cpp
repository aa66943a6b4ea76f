// A job's stream out of the history, in time order, and each of its tables on its own.

#include "replay.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <optional>

#include "lockstep/common/clock.h"
#include "record_rows.h"
#include "tables.h"

namespace lockstep::history::detail {

namespace {

// "SELECT lead, R's columns FROM R's table WHERE `where`".
template <class R>
std::string selectSql(std::string_view where) {
  using T = Table<R>;
  return "SELECT " + std::string(T::kLead) + ", " + columnsOf<R>() + " FROM " + std::string(T::kName) + " WHERE " +
         std::string(where);
}

// A row of R's table as the record it holds, after the table's leading columns.
template <class R>
R recordOf(const Statement& s) {
  return readRecord<R>(s, Table<R>::kLeadCount);
}

// A row of R's table as the message that brought it: the node is the table's, or the record's own.
template <class R>
StreamMessage messageOf(const Statement& s) {
  R record = recordOf<R>(s);
  if constexpr (requires { record.node; }) {
    std::string node = record.node;
    return StreamMessage{0, std::move(node), std::move(record)};
  } else {
    return StreamMessage{0, s.text(0), std::move(record)};
  }
}

// One table's rows in time order, as stream messages.
struct Cursor {
  Prepared::Use stmt;
  StreamMessage (*read)(const Statement&);
  std::optional<StreamMessage> current;
  std::int64_t time = 0;

  Result<void> advance() {
    LOCKSTEP_ASSIGN_OR_RETURN(bool row, stmt->step());
    current.reset();
    if (row) {
      current = read(*stmt);
      time = timeOf(current->payload);
    }
    return {};
  }
};

// Merges the cursors by time; on a tie the earlier cursor wins (an event before the reports of its moment).
Result<void> merge(std::vector<Cursor>& cursors, const std::function<void(const StreamMessage&)>& visit) {
  for (auto& c : cursors) LOCKSTEP_TRY(c.advance());
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

// Where a job's nodes' samples are its: its start to its end (or now), with the margin.
std::pair<std::int64_t, std::int64_t> nodeWindow(const JobRecord& record) {
  const std::int64_t end = record.endedUnixUs != 0 ? record.endedUnixUs : std::numeric_limits<std::int64_t>::max() - kNodeMarginUs;
  return {record.startedUnixUs - kNodeMarginUs, end + kNodeMarginUs};
}

constexpr const char* kNetOfJob =
    "node IN (SELECT node FROM job_parts WHERE job_id = ?1) AND time_us BETWEEN ?2 AND ?3 ORDER BY time_us, node, interface";

// Visits each row of the job's rows in `table`.
template <class F>
Result<void> eachOfJob(Prepared& table, const std::string& jobId, F&& row) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, table.use());
  stmt->bind(1, jobId);
  return forEachRow(*stmt, row);
}

}  // namespace

Replayer::Replayer(sqlite3* db, Catalog& catalog)
    : catalog_(catalog),
      events_(db, selectSql<JobEvent>("job_id = ?1 ORDER BY time_us")),
      steps_(db, selectSql<StepReport>("job_id = ?1 ORDER BY time_us, step, rank")),
      phases_(db, selectSql<PhaseReport>("job_id = ?1 ORDER BY time_us, rank")),
      gpus_(db, selectSql<GpuSample>("job_id = ?1 ORDER BY time_us")),
      processes_(db, selectSql<ProcessSample>("job_id = ?1 ORDER BY time_us")),
      net_(db, selectSql<NetSample>(kNetOfJob)),
      stepsInOrder_(db, selectSql<StepReport>("job_id = ?1 ORDER BY attempt, step, rank")),
      gpusInOrder_(db, selectSql<GpuSample>("job_id = ?1 ORDER BY time_us, node, gpu")) {}

Result<Prepared::Use> Replayer::netOf(const std::string& jobId, const JobRecord& record) {
  const auto [from, to] = nodeWindow(record);
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, net_.use());
  stmt->bind(1, jobId).bind(2, from).bind(3, to);
  return stmt;
}

Result<void> Replayer::replay(const std::string& jobId, const std::function<void(const StreamMessage&)>& visit,
                              bool nodes) {
  LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, catalog_.job(jobId));  // NotFound says so
  const std::pair<Prepared*, StreamMessage (*)(const Statement&)> tables[] = {
      {&events_, messageOf<JobEvent>},  {&steps_, messageOf<StepReport>},        {&phases_, messageOf<PhaseReport>},
      {&gpus_, messageOf<GpuSample>},   {&processes_, messageOf<ProcessSample>},
  };
  std::vector<Cursor> cursors;
  cursors.reserve(std::size(tables) + 1);
  for (const auto& [table, read] : tables) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, table->use());
    stmt->bind(1, jobId);
    cursors.push_back(Cursor{std::move(stmt), read, std::nullopt, 0});
  }
  if (nodes) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, netOf(jobId, record));
    cursors.push_back(Cursor{std::move(stmt), messageOf<NetSample>, std::nullopt, 0});
  }
  return merge(cursors, visit);
}

Result<Replay> Replayer::replayJob(const std::string& jobId, kpi::Settings settings, bool nodes) {
  LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, catalog_.job(jobId));
  if (!settings.calibratedSingleRankSamplesPerSecond && record.spec.worldSize > 1) {
    LOCKSTEP_ASSIGN_OR_RETURN(settings.calibratedSingleRankSamplesPerSecond, catalog_.calibration(record.spec));
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

Result<std::unique_ptr<kpi::JobTracker>> Replayer::tracker(const std::string& jobId, kpi::Settings settings) {
  LOCKSTEP_ASSIGN_OR_RETURN(Replay replayed, replayJob(jobId, settings, false));  // the job's KPIs need no network
  return std::move(replayed.job);
}

Result<void> Replayer::forEachStep(const std::string& jobId,
                                   const std::function<void(const StepReport&, const std::string& node)>& visit) {
  return eachOfJob(stepsInOrder_, jobId, [&](const Statement& s) { visit(recordOf<StepReport>(s), s.text(0)); });
}

Result<void> Replayer::forEachGpuSample(const std::string& jobId, const std::function<void(const StoredGpuSample&)>& visit) {
  return eachOfJob(gpusInOrder_, jobId, [&](const Statement& s) { visit(StoredGpuSample{recordOf<GpuSample>(s), s.i64(0)}); });
}

Result<void> Replayer::forEachNetSample(const std::string& jobId, const std::function<void(const NetSample&)>& visit) {
  LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, catalog_.job(jobId));
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, netOf(jobId, record));
  return forEachRow(*stmt, [&](const Statement& s) { visit(recordOf<NetSample>(s)); });
}

Result<std::vector<JobEvent>> Replayer::events(const std::string& jobId) {
  std::vector<JobEvent> out;
  LOCKSTEP_TRY(eachOfJob(events_, jobId, [&](const Statement& s) { out.push_back(recordOf<JobEvent>(s)); }));
  return out;
}

}  // namespace lockstep::history::detail
