// Issue 45: the parameter server (--sync parameter-server) and asynchronous training
// (--staleness K), as users run them: real trainer processes, the server on its own Gloo mesh,
// real checkpoint files.

#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <map>
#include <set>

#include "support/test_support.h"
#include "support/trainer_runs.h"

namespace lockstep::test {
namespace {

const std::vector<std::string> kJob = {"--layers", "32,64,10", "--dataset", "synthetic:n=2048,seed=3", "--quiet",
                                       "--batch-per-rank", "32", "--optimizer", "adamw", "--lr", "0.003",
                                       "--seed", "11", "--no-shuffle"};

bool hasCollective(const nlohmann::json& line, const std::string& kind) {
  const auto c = collectiveOf(line, kind);
  return !c.is_null() && c["count"] == 1 && c["bytes"].get<std::uint64_t>() > 0;
}

// At staleness 0 the server sums every rank's gradient in rank order, as the all-reduce does on
// one node, and makes one update of the global batch: the same training, bit for bit.
TEST(ParameterServer, SynchronousTrainsAsAllReduceDoes) {
  TempDir dir;
  const TrainerRun reduced = train(dir, "allreduce", kJob, {"--nproc", "3", "--steps", "20"});
  ASSERT_TRUE(reduced.process.status.success()) << reduced.process.err;
  const TrainerRun served = train(dir, "server", kJob, {"--nproc", "3", "--steps", "20", "--sync", "parameter-server"});
  ASSERT_TRUE(served.process.status.success()) << served.process.err;
  const auto expected = globalLosses(dir.file("allreduce.jsonl")), got = globalLosses(dir.file("server.jsonl"));
  ASSERT_EQ(got.size(), 20u);
  for (const auto& [step, loss] : got) EXPECT_EQ(loss, expected.at(step)) << "step " << step;
  EXPECT_EQ(maxRelativeDifference(dir.file("allreduce.safetensors"), dir.file("server.safetensors")), 0.0);

  ASSERT_EQ(served.lines.size(), 60u);
  for (const auto& l : served.lines) {
    EXPECT_TRUE(hasCollective(l, "push") && hasCollective(l, "pull")) << l.dump();
    EXPECT_TRUE(l.value("staleness", nlohmann::json()).is_null()) << "synchronous: no gradient is stale";
    // The server's optimizer state and master weights live in rank 0's process only (its state
    // has no room for the 128 header floats, which the all-reduce's optimizer keeps: AdamW, 2 buffers).
    if (l["rank"] == 0) {
      EXPECT_EQ(l["param_bytes"], 2 * reduced.lines[0]["param_bytes"].get<std::uint64_t>());
      EXPECT_EQ(l["optimizer_state_bytes"], reduced.lines[0]["optimizer_state_bytes"].get<std::uint64_t>() - 2 * 128 * 4);
    } else {
      EXPECT_EQ(l["optimizer_state_bytes"], 0);
    }
  }
}

// Rank 1 computes 4x slower. Synchronous, every update waits for it; asynchronous, rank 0 goes on
// with fresher weights, within the bound, and the loss still falls.
TEST(ParameterServer, AsynchronousLetsAFastRankGoOnWithinTheStalenessBound) {
  TempDir dir;
  const std::vector<std::string> job = {"--layers", "64,512,512,10", "--dataset", "synthetic:n=16384,seed=3", "--quiet",
                                        "--batch-per-rank", "256", "--optimizer", "sgd", "--lr", "0.05", "--steps", "120",
                                        "--nproc", "2", "--sync", "parameter-server"};
  const Env slow = {{"LOCKSTEP_TEST_SLOWDOWN", "1:4"}};
  const TrainerRun sync = train(dir, "sync", job, {}, slow);
  ASSERT_TRUE(sync.process.status.success()) << sync.process.err;
  const TrainerRun async = train(dir, "async", job, {"--staleness", "3"}, slow);
  ASSERT_TRUE(async.process.status.success()) << async.process.err;

  auto [updates, lossByStep] = asyncUpdates(async.lines, 3);
  EXPECT_EQ(lossByStep.size(), 120u) << "--steps counts the server's updates";
  EXPECT_GE(updates[0], 2 * updates[1]) << "the fast rank did not wait for the slow one";
  // Faster to the same number of updates, from the first report to the last (start-up left out),
  // by far more than a busy machine's noise (measured: about 0.3 of the synchronous time).
  const auto span = [](const std::vector<nlohmann::json>& lines) {
    std::int64_t first = INT64_MAX, last = 0;
    for (const auto& l : lines) {
      first = std::min(first, l["time_unix_us"].get<std::int64_t>());
      last = std::max(last, l["time_unix_us"].get<std::int64_t>());
    }
    return static_cast<double>(last - first);
  };
  EXPECT_LT(span(async.lines), 0.8 * span(sync.lines)) << span(async.lines) << " vs " << span(sync.lines) << " us";
  double first = 0, last = 0;
  for (std::uint64_t s = 1; s <= 20; ++s) first += lossByStep.at(s), last += lossByStep.at(120 - s + 1);
  EXPECT_LT(last, 0.95 * first) << "the loss falls";
}

// --ps-ranks N: the server split by parameter ranges over ranks 0..N-1, each part holding its range
// of the master and of the optimizer state: the same training as one server, and as all-reduce.
TEST(ParameterServer, SplitOverRanksItTrainsAsOneServerWithEachPartOnItsRank) {
  TempDir dir;
  const TrainerRun reduced = train(dir, "allreduce", kJob, {"--nproc", "3", "--steps", "20"});
  ASSERT_TRUE(reduced.process.status.success()) << reduced.process.err;
  const auto state = reduced.lines[0]["optimizer_state_bytes"].get<double>() - 2 * 128 * 4;
  for (const std::string parts : {"2", "3"}) {
    SCOPED_TRACE(parts + " parts");
    const TrainerRun served = train(dir, "split" + parts, kJob, {"--nproc", "3", "--steps", "20", "--sync",
                                                                  "parameter-server", "--ps-ranks", parts});
    ASSERT_TRUE(served.process.status.success()) << served.process.err;
    const auto expected = globalLosses(dir.file("allreduce.jsonl")), got = globalLosses(dir.file("split" + parts + ".jsonl"));
    ASSERT_EQ(got.size(), 20u);
    for (const auto& [step, loss] : got) EXPECT_EQ(loss, expected.at(step)) << "step " << step;
    EXPECT_EQ(maxRelativeDifference(dir.file("allreduce.safetensors"), dir.file("split" + parts + ".safetensors")), 0.0);
    const int n = std::stoi(parts);
    for (const auto& l : served.lines) {
      EXPECT_EQ(collectiveOf(l, "push")["count"], n) << "one push to each part: " << l.dump();
      EXPECT_EQ(collectiveOf(l, "pull")["count"], n) << l.dump();
      if (l["rank"].get<int>() < n) {
        // Its part of the state, give or take the parts' alignment (128 floats, two buffers).
        EXPECT_NEAR(l["optimizer_state_bytes"].get<double>(), state / n, 2 * 128 * 4) << l.dump();
      } else {
        EXPECT_EQ(l["optimizer_state_bytes"], 0) << l.dump();
      }
    }
  }
}

// The server writes the checkpoints: a synchronous run resumes exactly.
TEST(ParameterServer, TheSynchronousServersRunResumesExactly) {
  TempDir dir;
  const auto job = join(kJob, {"--nproc", "2", "--sync", "parameter-server", "--checkpoint-every", "10"});
  const TrainerRun full = train(dir, "full", job, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt-full")});
  ASSERT_TRUE(full.process.status.success()) << full.process.err;
  const TrainerRun first = train(dir, "first", job, {"--steps", "20", "--checkpoint-dir", dir.file("ckpt")});
  ASSERT_TRUE(first.process.status.success()) << first.process.err;
  const TrainerRun resumed = train(dir, "resumed", job, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt"), "--resume"});
  ASSERT_TRUE(resumed.process.status.success()) << resumed.process.err;
  expectResumedAsWhole(dir, "full", "resumed", 10);

  // Split over both ranks, from the same checkpoint: the parts gather their ranges into part 0's
  // file, and the run goes on as one server's did.
  const auto split = join(kJob, {"--nproc", "2", "--sync", "parameter-server", "--checkpoint-every", "10", "--ps-ranks", "2"});
  const TrainerRun fullSplit = train(dir, "full-split", split, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt-split")});
  ASSERT_TRUE(fullSplit.process.status.success()) << fullSplit.process.err;
  EXPECT_EQ(globalLosses(dir.file("full-split.jsonl")), globalLosses(dir.file("full.jsonl")));
  std::filesystem::remove(dir.file("ckpt-split/step-00000030.safetensors"));
  const TrainerRun resumedSplit = train(dir, "resumed-split", split, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt-split"), "--resume"});
  ASSERT_TRUE(resumedSplit.process.status.success()) << resumedSplit.process.err;
  expectResumedAsWhole(dir, "full", "resumed-split", 10);
}

// Three ranks start on the same weights, so the bound must hold for each of them in turn, not only
// for the oldest; and at an epoch's end a rank's slice may be empty, which makes no update.
TEST(ParameterServer, TheStalenessBoundHoldsForEveryRankAndAnEmptySliceMakesNoUpdate) {
  TempDir dir;
  for (const char* slow : {"0:3", "2:3"}) {
    const TrainerRun run = train(dir, "bound", kJob, {"--nproc", "3", "--steps", "90", "--sync", "parameter-server",
                                                      "--staleness", "2"}, {{"LOCKSTEP_TEST_SLOWDOWN", slow}});
    ASSERT_TRUE(run.process.status.success()) << run.process.err;
    std::set<std::uint64_t> steps;
    for (const auto& l : run.lines) {
      EXPECT_LE(l["staleness"].get<int>(), 2) << slow << ": " << l.dump();
      EXPECT_GT(l["samples"].get<int>(), 0) << "a step of no samples is no update: " << l.dump();
      EXPECT_TRUE(l["global_loss"].is_number() && std::isfinite(l["global_loss"].get<double>())) << l.dump();
      steps.insert(l["step"].get<std::uint64_t>());
    }
    EXPECT_EQ(steps.size(), 90u) << slow;
  }
}

// A job resumed from the checkpoint of its last step has nothing to do, and ends at once.
TEST(ParameterServer, ResumedAtItsLastStepItEndsAtOnce) {
  TempDir dir;
  const auto job = join(kJob, {"--nproc", "2", "--sync", "parameter-server", "--steps", "10", "--checkpoint-every", "5",
                               "--checkpoint-dir", dir.file("ckpt"), "--timeout-s", "20"});
  ASSERT_TRUE(train(dir, "first", job, {}).process.status.success());
  const TrainerRun again = train(dir, "again", job, {"--resume"});
  EXPECT_TRUE(again.process.status.success()) << again.process.err;
  EXPECT_LT(again.process.seconds, 15) << "it waited for pushes that never come";
}

TEST(ParameterServer, SettingsThatCannotWorkAreRefusedClearly) {
  TempDir dir;
  const struct {
    std::vector<std::string> flags;
    std::string says;
  } cases[] = {
      {{"--nproc", "3", "--sync", "parameter-server", "--staleness", "1", "--steps", "2"},
       "--staleness 1 with 3 ranks: each update is one rank's gradient, so even in lockstep a gradient is 2 updates old"},
      {{"--nproc", "2", "--staleness", "2", "--steps", "2"}, "--staleness goes with --sync parameter-server"},
      {{"--nproc", "2", "--sync", "parameter-server", "--shard", "optimizer", "--steps", "2"}, "use --shard none with it"},
      {{"--nproc", "2", "--sync", "sometimes", "--steps", "2"}, "is not one of allreduce, parameter-server"},
      {{"--nproc", "2", "--sync", "parameter-server", "--staleness", "1", "--epochs", "1"}, "give --steps, not --epochs"},
      {{"--nproc", "2", "--sync", "parameter-server", "--ps-ranks", "3", "--steps", "2"},
       "--ps-ranks 3 with 2 ranks: the server's parts live in ranks' processes, one part each"},
      {{"--nproc", "3", "--sync", "parameter-server", "--ps-ranks", "2", "--staleness", "2", "--steps", "2"},
       "a server split over ranks is synchronous only for now"},
      {{"--nproc", "2", "--ps-ranks", "2", "--steps", "2"}, "--ps-ranks goes with --sync parameter-server"},
  };
  for (const auto& c : cases) {
    const TrainerRun run = train(dir, "bad", kJob, c.flags);
    EXPECT_FALSE(run.process.status.success()) << join(c.flags, {}).front();
    EXPECT_NE(run.process.err.find(c.says), std::string::npos) << run.process.err;
  }
  // The server also serves GPU ranks: here the job gets as far as looking for a GPU.
  const TrainerRun gpu = train(dir, "gpu", kJob, {"--nproc", "2", "--sync", "parameter-server", "--steps", "2",
                                                  "--backend", "cuda"});
  expectTheGpuBackendTakesIt(gpu);
}

}  // namespace
}  // namespace lockstep::test
