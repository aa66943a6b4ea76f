// The job history on real SQLite files: recording, idempotent replays, reading back in time order,
// final KPIs, search, delete, downsampling, and a writer killed with SIGKILL (the file across
// versions: history_schema_test.cpp).

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
#include "lockstep/protocol/job_list.h"
#include "support/history_fixtures.h"
#include "support/test_support.h"

namespace lockstep::history {
namespace {

using test::TempDir;
using namespace test_fixtures;

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

// An agent polled every second leaves out the spec the client holds (JobStatus::specOmitted): such a
// status updates its part, and never makes or restarts a job from the stub it carries.
TEST(History, AStatusWithoutItsSpecUpdatesItsPartButStartsNoJob) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h) << h.error().message;
  const auto stub = [](const JobSpec& s, JobState state, std::uint32_t attempt) {
    JobStatus st = status(s, state);
    st.spec.attempt = attempt;
    omitSpec(st);
    return st;
  };
  const JobSpec s = spec("j-stub");
  auto made = h->recordJob("node-a", stub(s, JobState::kRunning, 0));
  ASSERT_TRUE(made) << made.error().message;
  EXPECT_FALSE(*made);
  EXPECT_FALSE(h->job("j-stub")) << "a job made from a stub";

  ASSERT_TRUE(h->recordJob("node-a", status(s, JobState::kRunning)));
  auto updated = h->recordJob("node-a", stub(s, JobState::kFinished, 0));
  ASSERT_TRUE(updated) << updated.error().message;
  EXPECT_TRUE(*updated);
  auto job = h->job("j-stub");
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ(job->state, JobState::kFinished);
  EXPECT_EQ(job->spec, s) << "the stub replaced the spec";
  // A later attempt's stub is not a restart: its spec is not here.
  ASSERT_TRUE(h->recordJob("node-a", stub(s, JobState::kRunning, 1)));
  EXPECT_EQ(h->job("j-stub")->spec.attempt, 0u);
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

// A job reads as its supervisor decided once its supervision ended, as lockstepctl status and the app
// show it: a user's program stopped on request whose other rank then failed (its peer went) is
// stopped, with the supervisor's words, not failed by its parts.
TEST(History, AJobIsWhatItsSupervisorDecidedOverItsParts) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  const JobSpec s = spec("judged");
  JobStatus a = status(s, JobState::kStopped, kT0 + 5'000'000), b = status(s, JobState::kFailed, kT0 + 5'000'000);
  a.message = "stopped on request";
  b.message = "rank 1 exited with code 1";
  a.supervision.state = SupervisionState::kFollowing;
  ASSERT_TRUE(h->recordJob("node-a", a));
  ASSERT_TRUE(h->recordJob("node-b", b));
  EXPECT_EQ(h->job("judged")->state, JobState::kFailed) << "no verdict yet: the parts' combined state";

  a.supervision.state = SupervisionState::kEnded;
  a.supervision.outcome = JobState::kStopped;
  a.supervision.message = "stopped at the user's request on node-a";
  auto changed = h->recordJob("node-a", a);
  ASSERT_TRUE(changed) << changed.error().message;
  EXPECT_TRUE(*changed) << "the verdict is news to the views";
  EXPECT_FALSE(*h->recordJob("node-a", a)) << "the same verdict again is not";
  const auto record = h->job("judged");
  ASSERT_TRUE(record) << record.error().message;
  EXPECT_EQ(record->state, JobState::kStopped);
  EXPECT_EQ(record->message, "stopped at the user's request on node-a");
  EXPECT_EQ(record->parts[1].state, JobState::kFailed) << "each part still says how it ended";
  EXPECT_EQ(h->jobs(Filter{.state = JobState::kStopped})->size(), 1u);
  EXPECT_TRUE(h->jobs(Filter{.state = JobState::kFailed})->empty());

  // The id names a new job (an agent dropped the old one): its supervision goes on, and no verdict holds.
  JobStatus again = status(s, JobState::kRunning);
  again.supervision.state = SupervisionState::kFollowing;
  EXPECT_TRUE(*h->recordJob("node-a", again));
  EXPECT_EQ(h->job("judged")->state, JobState::kFailed) << "node-b's part is still the old one's";
  ASSERT_TRUE(h->recordJob("node-b", status(s, JobState::kRunning)));
  EXPECT_EQ(h->job("judged")->state, JobState::kRunning);
}

// A restart may leave the supervising agent's node out: its part stays at the attempt before, and
// it still gives the verdict on the job.
TEST(History, TheVerdictOfASupervisorARestartLeftOutIsKept) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  const JobSpec first = spec("left-out");
  JobSpec second = first;
  second.attempt = 1;
  JobStatus a = status(first, JobState::kFailed, kT0 + 1'000'000);
  a.supervision.state = SupervisionState::kRestarting;
  ASSERT_TRUE(h->recordJob("node-a", a));
  ASSERT_TRUE(h->recordJob("node-b", status(second, JobState::kFailed, kT0 + 5'000'000)));
  EXPECT_EQ(h->job("left-out")->state, JobState::kFailed);
  a.supervision = Supervision{SupervisionState::kEnded, JobState::kStopped, "stopped on request", {}};
  EXPECT_TRUE(*h->recordJob("node-a", a)) << "the verdict, from a part of the attempt before";
  EXPECT_EQ(h->job("left-out")->state, JobState::kStopped);
  EXPECT_EQ(h->job("left-out")->parts.size(), 1u) << "its part is still the replaced attempt's";
}

// The history keeps one job per id: a new job may not take the id of one it holds (lockstepctl start
// and the app's launcher ask before they launch), and says which job holds it.
TEST(History, ANewJobMayNotTakeTheIdOfAJobItHolds) {
  TempDir dir;
  const std::string path = dir.file("h.db");
  EXPECT_TRUE(checkNewJobId(path, "j-1", "delete it")) << "no history yet: it holds nothing";
  EXPECT_TRUE(checkNewJobId("", "j-1", "delete it")) << "--no-history";
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    recordFinished(*h, spec("j-1"));
  }
  const auto taken = checkNewJobId(path, "j-1", "delete it");
  ASSERT_FALSE(taken);
  EXPECT_EQ(taken.error().code, ErrorCode::kAlreadyExists);
  EXPECT_NE(taken.error().message.find("job id j-1 names a job in the history already (it started "), std::string::npos)
      << taken.error().message;
  EXPECT_NE(taken.error().message.find("give the new job another id, or delete that one from the history first (delete it)"),
            std::string::npos)
      << taken.error().message;
  EXPECT_TRUE(checkNewJobId(path, "j-2", "delete it"));
  // One that has not ended is not to be deleted: its record would stop.
  {
    auto h = History::open(path);
    ASSERT_TRUE(h);
    ASSERT_TRUE(h->recordJob("node-a", status(spec("live"), JobState::kRunning)));
    const auto live = checkNewJobId(path, "live", "delete it");
    ASSERT_FALSE(live) << "asked while another connection has the file open";
    EXPECT_NE(live.error().message.find("job id live names a job in the history that has not ended (it started "),
              std::string::npos)
        << live.error().message;
    EXPECT_NE(live.error().message.find("if it no longer runs, and its recording stopped before its end, delete it"),
              std::string::npos)
        << live.error().message;
    // A supervisor's verdict ends it, though a part (a lost node's) still reads running.
    JobStatus judged = status(spec("judged"), JobState::kStopped);
    judged.supervision = Supervision{SupervisionState::kEnded, JobState::kStopped, "stopped on request", {}};
    ASSERT_TRUE(h->recordJob("node-a", judged));
    ASSERT_TRUE(h->recordJob("node-b", status(spec("judged"), JobState::kRunning)));
    const auto ended = checkNewJobId(path, "judged", "delete it");
    ASSERT_FALSE(ended);
    EXPECT_NE(ended.error().message.find("names a job in the history already"), std::string::npos)
        << ended.error().message;
  }
  std::ofstream(dir.file("not-a-history.db")) << "just some text";
  EXPECT_TRUE(checkNewJobId(dir.file("not-a-history.db"), "j-1", "delete it"))
      << "a history it cannot read never stops a job";
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
