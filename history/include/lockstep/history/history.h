#pragma once
// The job history: one SQLite file (WAL) per user holding every job the app or lockstepctl
// started or watched: spec, the nodes it ran on, events, every step report of every rank, the
// phases its ranks' programs named, GPU and
// process samples, its nodes' network interfaces while it ran (samples raw for
// `Options::rawHorizon`, then one row per `Options::bucket`), and the final KPIs. Writes are
// idempotent: a message replayed by an agent after a reconnect, or after the writer was killed, is
// stored once. A committed write survives kill -9 of the writer (WAL;
// synchronous=NORMAL trades only the last transactions before a power loss).
//
// One History is one connection: use it from one thread at a time. Several processes may share
// the file (the app and lockstepctl): SQLite serializes writers, readers never block.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "lockstep/common/clock.h"
#include "lockstep/common/result.h"
#include "lockstep/common/natural.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/stream.h"
#include "lockstep/protocol/types.h"

struct sqlite3;

namespace lockstep::history {

namespace detail {  // the parts of a History (history/src)
class Catalog;
class Recorder;
class Replayer;
class NodeClocks;
class Compactor;
}  // namespace detail

// The schema version this build writes (PRAGMA user_version). Older files are migrated on open;
// newer ones are refused.
inline constexpr int kSchemaVersion = 13;

struct Options {
  // Samples younger than this stay raw; older ones are averaged into one row per bucket
  // (docs/history.md says what each column keeps).
  std::int64_t rawHorizonSeconds = 7 * 24 * 3600;
  std::int64_t bucketSeconds = 60;
};

struct NodeRecord {
  std::string node;
  std::string host;
  std::uint32_t cpuCores = 0;
  std::uint64_t memoryTotalBytes = 0;
  std::vector<GpuInfo> gpus;
  std::string agentVersion;
};

// One job's part on one node, as its agent last reported it.
struct PartRecord {
  std::string node;
  JobState state = JobState::kStarting;
  std::int64_t startedUnixUs = 0;
  std::int64_t endedUnixUs = 0;
  std::string message;
  std::string owner;  // the Unix user it ran as there ("" before agents said)
};

struct JobRecord {
  JobSpec spec;
  // Its supervisor's verdict once the supervision ended (jobOutcome), else its parts' combined
  // state: failed if a part failed, stopped if one stopped, ...
  JobState state = JobState::kStarting;
  std::int64_t startedUnixUs = 0;
  std::int64_t endedUnixUs = 0;  // 0 while running
  std::string message;  // the verdict's words, else the first part's that has some
  std::string owner;  // combinedOwner of its parts'
  std::vector<PartRecord> parts;
  std::vector<NodeRecord> nodes;  // the nodes of its parts, as their agents described them
  std::int64_t recordedUnixUs = 0;
  std::uint64_t stepReports = 0;
  std::optional<kpi::JobKpis> finalKpis;  // without per-rank and per-GPU rows; once the job ended
};

struct BandwidthPeak {
  double bytesPerSecond = 0;
  std::string jobId;  // the job that reached it
};

struct Filter {
  std::string text;  // matched against id, name and node names (case-insensitive substring)
  std::optional<JobState> state;
  std::int64_t sinceUnixUs = 0;  // started at or after
  std::size_t limit = 0;         // 0: all
};

struct CompactStats {
  std::uint64_t gpuRowsBefore = 0, gpuRowsAfter = 0;
  std::uint64_t processRowsBefore = 0, processRowsAfter = 0;
  std::uint64_t netRowsBefore = 0, netRowsAfter = 0;
};

// A job as it was, replayed from the file through the one stream reader (kpi/stream.h), as the
// live views read it: its KPI tracker, and its nodes' own figures while it ran (their network).
struct Replay {
  std::unique_ptr<kpi::JobTracker> job;
  std::map<std::string, kpi::NodeTracker, NaturalLess> nodes;
};

// A GPU sample as stored: `spanUs` 0 for a raw sample, else the bucket it summarises.
struct StoredGpuSample {
  GpuSample sample;
  std::int64_t spanUs = 0;
};

class History {
 public:
  // Opens (creating it and its directory) and migrates the file. Refuses a file that is not a
  // Lockstep history or was written by a newer version, saying so.
  static Result<History> open(const std::string& path, Options options = {});
  // $LOCKSTEP_HISTORY, else $XDG_DATA_HOME/lockstep/history.db, else ~/.local/share/lockstep/history.db.
  static std::string defaultPath();

  History(History&&) noexcept;
  History& operator=(History&&) noexcept;
  ~History();

  const std::string& path() const { return path_; }

  // ---- writing (each call is one transaction) ----
  Result<void> recordNode(const NodeHello& hello);
  // A job's part on `node`, from the agent's job list: creates the job or updates that part.
  // A later attempt (a restart) replaces the job's spec and parts; a part of an earlier attempt is
  // ignored. The supervising agent's status carries the supervisor's verdict once it ended, and the
  // job then reads as that. Returns whether anything changed.
  Result<bool> recordJob(const std::string& node, const JobStatus& status);
  // Stream messages; those of jobs not recorded yet are skipped, and a node's network unless one
  // of the recorded jobs runs on it (or ended on it less than 5 s before).
  Result<void> recordMessages(std::span<const StreamMessage> messages);
  // Recomputes the final KPIs of ended jobs written to since (by replaying them). Returns the ids.
  Result<std::vector<std::string>> refreshFinalKpis();
  Result<void> remove(const std::string& jobId);  // NotFound when absent
  // A node's clock against this client's (common/clock.h), as measured at `offset.measuredUnixUs`.
  Result<void> recordClock(const std::string& node, const ClockOffset& offset);
  // Downsamples samples older than the raw horizon (relative to nowUnixUs).
  Result<CompactStats> compact(std::int64_t nowUnixUs);

  // ---- reading ----
  Result<std::vector<JobRecord>> jobs(const Filter& filter = {}) const;  // newest first
  Result<JobRecord> job(const std::string& jobId) const;                  // NotFound when absent
  // Every stored message of the job in time order (events, step reports, phases, samples, and its nodes'
  // network from its start to its end), as received.
  Result<void> replay(const std::string& jobId, const std::function<void(const StreamMessage&)>& visit,
                      bool nodes = true) const;
  // Each of the job's nodes' clock offset to the client that recorded it: the measurement with the
  // least uncertainty while the job ran (within a minute of it), else the one nearest in time.
  // Nodes never measured are absent (their records are taken as they are stamped).
  Result<std::map<std::string, ClockOffset, NaturalLess>> clocks(const JobRecord& job) const;
  // The samples/s over the last steps of the newest finished 1-rank job of the same workload
  // (kpi::workloadKey), which calibrates a job's scaling efficiency; empty when there is none.
  Result<kpi::Maybe> calibration(const JobSpec& spec) const;
  // The highest all-reduce bus bandwidth another recorded job reached on exactly these nodes:
  // the measured peak of this cluster, for the diagnosis of a job's exposed communication.
  Result<std::optional<BandwidthPeak>> peakBusBandwidth(const std::vector<std::string>& nodes,
                                                        const std::string& exceptJobId) const;
  // A KPI tracker fed with the whole job: the dashboard and reports as they were. Without a
  // calibration in `settings`, the history's (calibration()) is used.
  Result<std::unique_ptr<kpi::JobTracker>> tracker(const std::string& jobId, kpi::Settings settings = {}) const;
  // The same tracker with the job's nodes' trackers (a network series point per second at least,
  // at most about a thousand over the job); without `nodes`, the job's own records only.
  Result<Replay> replayJob(const std::string& jobId, kpi::Settings settings = {}, bool nodes = true) const;
  Result<void> forEachStep(const std::string& jobId,
                           const std::function<void(const StepReport&, const std::string& node)>& visit) const;
  Result<void> forEachGpuSample(const std::string& jobId, const std::function<void(const StoredGpuSample&)>& visit) const;
  // Its nodes' network samples while it ran, in time order.
  Result<void> forEachNetSample(const std::string& jobId, const std::function<void(const NetSample&)>& visit) const;
  Result<std::vector<JobEvent>> events(const std::string& jobId) const;

 private:
  History(sqlite3* db, std::string path, Options options);

  struct Closer {
    void operator()(sqlite3* db) const;
  };
  // The file, and the parts over it, each with its own statements and bookkeeping.
  std::unique_ptr<sqlite3, Closer> db_;
  std::string path_;
  std::unique_ptr<detail::Catalog> catalog_;      // the jobs as records
  std::unique_ptr<detail::Recorder> recorder_;    // the writes
  std::unique_ptr<detail::Replayer> replayer_;    // a job's stream back out
  std::unique_ptr<detail::NodeClocks> clocks_;    // each node's clock offsets
  std::unique_ptr<detail::Compactor> compactor_;  // downsampling
};

// The KPI engine's settings for a job watched live (the app's dashboard, lockstepctl watch): a
// 1-rank run of the same workload in the history at `historyPath` calibrates its scaling
// efficiency, as in its reports; without one (or a history) it is estimated or unknown.
kpi::Settings liveTrackerSettings(const std::string& historyPath, const JobSpec& spec);

// Whether a new job may take `jobId` in the history at `historyPath`: the history keeps one job per
// id, and a second job under it would have its records go into the first's. AlreadyExists, saying
// when that job started and what to do, when the history holds one; fine when there is no history
// (an empty path, no file yet) or it cannot be read now (running a job never fails for its history).
// Reads only (no migration, no wait on a writer): cheap enough to ask at every edit of a form.
// `howToDelete` ("lockstepctl history delete ID") is said where deleting the old job is the way.
Result<void> checkNewJobId(const std::string& historyPath, const std::string& jobId, std::string_view howToDelete);

}  // namespace lockstep::history
