// The History: opening the file, and its public calls, each handed to the part that owns it
// (catalog.h, record.h, replay.h, clocks.h, compact.h).

#include "lockstep/history/history.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "catalog.h"
#include "clocks.h"
#include "compact.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"
#include "record.h"
#include "replay.h"
#include "schema.h"
#include "sqlite.h"

namespace lockstep::history {

void History::Closer::operator()(sqlite3* db) const { sqlite3_close_v2(db); }

History::History(sqlite3* db, std::string path, Options options)
    : db_(db),
      path_(std::move(path)),
      catalog_(std::make_unique<detail::Catalog>(db)),
      recorder_(std::make_unique<detail::Recorder>(db)),
      replayer_(std::make_unique<detail::Replayer>(db, *catalog_)),
      clocks_(std::make_unique<detail::NodeClocks>(db)),
      compactor_(std::make_unique<detail::Compactor>(db, options, *clocks_)) {}
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
  if (rc != SQLITE_OK) return detail::sqliteError(raw, "opening history " + path);
  sqlite3_busy_timeout(raw, 5000);
  sqlite3_extended_result_codes(raw, 0);
  // SQLite answers "locked" at once, without waiting, to a connection that meets another turning a
  // fresh file into WAL mode (found in CI: two connections opening one fresh history): try again,
  // for up to the busy timeout.
  auto migrated = detail::migrate(raw);
  for (int retry = 0; !migrated && migrated.error().code == ErrorCode::kUnavailable && retry < 100; ++retry) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    migrated = detail::migrate(raw);
  }
  if (!migrated) return migrated.error().withContext("history " + path);
  return history;
}

// ---- writing ----

Result<void> History::recordNode(const NodeHello& hello) { return recorder_->recordNode(hello); }

Result<bool> History::recordJob(const std::string& node, const JobStatus& status) {
  return recorder_->recordJob(node, status);
}

Result<void> History::recordMessages(std::span<const StreamMessage> messages) {
  return recorder_->recordMessages(messages);
}

// Each stale job, once ended, replayed into a tracker whose KPIs at its end are written.
Result<std::vector<std::string>> History::refreshFinalKpis() {
  LOCKSTEP_ASSIGN_OR_RETURN(const auto stale, recorder_->staleJobs());
  std::vector<std::string> refreshed;
  for (const auto& jobId : stale) {
    LOCKSTEP_ASSIGN_OR_RETURN(JobRecord record, catalog_->job(jobId));
    if (!jobStateEnded(record.state)) continue;  // computed once it ends
    LOCKSTEP_ASSIGN_OR_RETURN(auto t, replayer_->tracker(jobId, {}));
    const kpi::JobKpis k = t->snapshot(std::max(record.endedUnixUs, t->lastReportUnixUs()));
    LOCKSTEP_TRY(recorder_->writeFinalKpis(jobId, k, unixMicrosNow()));
    refreshed.push_back(jobId);
  }
  return refreshed;
}

Result<void> History::remove(const std::string& jobId) { return recorder_->remove(jobId); }

Result<void> History::recordClock(const std::string& node, const ClockOffset& offset) {
  return clocks_->record(node, offset);
}

Result<CompactStats> History::compact(std::int64_t nowUnixUs) { return compactor_->compact(nowUnixUs); }

// ---- reading ----

Result<std::vector<JobRecord>> History::jobs(const Filter& filter) const { return catalog_->jobs(filter); }

Result<JobRecord> History::job(const std::string& jobId) const { return catalog_->job(jobId); }

Result<void> History::replay(const std::string& jobId, const std::function<void(const StreamMessage&)>& visit,
                             bool nodes) const {
  return replayer_->replay(jobId, visit, nodes);
}

Result<std::map<std::string, ClockOffset, NaturalLess>> History::clocks(const JobRecord& job) const {
  return clocks_->of(job);
}

Result<kpi::Maybe> History::calibration(const JobSpec& spec) const { return catalog_->calibration(spec); }

Result<std::optional<BandwidthPeak>> History::peakBusBandwidth(const std::vector<std::string>& nodes,
                                                               const std::string& exceptJobId) const {
  return catalog_->peakBusBandwidth(nodes, exceptJobId);
}

Result<std::unique_ptr<kpi::JobTracker>> History::tracker(const std::string& jobId, kpi::Settings settings) const {
  return replayer_->tracker(jobId, settings);
}

Result<Replay> History::replayJob(const std::string& jobId, kpi::Settings settings, bool nodes) const {
  return replayer_->replayJob(jobId, settings, nodes);
}

Result<void> History::forEachStep(const std::string& jobId,
                                  const std::function<void(const StepReport&, const std::string& node)>& visit) const {
  return replayer_->forEachStep(jobId, visit);
}

Result<void> History::forEachGpuSample(const std::string& jobId,
                                       const std::function<void(const StoredGpuSample&)>& visit) const {
  return replayer_->forEachGpuSample(jobId, visit);
}

Result<void> History::forEachNetSample(const std::string& jobId, const std::function<void(const NetSample&)>& visit) const {
  return replayer_->forEachNetSample(jobId, visit);
}

Result<std::vector<JobEvent>> History::events(const std::string& jobId) const { return replayer_->events(jobId); }

kpi::Settings liveTrackerSettings(const std::string& historyPath, const JobSpec& spec) {
  kpi::Settings settings;
  if (historyPath.empty() || spec.worldSize <= 1) return settings;
  auto history = History::open(historyPath);
  if (!history) return settings;
  if (auto single = history->calibration(spec); single && *single) settings.calibratedSingleRankSamplesPerSecond = *single;
  return settings;
}

namespace {

// "2026-12-07 11:40", local time.
std::string minuteText(std::int64_t unixUs) {
  const std::time_t t = static_cast<std::time_t>(unixUs / 1'000'000);
  std::tm local{};
  localtime_r(&t, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M", &local);
  return text;
}

// A job the history holds under an id, as a launcher needs to know it.
struct HeldJob {
  std::int64_t sinceUs = 0;  // its first part's start, else when it was recorded
  bool goesOn = false;       // no verdict, and a part starting or running
};

std::string heldJobSql(std::string_view noVerdict) {
  return "SELECT j.recorded_us, min(nullif(p.started_us, 0)), coalesce(max(p.state IN (?2, ?3)), 0) AND " +
         std::string(noVerdict) +
         " FROM jobs j LEFT JOIN job_parts p ON p.job_id = j.job_id WHERE j.job_id = ?1 GROUP BY j.job_id";
}

// Empty when the history does not hold the id, or cannot be read now (running a job never fails
// for its history).
std::optional<HeldJob> heldJob(sqlite3* db, const std::string& jobId) {
  auto query = [&]() -> Result<detail::Statement> {
    auto withVerdict = detail::Statement::prepare(db, heldJobSql("j.outcome IS NULL"));
    if (withVerdict) return withVerdict;
    return detail::Statement::prepare(db, heldJobSql("1"));  // a history before schema 13 keeps no verdict
  }();
  if (!query) return std::nullopt;
  query->bind(1, jobId).bind(2, static_cast<std::int64_t>(JobState::kStarting));
  query->bind(3, static_cast<std::int64_t>(JobState::kRunning));
  const auto held = query->step();
  if (!held || !*held) return std::nullopt;
  return HeldJob{query->null(1) ? query->i64(0) : query->i64(1), query->i64(2) != 0};
}

}  // namespace

// A read on a connection of its own, read-only and without migrating: a launcher asks at every edit,
// and must neither wait on the history's writers (a WAL reader does not) nor change the database.
Result<void> checkNewJobId(const std::string& historyPath, const std::string& jobId, std::string_view howToDelete) {
  std::error_code ec;
  if (historyPath.empty() || !std::filesystem::exists(historyPath, ec)) return {};
  sqlite3* raw = nullptr;
  const int opened = sqlite3_open_v2(historyPath.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr);
  const std::unique_ptr<sqlite3, int (*)(sqlite3*)> db(raw, sqlite3_close);
  if (opened != SQLITE_OK) return {};
  sqlite3_busy_timeout(db.get(), 200);
  const auto held = heldJob(db.get(), jobId);
  if (!held) return {};
  const std::string since = minuteText(held->sinceUs);
  if (held->goesOn) {
    return Error{ErrorCode::kAlreadyExists,
                 "job id " + jobId + " names a job in the history that has not ended (it started " + since +
                     "): give the new job another id (if it no longer runs, and its recording stopped before its end, " +
                     std::string(howToDelete) + " removes it)"};
  }
  return Error{ErrorCode::kAlreadyExists,
               "job id " + jobId + " names a job in the history already (it started " + since +
                   "), and the new job's records would go into it: give the new job another id, or delete that one "
                   "from the history first (" + std::string(howToDelete) + ")"};
}

}  // namespace lockstep::history
