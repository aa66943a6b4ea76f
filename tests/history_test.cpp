// The job history on real SQLite files: recording, idempotent replays, reading back in time order,
// final KPIs, search, delete, downsampling, schema checks, and a writer killed with SIGKILL.

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <functional>
#include <thread>

#include "lockstep/history/history.h"
#include "support/test_support.h"

namespace lockstep::history {
namespace {

using test::TempDir;

constexpr std::int64_t kT0 = 1'800'000'000'000'000;  // a fixed start, in unix microseconds

JobSpec spec(const std::string& id, std::uint32_t ranks = 2, const std::string& name = "mnist-mlp") {
  JobSpec s;
  s.jobId = id;
  s.name = name;
  s.layers = {8, 16, 4};
  s.dataset = SyntheticDataset{.samples = 1024, .dim = 8, .classes = 4};
  s.steps = 10;
  s.worldSize = ranks;
  for (std::uint32_t r = 0; r < ranks; ++r) s.ranks.push_back(RankPlacement{r, r % 2 ? "node-b" : "node-a", r / 2, {}});
  return s;
}

JobStatus status(const JobSpec& s, JobState state, std::int64_t endedUs = 0) {
  JobStatus st;
  st.spec = s;
  st.state = state;
  st.startedUnixUs = kT0;
  st.endedUnixUs = endedUs;
  return st;
}

JobEvent event(const std::string& jobId, JobEventKind kind, std::int64_t timeUs) {
  JobEvent e;
  e.jobId = jobId;
  e.kind = kind;
  e.timeUnixUs = timeUs;
  return e;
}

StreamMessage message(const std::string& node, auto payload) { return StreamMessage{0, node, std::move(payload)}; }

// A job's stream: started, `steps` steps of every rank 100 ms apart, a GPU and a process sample per
// step, a checkpoint of every rank after step 5, and (when `finish`) the finished event.
std::vector<StreamMessage> stream(const JobSpec& s, std::uint64_t steps, bool finish,
                                  const std::function<void(StepReport&)>& shape = {}) {
  std::vector<StreamMessage> out;
  out.push_back(message("node-a", event(s.jobId, JobEventKind::kStarted, kT0)));
  for (std::uint64_t step = 1; step <= steps; ++step) {
    const std::int64_t t = kT0 + static_cast<std::int64_t>(step) * 100'000;
    for (const auto& p : s.ranks) {
      StepReport r;
      r.jobId = s.jobId;
      r.rank = p.rank;
      r.worldSize = s.worldSize;
      r.step = step;
      r.samples = s.batchPerRank;
      r.loss = 2.0f / static_cast<float>(step);
      r.globalLoss = r.loss;
      r.dataTimeUs = 5'000;
      r.computeTimeUs = 70'000 + 5'000 * p.rank;
      r.exposedCommTimeUs = 20'000;
      r.stepTimeUs = 100'000;
      r.timeUnixUs = t;
      r.lr = 0.01;
      r.optimizerTimeUs = 10'000;
      r.optimizerStateBytes = 4'000'000 + p.rank;
      r.staleness = 3;
      if (shape) shape(r);
      out.push_back(message(p.node, r));
      out.push_back(message(p.node, ProcessSample{s.jobId, p.rank, 1000 + p.rank, t, 95.0f, 1u << 20}));
      if (step == 5) out.push_back(message(p.node, PhaseReport{s.jobId, p.rank, s.worldSize, 0, "checkpoint", t + 50'000, 40'000, 5}));
    }
    GpuSample g;
    g.node = "node-a";
    g.jobId = s.jobId;
    g.timeUnixUs = t;
    g.utilizationPct = 80.0f;
    g.energyMillijoules = 1000 * step;
    out.push_back(message("node-a", g));
  }
  if (finish) out.push_back(message("node-a", event(s.jobId, JobEventKind::kFinished, kT0 + static_cast<std::int64_t>(steps + 1) * 100'000)));
  return out;
}

NodeHello hello(const std::string& node) {
  NodeHello h;
  h.nodeName = node;
  h.host = node + ".example";
  h.cpuCores = 32;
  h.memoryTotalBytes = 64ull << 30;
  h.gpus = {GpuInfo{0, "NVIDIA H200", "GPU-1", 141ull << 30}};
  h.agentVersion = "0.1.0";
  return h;
}

// Records a whole finished job on two nodes.
void recordFinished(History& h, const JobSpec& s, std::uint64_t steps = 10,
                    const std::function<void(StepReport&)>& shape = {}) {
  ASSERT_TRUE(h.recordNode(hello("node-a")));
  ASSERT_TRUE(h.recordNode(hello("node-b")));
  ASSERT_TRUE(h.recordJob("node-a", status(s, JobState::kRunning)));
  ASSERT_TRUE(h.recordJob("node-b", status(s, JobState::kRunning)));
  const auto messages = stream(s, steps, true, shape);
  ASSERT_TRUE(h.recordMessages(messages));
  const std::int64_t end = kT0 + static_cast<std::int64_t>(steps + 1) * 100'000;
  ASSERT_TRUE(h.recordJob("node-a", status(s, JobState::kFinished, end)));
  ASSERT_TRUE(h.recordJob("node-b", status(s, JobState::kFinished, end)));
}

std::int64_t count(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  std::int64_t n = -1;
  if (sqlite3_step(stmt) == SQLITE_ROW) n = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return n;
}

std::string textOf(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  std::string out;
  if (sqlite3_step(stmt) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

void execSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

TEST(History, RecordsAJobAndReadsItBack) {
  TempDir dir;
  auto h = History::open(dir.file("sub/dir/history.db"));
  ASSERT_TRUE(h) << h.error().message;
  const JobSpec s = spec("j-1");
  recordFinished(*h, s);

  auto record = h->job("j-1");
  ASSERT_TRUE(record) << record.error().message;
  EXPECT_EQ(record->spec, s);
  EXPECT_EQ(record->state, JobState::kFinished);
  EXPECT_EQ(record->startedUnixUs, kT0);
  EXPECT_EQ(record->stepReports, 20u);
  ASSERT_EQ(record->parts.size(), 2u);
  ASSERT_EQ(record->nodes.size(), 2u);
  EXPECT_EQ(record->nodes[0].host, "node-a.example");
  ASSERT_EQ(record->nodes[0].gpus.size(), 1u);
  EXPECT_EQ(record->nodes[0].gpus[0].name, "NVIDIA H200");
  EXPECT_FALSE(record->finalKpis) << "final KPIs are computed by refreshFinalKpis()";

  // Replay: everything, in time order, the started event first.
  std::vector<StreamMessage> replayed;
  ASSERT_TRUE(h->replay("j-1", [&](const StreamMessage& m) { replayed.push_back(m); }));
  EXPECT_EQ(replayed.size(), stream(s, 10, true).size());
  ASSERT_TRUE(std::holds_alternative<JobEvent>(replayed.front().payload));
  std::int64_t last = 0;
  for (const auto& m : replayed) {
    const std::int64_t t = std::visit([](const auto& p) { return p.timeUnixUs; }, m.payload);
    EXPECT_GE(t, last);
    last = t;
  }
  const auto& firstStep = std::get<StepReport>(replayed[1].payload);
  EXPECT_EQ(replayed[1].node, "node-a");
  EXPECT_EQ(firstStep.computeTimeUs, 70'000);
  EXPECT_EQ(firstStep.optimizerTimeUs, 10'000);
  EXPECT_EQ(firstStep.optimizerStateBytes, 4'000'000u);
  EXPECT_EQ(firstStep.staleness, 3u);
  EXPECT_FALSE(firstStep.paramBytes) << "not reported: unknown, not 0";
  EXPECT_FLOAT_EQ(*firstStep.globalLoss, 2.0f);
  // The ranks' checkpoints (issue 35), each with the node that streamed it, between the steps they ran among.
  std::vector<std::pair<std::string, PhaseReport>> phases;
  for (const auto& m : replayed) {
    if (const auto* p = std::get_if<PhaseReport>(&m.payload)) phases.emplace_back(m.node, *p);
  }
  ASSERT_EQ(phases.size(), 2u);
  EXPECT_EQ(phases[0].second, (PhaseReport{"j-1", 0, 2, 0, "checkpoint", kT0 + 550'000, 40'000, 5}));
  EXPECT_EQ(phases[1].first, "node-b");

  // Final KPIs: the same as a live tracker fed the same stream.
  auto refreshed = h->refreshFinalKpis();
  ASSERT_TRUE(refreshed);
  EXPECT_EQ(*refreshed, std::vector<std::string>{"j-1"});
  EXPECT_TRUE(h->refreshFinalKpis()->empty()) << "nothing new: nothing recomputed";
  record = h->job("j-1");
  ASSERT_TRUE(record->finalKpis);
  kpi::JobTracker live(s);
  for (const auto& m : stream(s, 10, true)) live.add(m);
  const kpi::JobKpis expected = live.snapshot(kT0 + 11 * 100'000);
  EXPECT_EQ(record->finalKpis->step, 10u);
  ASSERT_TRUE(record->finalKpis->samplesPerSecond);
  EXPECT_DOUBLE_EQ(*record->finalKpis->samplesPerSecond, *expected.samplesPerSecond);
  EXPECT_DOUBLE_EQ(*record->finalKpis->commOverhead, *expected.commOverhead);
  EXPECT_DOUBLE_EQ(*record->finalKpis->loadImbalance, *expected.loadImbalance);
  EXPECT_EQ(record->finalKpis->slowestRank, expected.slowestRank);
  EXPECT_FALSE(record->finalKpis->timeToConvergenceSeconds) << "no target loss: unknown, not 0";
  EXPECT_EQ(record->finalKpis->missing, expected.missing);
}

// A restart (a later attempt) makes the job that attempt: its spec and parts; a part of the
// attempt before, arriving late (a lost node's agent coming back), changes nothing.
TEST(History, ARestartReplacesTheJobsSpecAndParts) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  JobSpec first = spec("j-1", 2);
  auto changed = h->recordJob("node-a", status(first, JobState::kFailed, kT0 + 5'000'000));
  ASSERT_TRUE(changed);
  EXPECT_TRUE(*changed);
  EXPECT_FALSE(*h->recordJob("node-a", status(first, JobState::kFailed, kT0 + 5'000'000))) << "nothing new";
  EXPECT_TRUE(*h->recordJob("node-b", status(first, JobState::kFailed, kT0 + 5'000'000)));

  JobSpec second = spec("j-1", 1);
  second.attempt = 1;
  EXPECT_TRUE(*h->recordJob("node-a", status(second, JobState::kFinished, kT0 + 9'000'000)));
  EXPECT_FALSE(*h->recordJob("node-b", status(first, JobState::kFailed, kT0 + 5'000'000))) << "the replaced attempt";
  const auto record = h->job("j-1");
  ASSERT_TRUE(record) << record.error().message;
  EXPECT_EQ(record->spec.attempt, 1u);
  EXPECT_EQ(record->spec.worldSize, 1u);
  ASSERT_EQ(record->parts.size(), 1u);
  EXPECT_EQ(record->parts[0].node, "node-a");
  EXPECT_EQ(record->state, JobState::kFinished);
}

TEST(History, ReplayedMessagesAreStoredOnce) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  const JobSpec s = spec("j-1");
  recordFinished(*h, s);
  const auto again = stream(s, 10, true);
  ASSERT_TRUE(h->recordMessages(again));  // an agent replaying after a reconnect
  EXPECT_EQ(h->job("j-1")->stepReports, 20u);
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM steps"), 20);
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM events"), 2);
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM gpu_samples"), 10);
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM phases"), 2);
}

TEST(History, SkipsMessagesOfJobsItDoesNotHold) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  ASSERT_TRUE(h->recordMessages(stream(spec("unknown"), 3, false)));
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM steps"), 0);
  EXPECT_EQ(h->job("unknown").error().code, ErrorCode::kNotFound);
}

TEST(History, KeepsEverythingAcrossReopening) {
  TempDir dir;
  const std::string path = dir.file("h.db");
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    recordFinished(*h, spec("j-1"));
  }
  auto h = History::open(path);
  ASSERT_TRUE(h) << h.error().message;
  auto record = h->job("j-1");
  ASSERT_TRUE(record) << record.error().message;
  EXPECT_EQ(record->stepReports, 20u);
  EXPECT_EQ(count(path, "PRAGMA user_version"), kSchemaVersion);
  EXPECT_EQ(textOf(path, "PRAGMA journal_mode"), "wal");
}

// Issue 15: final_kpis was written with positional binds and read back with SELECT * and column
// numbers. Schema 3 names its end-of-job throughput; a schema-2 file keeps its final KPIs, and
// they are read by name whatever the physical order of the columns.
TEST(History, ASchemaTwoFilesFinalKpisReadBackByName) {
  TempDir dir;
  const std::string path = dir.file("h.db");
  std::optional<kpi::JobKpis> before;
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    recordFinished(*h, spec("kept"), 3);
    ASSERT_TRUE(h->refreshFinalKpis());
    before = h->job("kept")->finalKpis;
    ASSERT_TRUE(before && before->samplesPerSecond);
  }
  // As schema 2 wrote it: the old name, and the columns in another order (total_* moved first).
  execSql(path, R"sql(
    ALTER TABLE final_kpis RENAME COLUMN end_samples_per_s TO samples_per_s;
    CREATE TABLE shuffled AS SELECT total_tokens, total_samples, missing_json, cost_complete, cost, core_hours,
      gpu_hours, energy_kwh, time_to_convergence_s, smoothed_loss, last_global_loss, slowest_cause, slowest_rank,
      load_imbalance, gpu_utilization_pct, scaling_basis, scaling_efficiency, comm_overhead, samples_per_s,
      elapsed_s, total_steps, step, attempts, world_size, computed_us, job_id FROM final_kpis;
    DROP TABLE final_kpis;
    ALTER TABLE shuffled RENAME TO final_kpis;
    ALTER TABLE job_parts DROP COLUMN owner;  -- schema 7's
    ALTER TABLE steps DROP COLUMN optimizer_us;  -- schema 9's
    DROP TABLE phases;
    ALTER TABLE steps DROP COLUMN collectives;  -- schema 10's
    ALTER TABLE steps DROP COLUMN collective_spans;
    ALTER TABLE steps DROP COLUMN param_bytes;  -- schema 11's
    ALTER TABLE steps DROP COLUMN grad_bytes;
    ALTER TABLE steps DROP COLUMN optimizer_state_bytes;
    ALTER TABLE steps DROP COLUMN staleness;
    ALTER TABLE steps DROP COLUMN flops;  -- schema 12's
    ALTER TABLE steps DROP COLUMN flops_basis;
    ALTER TABLE steps DROP COLUMN precision;
    ALTER TABLE steps DROP COLUMN peak_flops;
    PRAGMA user_version = 2;)sql");
  auto h = History::open(path);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(count(path, "PRAGMA user_version"), kSchemaVersion);
  const auto after = h->job("kept");
  ASSERT_TRUE(after && after->finalKpis);
  EXPECT_EQ(after->finalKpis->samplesPerSecond, before->samplesPerSecond);
  EXPECT_EQ(after->finalKpis->meanSamplesPerSecond, before->meanSamplesPerSecond);
  EXPECT_EQ(after->finalKpis->totalSamples, before->totalSamples);
  EXPECT_EQ(after->finalKpis->elapsedSeconds, before->elapsedSeconds);
  EXPECT_EQ(after->finalKpis->worldSize, before->worldSize);
  EXPECT_EQ(after->finalKpis->missing, before->missing);
}

// Issue 33: who each part ran as is kept, and the job shows it; an older file's parts say no one.
TEST(History, KeepsWhoEachPartRanAs) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  const JobSpec s = spec("owned");
  JobStatus a = status(s, JobState::kRunning), b = status(s, JobState::kRunning);
  a.owner = "alice";
  b.owner = "alice";
  ASSERT_TRUE(h->recordJob("node-a", a));
  ASSERT_TRUE(h->recordJob("node-b", b));
  EXPECT_EQ(h->job("owned")->owner, "alice");
  EXPECT_EQ(h->job("owned")->parts[1].owner, "alice");
  b.owner = "alice2";  // node-b maps the key to another user
  ASSERT_TRUE(h->recordJob("node-b", b));
  EXPECT_EQ(h->job("owned")->owner, "alice, alice2");
  ASSERT_TRUE(h->recordJob("node-a", status(spec("anonymous"), JobState::kRunning)));
  EXPECT_EQ(h->job("anonymous")->owner, "");
}

// Issue 13: a file from schema 1 (every step timed, no tokens) moves to schema 2 with its steps
// intact, and then takes steps whose split was not measured.
TEST(History, MigratesASchemaOneFileAndStoresUntimedSteps) {
  TempDir dir;
  const std::string path = dir.file("h.db");
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    recordFinished(*h, spec("old-job"), 3);
  }
  // Back to schema 1's steps table, as the first release wrote it.
  execSql(path, R"sql(
    CREATE TABLE steps_v1 (
      job_id TEXT NOT NULL REFERENCES jobs ON DELETE CASCADE, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,
      step INTEGER NOT NULL, node TEXT NOT NULL, world_size INTEGER NOT NULL, epoch INTEGER NOT NULL,
      samples INTEGER NOT NULL, loss REAL, global_loss REAL, data_us INTEGER NOT NULL, compute_us INTEGER NOT NULL,
      exposed_us INTEGER NOT NULL, allreduce_us INTEGER NOT NULL, bytes_reduced INTEGER NOT NULL,
      step_us INTEGER NOT NULL, time_us INTEGER NOT NULL, lr REAL NOT NULL,
      PRIMARY KEY (job_id, attempt, rank, step)) WITHOUT ROWID;
    INSERT INTO steps_v1 SELECT job_id, attempt, rank, step, node, world_size, epoch, samples, loss, global_loss,
      data_us, compute_us, exposed_us, coalesce(allreduce_us, 0), coalesce(bytes_reduced, 0), step_us, time_us, lr
      FROM steps;
    DROP TABLE steps;
    ALTER TABLE steps_v1 RENAME TO steps;
    CREATE INDEX steps_by_time ON steps (job_id, time_us);
    ALTER TABLE final_kpis DROP COLUMN total_samples;
    ALTER TABLE final_kpis DROP COLUMN total_tokens;
    ALTER TABLE final_kpis RENAME COLUMN end_samples_per_s TO samples_per_s;
    ALTER TABLE final_kpis DROP COLUMN bus_bandwidth;
    ALTER TABLE final_kpis DROP COLUMN waiting_share;
    ALTER TABLE final_kpis DROP COLUMN straggler_share;
    ALTER TABLE final_kpis DROP COLUMN waiting_cost;
    ALTER TABLE final_kpis DROP COLUMN straggler_cost;
    ALTER TABLE final_kpis DROP COLUMN waiting_gpu_hours;
    ALTER TABLE final_kpis DROP COLUMN straggler_gpu_hours;
    ALTER TABLE final_kpis DROP COLUMN bytes_reduced_per_step;
    ALTER TABLE final_kpis DROP COLUMN samples_per_rank_step;
    ALTER TABLE final_kpis DROP COLUMN mean_busy_us;
    ALTER TABLE final_kpis DROP COLUMN mean_exposed_us;
    ALTER TABLE final_kpis DROP COLUMN mean_step_us;
    ALTER TABLE final_kpis DROP COLUMN param_bytes_per_rank;  -- schema 11's
    ALTER TABLE final_kpis DROP COLUMN grad_bytes_per_rank;
    ALTER TABLE final_kpis DROP COLUMN optimizer_state_bytes_per_rank;
    ALTER TABLE final_kpis DROP COLUMN staleness_mean;
    ALTER TABLE final_kpis DROP COLUMN staleness_p99;
    ALTER TABLE final_kpis DROP COLUMN model_flops_per_second;  -- schema 12's
    ALTER TABLE final_kpis DROP COLUMN peak_flops;
    ALTER TABLE final_kpis DROP COLUMN model_flops_utilization;
    ALTER TABLE final_kpis DROP COLUMN flops_basis;
    ALTER TABLE final_kpis DROP COLUMN peak_basis;
    ALTER TABLE job_parts DROP COLUMN owner;  -- schema 7's
    DROP TABLE phases;                        -- schema 9's
    PRAGMA user_version = 1;)sql");
  ASSERT_EQ(count(path, "PRAGMA user_version"), 1);

  auto h = History::open(path);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(count(path, "PRAGMA user_version"), kSchemaVersion);
  std::vector<StepReport> old;
  ASSERT_TRUE(h->forEachStep("old-job", [&](const StepReport& r, const std::string&) { old.push_back(r); }));
  ASSERT_EQ(old.size(), 6u);
  EXPECT_EQ(old[1].computeTimeUs, 75'000);  // rank 1 of step 1
  EXPECT_FALSE(old[1].tokens);
  // Its final KPIs are recomputed, now with the samples it counted: 3 steps x 2 ranks x 64.
  ASSERT_TRUE(h->refreshFinalKpis());
  auto oldRecord = h->job("old-job");
  ASSERT_TRUE(oldRecord && oldRecord->finalKpis);
  EXPECT_EQ(oldRecord->finalKpis->totalSamples, 3u * 2 * 64);
  EXPECT_TRUE(oldRecord->finalKpis->meanSamplesPerSecond);
  // ... and schema 4's: the cost of waiting from its timed steps.
  EXPECT_TRUE(oldRecord->finalKpis->waitingShare);

  JobSpec own = spec("own-job", 1);
  own.layers.clear();
  own.steps = 0;
  own.command = CommandSpec{{"python3", "train.py"}, "/tmp", {}};
  ASSERT_TRUE(h->recordJob("node-a", status(own, JobState::kRunning)));
  StepReport untimed;
  untimed.jobId = "own-job";
  untimed.step = 1;
  untimed.samples = 32;
  untimed.loss = 1.5f;
  untimed.tokens = 32 * 256;
  untimed.stepTimeUs = 90'000;
  untimed.timeUnixUs = kT0 + 90'000;
  ASSERT_TRUE(h->recordMessages(std::vector<StreamMessage>{message("node-a", untimed)}));
  std::vector<StepReport> back;
  ASSERT_TRUE(h->forEachStep("own-job", [&](const StepReport& r, const std::string&) { back.push_back(r); }));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0], untimed);
  EXPECT_FALSE(back[0].dataTimeUs);  // unknown, not 0
  EXPECT_EQ(count(path, "SELECT count(*) FROM steps WHERE job_id = 'own-job' AND compute_us IS NULL"), 1);
  auto record = h->job("own-job");
  ASSERT_TRUE(record);
  EXPECT_EQ(record->spec.command, own.command);
}

// Issue 46: steps that count their model FLOPs against the peak their agent knows. Rank 1 does
// twice rank 0's FLOPs a step; both have a 100 TFLOP/s peak.
void countFlops(StepReport& r) {
  r.flops = 2e12 * (1 + r.rank);
  r.flopsBasis = FlopsBasis::kDeclared;
  r.peakFlops = 1e14;
}

const std::string kPeakBasis = "node-a: 100.0 TFLOP/s, measured sgemm";

StreamMessage peakEvent(const std::string& jobId) {
  JobEvent e = event(jobId, JobEventKind::kPeak, kT0 + 1);
  e.message = kPeakBasis;
  return message("node-a", e);
}

// Issue 46: a schema-11 file gains schema 12's columns, its jobs' final KPIs read back with their
// MFU unknown. A job recorded after keeps its steps' FLOPs, and its MFU goes into final_kpis with
// what its FLOPs and peak came from and back by name, the same as a live tracker's; what is not
// known is NULL, not 0.
TEST(History, MigratesASchemaElevenFileAndKeepsTheMfuOfLaterJobs) {
  TempDir dir;
  const std::string path = dir.file("h.db");
  std::optional<kpi::JobKpis> before;
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    recordFinished(*h, spec("old"), 3);
    ASSERT_TRUE(h->refreshFinalKpis());
    before = h->job("old")->finalKpis;
  }
  execSql(path, R"sql(
    ALTER TABLE steps DROP COLUMN flops;
    ALTER TABLE steps DROP COLUMN flops_basis;
    ALTER TABLE steps DROP COLUMN precision;
    ALTER TABLE steps DROP COLUMN peak_flops;
    ALTER TABLE final_kpis DROP COLUMN model_flops_per_second;
    ALTER TABLE final_kpis DROP COLUMN peak_flops;
    ALTER TABLE final_kpis DROP COLUMN model_flops_utilization;
    ALTER TABLE final_kpis DROP COLUMN flops_basis;
    ALTER TABLE final_kpis DROP COLUMN peak_basis;
    PRAGMA user_version = 11;)sql");
  auto h = History::open(path);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(count(path, "PRAGMA user_version"), kSchemaVersion);
  const auto old = h->job("old");
  ASSERT_TRUE(old && old->finalKpis && before);
  EXPECT_EQ(old->finalKpis->samplesPerSecond, before->samplesPerSecond);
  EXPECT_FALSE(old->finalKpis->mfu);
  EXPECT_EQ(old->finalKpis->peakBasis, "");

  const JobSpec s = spec("new");
  recordFinished(*h, s, 10, countFlops);
  ASSERT_TRUE(h->recordMessages(std::vector<StreamMessage>{peakEvent("new")}));
  recordFinished(*h, spec("no-flops"), 3);
  ASSERT_TRUE(h->refreshFinalKpis());
  EXPECT_EQ(count(path, "SELECT count(*) FROM steps WHERE job_id = 'new' AND flops > 0 AND peak_flops = 1e14"), 20);
  const auto k = h->job("new")->finalKpis;
  ASSERT_TRUE(k && k->modelFlopsPerSecond && k->peakFlops && k->mfu && k->samplesPerSecond);
  // By hand: 6e12 FLOPs for every 2 x batch samples, at the job's samples/s; against two peaks.
  EXPECT_NEAR(*k->modelFlopsPerSecond, *k->samplesPerSecond * 6e12 / (2.0 * s.batchPerRank), 1e-3);
  EXPECT_DOUBLE_EQ(*k->peakFlops, 2e14);
  EXPECT_NEAR(*k->mfu, *k->modelFlopsPerSecond / 2e14, 1e-12);
  EXPECT_EQ(k->flopsBasis, "declared by the program");
  EXPECT_EQ(k->peakBasis, kPeakBasis);
  EXPECT_EQ(textOf(path, "SELECT peak_basis FROM final_kpis WHERE job_id = 'new'"), kPeakBasis);
  kpi::JobTracker live(s);
  for (const auto& m : stream(s, 10, true, countFlops)) live.add(m);
  live.add(peakEvent("new"));
  const kpi::JobKpis expected = live.snapshot(kT0 + 11 * 100'000);
  EXPECT_DOUBLE_EQ(*k->mfu, *expected.mfu);
  EXPECT_EQ(count(path, "SELECT count(*) FROM final_kpis WHERE job_id = 'no-flops' AND model_flops_per_second IS NULL "
                        "AND peak_flops IS NULL AND model_flops_utilization IS NULL AND flops_basis IS NULL AND "
                        "peak_basis IS NULL"),
            1);
}

// Issue 13: a 1-rank run of the same workload calibrates the scaling efficiency of later jobs.
TEST(History, AOneRankRunOfTheSameWorkloadCalibratesScalingEfficiency) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  recordFinished(*h, spec("single", 1), 10);
  recordFinished(*h, spec("pair", 2), 10);
  JobSpec other = spec("other", 2);
  other.batchPerRank = 128;  // another workload
  recordFinished(*h, other, 10);
  ASSERT_TRUE(h->refreshFinalKpis());
  const auto single = h->job("single");
  ASSERT_TRUE(single && single->finalKpis && single->finalKpis->samplesPerSecond);

  auto calibration = h->calibration(spec("pair", 2));
  ASSERT_TRUE(calibration);
  ASSERT_TRUE(*calibration);
  EXPECT_DOUBLE_EQ(**calibration, *single->finalKpis->samplesPerSecond);
  EXPECT_FALSE(*h->calibration(other)) << "no 1-rank run of that workload";
  EXPECT_FALSE(*h->calibration(spec("single", 1))) << "a job is not its own calibration";

  auto tracker = h->tracker("pair");
  ASSERT_TRUE(tracker);
  const auto k = (*tracker)->snapshot(kT0 + 11 * 100'000);
  EXPECT_EQ(k.scalingBasis, kpi::ScalingBasis::kCalibrated);
  ASSERT_TRUE(k.scalingEfficiency && k.samplesPerSecond);
  EXPECT_NEAR(*k.scalingEfficiency, *k.samplesPerSecond / (2 * *single->finalKpis->samplesPerSecond), 1e-9);
}

// Found by app_test's killed-app test in CI (2026-12-05): an app opens its history on two
// connections at once, and a history both found at an old version had a migration applied twice
// ("duplicate column name: owner"), after which the app recorded nothing.
TEST(History, TwoConnectionsOpeningAFreshFileAtOnceMigrateItOnce) {
  TempDir dir;
  for (int round = 0; round < 20; ++round) {
    const std::string path = dir.file("race-" + std::to_string(round) + ".db");
    std::atomic<int> ready{0};
    std::string errors[2];
    auto open = [&](int i) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      auto h = history::History::open(path);
      if (!h) errors[i] = h.error().message;
    };
    std::thread a(open, 0), b(open, 1);
    a.join();
    b.join();
    EXPECT_EQ(errors[0], "") << "round " << round;
    EXPECT_EQ(errors[1], "") << "round " << round;
  }
}

TEST(History, RefusesAFileFromANewerVersion) {
  TempDir dir;
  const std::string path = dir.file("h.db");
  ASSERT_TRUE(History::open(path));
  execSql(path, "PRAGMA user_version = 99");
  auto h = History::open(path);
  ASSERT_FALSE(h);
  EXPECT_EQ(h.error().code, ErrorCode::kFailedPrecondition);
  EXPECT_NE(h.error().message.find("newer Lockstep"), std::string::npos) << h.error().message;
  EXPECT_NE(h.error().message.find(path), std::string::npos) << h.error().message;
}

TEST(History, RefusesFilesThatAreNotAHistory) {
  TempDir dir;
  const std::string text = dir.file("notes.txt");
  std::ofstream(text) << "this is not a database, it is a long enough text file to have a header page\n";
  auto h = History::open(text);
  ASSERT_FALSE(h);
  EXPECT_NE(h.error().message.find("not a usable Lockstep history"), std::string::npos) << h.error().message;

  const std::string other = dir.file("other.db");
  execSql(other, "CREATE TABLE t (x)");
  h = History::open(other);
  ASSERT_FALSE(h);
  EXPECT_NE(h.error().message.find("not a Lockstep history"), std::string::npos) << h.error().message;
  EXPECT_EQ(count(other, "SELECT count(*) FROM sqlite_schema"), 1) << "someone else's file is left alone";
}

TEST(History, SearchesAndFilters) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  recordFinished(*h, spec("j-1", 2, "resnet-sweep"));
  recordFinished(*h, spec("j-2", 2, "mnist"));
  ASSERT_TRUE(h->recordJob("node-c", status(spec("j-3", 1, "bert_50%"), JobState::kRunning)));

  const auto ids = [&](const Filter& f) {
    std::vector<std::string> out;
    auto list = h->jobs(f);
    EXPECT_TRUE(list) << list.error().message;
    for (const auto& r : *list) out.push_back(r.spec.jobId);
    return out;
  };
  const auto text = [](const char* t) {
    Filter f;
    f.text = t;
    return f;
  };
  const auto state = [](JobState st, std::size_t limit) {
    Filter f;
    f.state = st;
    f.limit = limit;
    return f;
  };
  EXPECT_EQ(ids({}), (std::vector<std::string>{"j-3", "j-2", "j-1"})) << "newest first";
  EXPECT_EQ(ids(text("RESNET")), std::vector<std::string>{"j-1"}) << "case-insensitive name";
  EXPECT_EQ(ids(text("node-c")), std::vector<std::string>{"j-3"}) << "by node";
  EXPECT_EQ(ids(text("_50%")), std::vector<std::string>{"j-3"}) << "LIKE wildcards are literal";
  EXPECT_EQ(ids(text("0%")), std::vector<std::string>{"j-3"});
  EXPECT_EQ(ids(state(JobState::kRunning, 0)), std::vector<std::string>{"j-3"});
  EXPECT_EQ(ids(state(JobState::kFinished, 1)), std::vector<std::string>{"j-2"});
}

TEST(History, DeletesAJobWithAllItsRows) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  recordFinished(*h, spec("j-1"));
  recordFinished(*h, spec("j-2"));
  ASSERT_TRUE(h->refreshFinalKpis());
  ASSERT_TRUE(h->remove("j-1"));
  EXPECT_EQ(h->job("j-1").error().code, ErrorCode::kNotFound);
  for (const char* table : {"steps", "events", "gpu_samples", "process_samples", "job_parts", "final_kpis", "phases"}) {
    EXPECT_EQ(count(h->path(), std::string("SELECT count(*) FROM ") + table + " WHERE job_id = 'j-1'"), 0) << table;
    EXPECT_GT(count(h->path(), std::string("SELECT count(*) FROM ") + table + " WHERE job_id = 'j-2'"), 0) << table;
  }
  EXPECT_EQ(h->remove("j-1").error().code, ErrorCode::kNotFound);
}

TEST(History, DownsamplesOldSamplesAndKeepsRecentOnesRaw) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"), Options{.rawHorizonSeconds = 3600, .bucketSeconds = 60});
  ASSERT_TRUE(h);
  JobSpec s = spec("j-1", 1);
  s.ranks[0].gpuIndex = 0;
  ASSERT_TRUE(h->recordJob("node-a", status(s, JobState::kRunning)));
  // Three hours at 1 Hz: utilization alternating 60/100 (mean 80), energy +250 J per second.
  std::vector<StreamMessage> samples;
  samples.push_back(message("node-a", event(s.jobId, JobEventKind::kStarted, kT0)));
  for (int i = 0; i < 3 * 3600; ++i) {
    GpuSample g;
    g.node = "node-a";
    g.jobId = s.jobId;
    g.timeUnixUs = kT0 + std::int64_t{i} * 1'000'000;
    g.utilizationPct = i % 2 ? 100.0f : 60.0f;
    g.energyMillijoules = 250'000ull * static_cast<std::uint64_t>(i);
    samples.push_back(message("node-a", g));
    samples.push_back(message("node-a", ProcessSample{s.jobId, 0, 7, g.timeUnixUs, 100.0f, 1u << 20}));
  }
  ASSERT_TRUE(h->recordMessages(samples));
  const auto energyOf = [&] { return *(*h->tracker("j-1"))->snapshot(kT0 + 3 * 3600'000'000ll).gpus.at(0).energyKwh; };
  const double energyBefore = energyOf();

  auto stats = h->compact(kT0 + 3 * 3600'000'000ll);
  ASSERT_TRUE(stats) << stats.error().message;
  EXPECT_EQ(stats->gpuRowsBefore, 3u * 3600);
  // The first two hours become 120 one-minute rows; the last hour stays raw.
  EXPECT_EQ(stats->gpuRowsAfter, 120u + 3600);
  EXPECT_EQ(stats->processRowsAfter, 120u + 3600);
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM gpu_samples WHERE span_us = 60000000"), 120);
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM gpu_samples WHERE span_us = 0 AND time_us < " +
                                 std::to_string(kT0 + 2 * 3600'000'000ll)), 0);
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM gpu_samples WHERE span_us != 0 AND abs(utilization - 80) > 0.001"), 0);
  // Energy comes from counter differences: the last reading of each bucket keeps it whole, except
  // for the part of the first minute before its last reading.
  EXPECT_NEAR(energyOf(), energyBefore, 250.0 * 59 / 3.6e6);

  // Again: nothing left to downsample.
  stats = h->compact(kT0 + 3 * 3600'000'000ll);
  EXPECT_EQ(stats->gpuRowsAfter, stats->gpuRowsBefore);
}

// A node's clock is measured every minute while a client watches: past the raw horizon, outside the
// recorded jobs' parts, the least uncertain of each hour is kept; a job's own measurements stay.
TEST(History, OldClockMeasurementsAreThinnedToOneAnHourOutsideTheJobs) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"), Options{.rawHorizonSeconds = 3600, .bucketSeconds = 60});
  ASSERT_TRUE(h);
  constexpr std::int64_t kHour = 3'600'000'000, kMinute = 60'000'000;
  const std::int64_t t0 = kT0 / kHour * kHour;  // on the hour
  for (const char* node : {"node-a", "node-b"}) {
    for (std::int64_t m = 0; m < 4 * 60; ++m) {  // four hours, one a minute; the uncertainty varies
      ASSERT_TRUE(h->recordClock(node, ClockOffset{1000 + m, 50 + (m * 37) % 100, t0 + m * kMinute}));
    }
  }
  // A job on node-a for 30 minutes of the second hour, and on node-b for 30 minutes of the third:
  // each part keeps its own node's measurements.
  JobSpec s = spec("j-1", 2);
  JobStatus st = status(s, JobState::kFinished, t0 + 90 * kMinute);
  st.startedUnixUs = t0 + 60 * kMinute;
  ASSERT_TRUE(h->recordJob("node-a", st));
  st.startedUnixUs = t0 + 120 * kMinute;
  st.endedUnixUs = t0 + 150 * kMinute;
  ASSERT_TRUE(h->recordJob("node-b", st));
  const auto job = h->job("j-1");
  ASSERT_TRUE(job);
  const auto before = h->clocks(*job);
  ASSERT_TRUE(before);

  ASSERT_TRUE(h->compact(t0 + 4 * kHour));  // the first three hours are past the horizon
  // Each node: one a hour for the three old hours, the last hour raw, and its part's 30 minutes
  // and the minute either side (33 measurements, of which the hour's best may be one).
  for (const char* node : {"node-a", "node-b"}) {
    const auto kept = count(h->path(), std::string("SELECT count(*) FROM node_clocks WHERE node = '") + node + "'");
    EXPECT_GE(kept, 3 + 60 + 32) << node;
    EXPECT_LE(kept, 3 + 60 + 33) << node;
    EXPECT_EQ(count(h->path(), std::string("SELECT min(uncertainty_us) FROM node_clocks WHERE node = '") + node +
                                   "' AND time_us < " + std::to_string(t0 + kHour)),
              50)
        << "the first hour's best";
  }
  // The job's clocks are the ones it had.
  const auto after = h->clocks(*job);
  ASSERT_TRUE(after);
  for (const char* node : {"node-a", "node-b"}) {
    EXPECT_EQ(after->at(node).measuredUnixUs, before->at(node).measuredUnixUs) << node;
    EXPECT_EQ(after->at(node).uncertaintyUs, before->at(node).uncertaintyUs) << node;
  }
  const auto kept = count(h->path(), "SELECT count(*) FROM node_clocks WHERE node = 'node-a'");
  // Again: nothing more goes.
  ASSERT_TRUE(h->compact(t0 + 4 * kHour));
  EXPECT_EQ(count(h->path(), "SELECT count(*) FROM node_clocks WHERE node = 'node-a'"), kept);
}

TEST(History, CommittedWritesSurviveAWriterKilledWithSigkill) {
  TempDir dir;
  const std::string path = dir.file("h.db");
  const JobSpec s = spec("j-1");
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    ASSERT_TRUE(h->recordJob("node-a", status(s, JobState::kRunning)));
  }
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Records a batch of one step's reports at a time, forever; says when 50 steps are in.
    auto h = History::open(path);
    if (!h) _exit(2);
    const auto messages = stream(s, 100'000, false);
    std::size_t i = 0;
    for (std::uint64_t step = 0;; ++step) {
      std::vector<StreamMessage> batch;
      while (i < messages.size() && batch.size() < 5) batch.push_back(messages[i++]);
      if (!h->recordMessages(batch)) _exit(3);
      if (step == 50) (void)!write(ready[1], "x", 1);
    }
  }
  close(ready[1]);
  char x;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  usleep(20'000);  // mid-write, most likely
  kill(child, SIGKILL);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  close(ready[0]);
  ASSERT_TRUE(WIFSIGNALED(wstatus));

  auto h = History::open(path);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(textOf(path, "PRAGMA integrity_check"), "ok");
  const auto stored = count(path, "SELECT count(*) FROM steps");
  EXPECT_GT(stored, 50) << "batches committed before the kill are there";
  EXPECT_EQ(static_cast<std::int64_t>(h->job("j-1")->stepReports), stored) << "the counter moved with the rows";
  // Steps are whole: every stored step of rank 0 has its rank 1 too, up to the last batch.
  EXPECT_LE(count(path, "SELECT max(step) - min(step) + 1 - count(DISTINCT step) FROM steps"), 0);
}

}  // namespace
}  // namespace lockstep::history
