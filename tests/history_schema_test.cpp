// The job history's file across versions (real SQLite files): migrations from every older
// schema, final KPIs read by name, two connections migrating a fresh file at once, and files that
// are newer or not a history refused.

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <thread>

#include "lockstep/history/history.h"
#include "support/history_fixtures.h"
#include "support/test_support.h"

namespace lockstep::history {
namespace {

using test::TempDir;
using namespace test_fixtures;

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
    ALTER TABLE jobs DROP COLUMN outcome;  -- schema 13's
    ALTER TABLE jobs DROP COLUMN outcome_message;
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
    ALTER TABLE jobs DROP COLUMN outcome;  -- schema 13's
    ALTER TABLE jobs DROP COLUMN outcome_message;
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
    ALTER TABLE jobs DROP COLUMN outcome;  -- schema 13's
    ALTER TABLE jobs DROP COLUMN outcome_message;
    PRAGMA user_version = 11;)sql");
  // A launcher reads it before anything migrates it: it still holds the id.
  const auto taken = checkNewJobId(path, "old", "delete it");
  ASSERT_FALSE(taken) << "a schema 11 file";
  EXPECT_NE(taken.error().message.find("names a job in the history already"), std::string::npos) << taken.error().message;
  auto h = History::open(path);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(count(path, "PRAGMA user_version"), kSchemaVersion);
  const auto old = h->job("old");
  ASSERT_TRUE(old && old->finalKpis && before);
  EXPECT_EQ(old->finalKpis->samplesPerSecond, before->samplesPerSecond);
  EXPECT_FALSE(old->finalKpis->mfu);
  EXPECT_EQ(old->finalKpis->peakBasis, "");
  EXPECT_EQ(old->state, JobState::kFinished) << "no verdict kept (schema 13): its parts' state";

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

}  // namespace
}  // namespace lockstep::history
