// Issue 2: lockstep-trainer as users run it: real processes, real Gloo all-reduce over loopback,
// real files. Each test states the behaviour it guards.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "lockstep/protocol/codec.h"
#include "bucket_plan.h"
#include "safetensors.h"
#include "support/test_support.h"
#include "support/trainer_runs.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kSmallJob = {"--layers", "32,64,10", "--dataset", "synthetic:n=2048,seed=3",
                                            "--quiet"};

TEST(TrainerProcess, TwoRanksAndAccumulationEqualOneRankWithTheWholeBatch) {
  // 2 ranks x 64 and 1 rank x 128 from the same initial weights and in-order data must reach the
  // same weights after 20 SGD steps (issue 2's equivalence test), up to float rounding of sums.
  // 2000 samples make step 16 short (80 samples: 64 + 16) and steps 17-20 a new epoch; the 2-rank
  // run uses tiny buckets, so many all-reduces overlap backward.
  TempDir dir;
  const std::vector<std::string> job = {"--layers", "32,64,10", "--dataset", "synthetic:n=2000,seed=3", "--quiet"};
  auto init = runProcess(trainer(join(job, {"--steps", "1", "--lr", "1e-12", "--seed", "5", "--save-weights",
                                            dir.file("init.safetensors"), "--metrics-out", dir.file("m0.jsonl")})),
                         {}, dir);
  ASSERT_TRUE(init.status.success()) << init.err;
  const auto common = join(job, {"--steps", "20", "--no-shuffle", "--optimizer", "sgd", "--lr", "0.05",
                                 "--momentum", "0.9", "--init-weights", dir.file("init.safetensors")});
  auto one = runProcess(trainer(join(common, {"--batch-per-rank", "128", "--save-weights", dir.file("one.safetensors"),
                                              "--metrics-out", dir.file("one.jsonl")})),
                        {}, dir);
  ASSERT_TRUE(one.status.success()) << one.err;
  auto two = runProcess(trainer(join(common, {"--nproc", "2", "--batch-per-rank", "64", "--bucket-mb", "0.001",
                                              "--save-weights", dir.file("two.safetensors"), "--metrics-out",
                                              dir.file("two.jsonl")})),
                        {}, dir);
  ASSERT_TRUE(two.status.success()) << two.err;
  // Gradient accumulation is the same computation again: 1 rank x 32 x 4 micro-steps.
  auto accum = runProcess(trainer(join(common, {"--batch-per-rank", "32", "--accum-steps", "4", "--save-weights",
                                                dir.file("accum.safetensors"), "--metrics-out", dir.file("accum.jsonl")})),
                          {}, dir);
  ASSERT_TRUE(accum.status.success()) << accum.err;
  // The weights moved (so the comparison means something) ...
  EXPECT_GT(maxRelativeDifference(dir.file("init.safetensors"), dir.file("one.safetensors")), 1e-3);
  // ... and moved the same way.
  EXPECT_LE(maxRelativeDifference(dir.file("one.safetensors"), dir.file("two.safetensors")), 1e-5);
  EXPECT_LE(maxRelativeDifference(dir.file("one.safetensors"), dir.file("accum.safetensors")), 1e-5);

  const auto lines = readJsonLines(dir.file("two.jsonl"));
  ASSERT_EQ(lines.size(), 40u);  // 20 steps x 2 ranks
  for (const auto& l : lines) {
    EXPECT_EQ(l["world_size"], 2);
    EXPECT_EQ(l["samples"], l["step"] == 16 ? (l["rank"] == 0 ? 64 : 16) : 64);
    EXPECT_GT(l["bytes_reduced"].get<std::uint64_t>(), (32u * 64 + 64 * 10) * 4u);
    EXPECT_GE(l["step_time_us"].get<std::int64_t>(),
              l["compute_time_us"].get<std::int64_t>() + l["exposed_comm_time_us"].get<std::int64_t>());
  }
}

// Issue 7: --balance dynamic. Rank 1 computes 3x slower (LOCKSTEP_TEST_SLOWDOWN stands in for
// slower hardware). Balanced, it gets fewer rows, the global batch stays whole, and the update is
// still the global-batch mean: losses and weights equal the evenly split run's (the same samples
// each step, summed in another order). How much faster the steps get is bench/balance.sh's to
// measure (timings in tests are noise on shared machines).
TEST(TrainerProcess, DynamicBalancingGivesASlowRankFewerRowsAndKeepsTheUpdate) {
  TempDir dir;
  const auto common = join(kSmallJob, {"--layers", "256,1024,512,10", "--dataset", "synthetic:n=8192,dim=256,seed=3",
                                       "--nproc", "2", "--batch-per-rank", "64", "--steps", "120", "--no-shuffle",
                                       "--optimizer", "sgd", "--lr", "0.02", "--seed", "5"});
  const Env slow = {{"LOCKSTEP_TEST_SLOWDOWN", "1:3"}};
  auto even = runProcess(trainer(join(common, {"--save-weights", dir.file("even.safetensors"), "--metrics-out",
                                               dir.file("even.jsonl")})),
                         slow, dir);
  ASSERT_TRUE(even.status.success()) << even.err;
  auto balanced = runProcess(trainer(join(common, {"--balance", "dynamic", "--rebalance-every", "10", "--save-weights",
                                                   dir.file("dynamic.safetensors"), "--metrics-out",
                                                   dir.file("dynamic.jsonl")})),
                             slow, dir);
  ASSERT_TRUE(balanced.status.success()) << balanced.err;

  // The median of a rank's rows per step over the last 60 steps.
  const auto tail = [&](const std::string& file, int rank, const char* key) {
    std::vector<double> out;
    for (const auto& l : readJsonLines(dir.file(file))) {
      if (l["rank"] == rank && l["step"].get<int>() > 60) out.push_back(l[key].get<double>());
    }
    std::sort(out.begin(), out.end());
    return out.empty() ? 0.0 : out[out.size() / 2];
  };
  EXPECT_EQ(tail("even.jsonl", 1, "samples"), 64);
  std::map<int, int> rowsOfStep;
  for (const auto& l : readJsonLines(dir.file("dynamic.jsonl"))) rowsOfStep[l["step"].get<int>()] += l["samples"].get<int>();
  ASSERT_EQ(rowsOfStep.size(), 120u);
  for (const auto& [step, rows] : rowsOfStep) EXPECT_EQ(rows, 128) << "step " << step << ": the global batch stays whole";
  EXPECT_LT(tail("dynamic.jsonl", 1, "samples"), tail("dynamic.jsonl", 0, "samples") / 2)
      << "the 3x slower rank gets well under half the fast rank's rows";
  // The same samples each step, summed in another order: rounding only, over 120 steps (20 steps
  // keep within 1e-5, TwoRanksAndAccumulation... above).
  const auto evenLosses = globalLosses(dir.file("even.jsonl")), dynamicLosses = globalLosses(dir.file("dynamic.jsonl"));
  ASSERT_EQ(evenLosses.size(), 120u);
  for (const auto& [step, loss] : evenLosses) EXPECT_NEAR(dynamicLosses.at(step), loss, 1e-4 * loss) << "step " << step;
  EXPECT_LE(maxRelativeDifference(dir.file("even.safetensors"), dir.file("dynamic.safetensors")), 1e-4);
}

TEST(TrainerProcess, LossFallsOnTheSyntheticSet) {
  // The synthetic task is learnable: from ln(4) = 1.386 the smoothed loss must fall below 0.35.
  TempDir dir;
  auto r = runProcess(trainer({"--nproc", "2", "--layers", "32,128,4", "--dataset", "synthetic:n=8192,seed=1",
                               "--batch-per-rank", "64", "--steps", "600", "--lr", "0.1", "--momentum", "0.9",
                               "--metrics-out", dir.file("m.jsonl"), "--quiet"}),
                      {}, dir);
  ASSERT_TRUE(r.status.success()) << r.err;
  const auto losses = globalLosses(dir.file("m.jsonl"));
  ASSERT_EQ(losses.size(), 600u);
  EXPECT_NEAR(losses.begin()->second, std::log(4.0), 0.2);
  double last50 = 0;
  for (std::uint64_t s = 551; s <= 600; ++s) last50 += losses.at(s) / 50;
  EXPECT_LT(last50, 0.35);
}

TEST(TrainerProcess, ResumeContinuesExactlyLikeAnUninterruptedRun) {
  TempDir dir;
  const auto job = join(kSmallJob, {"--nproc", "2", "--batch-per-rank", "32", "--optimizer", "adamw", "--lr", "0.003",
                                    "--seed", "11", "--checkpoint-every", "10"});
  auto full = runProcess(trainer(join(job, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt-full"), "--metrics-out",
                                            dir.file("full.jsonl"), "--save-weights", dir.file("full.safetensors")})),
                         {}, dir);
  ASSERT_TRUE(full.status.success()) << full.err;
  auto first = runProcess(trainer(join(job, {"--steps", "20", "--checkpoint-dir", dir.file("ckpt"), "--metrics-out",
                                             dir.file("part1.jsonl")})),
                          {}, dir);
  ASSERT_TRUE(first.status.success()) << first.err;
  auto second = runProcess(trainer(join(job, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt"), "--resume",
                                              "--metrics-out", dir.file("part2.jsonl"), "--save-weights",
                                              dir.file("resumed.safetensors")})),
                           {}, dir);
  ASSERT_TRUE(second.status.success()) << second.err;

  const auto expected = globalLosses(dir.file("full.jsonl"));
  const auto resumed = globalLosses(dir.file("part2.jsonl"));
  ASSERT_EQ(resumed.size(), 10u);
  EXPECT_EQ(resumed.begin()->first, 21u);
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, expected.at(step)) << "step " << step;
  EXPECT_EQ(maxRelativeDifference(dir.file("full.safetensors"), dir.file("resumed.safetensors")), 0.0);
}

TEST(TrainerProcess, AKilledRankMakesTheSurvivorExitInTimeNamingIt) {
  // Under --nproc: SIGKILL rank 1 mid-run; rank 0 must name it and the launcher fail within the timeout.
  TempDir dir;
  const pid_t launcher = startProcess(
      trainer(join(kSmallJob, {"--nproc", "2", "--steps", "1000000", "--timeout-s", "10", "--metrics-out",
                               dir.file("m.jsonl")})),
      {}, dir.file("out.txt"), dir.file("err.txt"));
  ASSERT_TRUE(waitUntil([&] { return readJsonLines(dir.file("m.jsonl")).size() >= 10; }, 30s)) << readText(dir.file("err.txt"));
  pid_t rank1 = -1;
  for (pid_t child : childrenOf(launcher)) {
    if (environOf(child, "RANK") == "1") rank1 = child;
  }
  ASSERT_GT(rank1, 0);
  const auto killedAt = std::chrono::steady_clock::now();
  ::kill(rank1, SIGKILL);
  auto status = waitProcess(launcher, 30s);
  ASSERT_TRUE(status.ok() && status->has_value()) << "the launcher did not exit";
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killedAt).count();
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ((**status).exitCode, 128 + SIGKILL);  // the first failure: rank 1's
  const std::string err = readText(dir.file("err.txt"));
  EXPECT_NE(err.find("rank 0: error: rank 0 lost rank 1 (its process is gone: exited with signal 9"), std::string::npos) << err;
}

struct ManualRanks {
  TempDir dir;
  std::uint16_t port = freePort();
  std::vector<pid_t> pids;

  void start(int world, const std::vector<std::string>& args) {
    for (int r = 0; r < world; ++r) {
      pids.push_back(startProcess(trainer(args),
                                  {{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)},
                                   {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}},
                                  dir.file("out" + std::to_string(r)), dir.file("err" + std::to_string(r))));
    }
  }
  ~ManualRanks() {
    for (pid_t p : pids) {
      ::kill(p, SIGKILL);
      (void)waitProcess(p, 5s);
    }
  }
};

TEST(TrainerProcess, LosingRankZeroAndItsStoreIsNamedToo) {
  // torchrun-style ranks (rank 0 hosts the store): SIGKILL rank 0; rank 1 exits 3 naming rank 0.
  ManualRanks ranks;
  ranks.start(2, join(kSmallJob, {"--steps", "1000000", "--timeout-s", "10", "--metrics-out", ranks.dir.file("m.jsonl")}));
  ASSERT_TRUE(waitUntil([&] { return readJsonLines(ranks.dir.file("m.jsonl")).size() >= 10; }, 30s))
      << readText(ranks.dir.file("err1"));
  ::kill(ranks.pids[0], SIGKILL);
  auto status = waitProcess(ranks.pids[1], 20s);
  ASSERT_TRUE(status.ok() && status->has_value()) << "rank 1 hangs";
  EXPECT_EQ((**status).exitCode, 3);
  const std::string err = readText(ranks.dir.file("err1"));
  EXPECT_NE(err.find("rank 1 lost rank 0"), std::string::npos) << err;
}

TEST(TrainerProcess, AHungPeerTimesOutAndIsNamed) {
  // SIGSTOP rank 1: rank 0's all-reduce times out (3 s) and it names rank 1 as the one not progressing.
  ManualRanks ranks;
  ranks.start(2, join(kSmallJob, {"--steps", "1000000", "--timeout-s", "3", "--metrics-out", ranks.dir.file("m.jsonl")}));
  ASSERT_TRUE(waitUntil([&] { return readJsonLines(ranks.dir.file("m.jsonl")).size() >= 10; }, 30s));
  ::kill(ranks.pids[1], SIGSTOP);
  const auto stoppedAt = std::chrono::steady_clock::now();
  auto status = waitProcess(ranks.pids[0], 20s);
  ASSERT_TRUE(status.ok() && status->has_value()) << "rank 0 hangs";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - stoppedAt).count(), 3 + 5.0);
  EXPECT_EQ((**status).exitCode, 3);
  const std::string err = readText(ranks.dir.file("err0"));
  EXPECT_NE(err.find("rank 0 lost rank 1 (no heartbeat for"), std::string::npos) << err;
}

TEST(TrainerProcess, SigtermStopsAllRanksTogetherWithACheckpoint) {
  TempDir dir;
  const pid_t launcher = startProcess(
      trainer(join(kSmallJob, {"--nproc", "2", "--steps", "1000000", "--checkpoint-dir", dir.file("ckpt"),
                               "--checkpoint-every", "100000", "--metrics-out", dir.file("m.jsonl")})),
      {}, dir.file("out.txt"), dir.file("err.txt"));
  ASSERT_TRUE(waitUntil([&] { return readJsonLines(dir.file("m.jsonl")).size() >= 10; }, 30s));
  ::kill(launcher, SIGTERM);
  auto status = waitProcess(launcher, 30s);
  ASSERT_TRUE(status.ok() && status->has_value());
  EXPECT_EQ((**status).exitCode, 128 + SIGTERM);
  const auto lines = readJsonLines(dir.file("m.jsonl"));
  std::map<int, std::uint64_t> lastStep;
  for (const auto& l : lines) lastStep[l["rank"].get<int>()] = l["step"].get<std::uint64_t>();
  ASSERT_EQ(lastStep.size(), 2u);
  EXPECT_EQ(lastStep[0], lastStep[1]) << "the ranks stopped at different steps";
  char name[64];
  std::snprintf(name, sizeof name, "step-%08llu.safetensors", static_cast<unsigned long long>(lastStep[0]));
  EXPECT_TRUE(std::filesystem::exists(dir.path() / "ckpt" / name)) << readText(dir.file("err.txt"));
}

TEST(TrainerProcess, AnUsedCheckpointDirectoryNeedsResume) {
  // Without --resume, retention would delete the new run's checkpoints in favour of older ones.
  TempDir dir;
  const auto job = join(kSmallJob, {"--steps", "4", "--checkpoint-dir", dir.file("ckpt"), "--checkpoint-every", "2",
                                    "--metrics-out", dir.file("m.jsonl")});
  auto first = runProcess(trainer(job), {}, dir);
  ASSERT_TRUE(first.status.success()) << first.err;
  auto again = runProcess(trainer(job), {}, dir);
  EXPECT_EQ(again.status.exitCode, 2);
  EXPECT_NE(again.err.find("already holds checkpoints"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--resume"), std::string::npos) << again.err;
}

TEST(TrainerProcess, StepReportsArePushedToTheReportEndpoint) {
  TempDir dir;
  zmq::context_t context(1);
  zmq::socket_t pull(context, zmq::socket_type::pull);
  pull.bind("tcp://127.0.0.1:*");
  const std::string endpoint = pull.get(zmq::sockopt::last_endpoint);
  auto r = runProcess(trainer(join(kSmallJob, {"--steps", "5", "--job-id", "job-7", "--metrics-out", dir.file("m.jsonl")})),
                      {{"LOCKSTEP_REPORT", endpoint}}, dir);
  ASSERT_TRUE(r.status.success()) << r.err;
  pull.set(zmq::sockopt::rcvtimeo, 5000);
  for (std::uint64_t i = 1; i <= 5; ++i) {
    zmq::message_t msg;
    ASSERT_TRUE(pull.recv(msg)) << "report " << i << " did not arrive";
    auto decoded = decodeStreamMessage(msg.to_string_view());
    ASSERT_TRUE(decoded.ok()) << decoded.error().message;
    EXPECT_EQ(decoded->seq, i);
    const auto& report = std::get<StepReport>(decoded->payload);
    EXPECT_EQ(report.jobId, "job-7");
    EXPECT_EQ(report.step, i);
    EXPECT_EQ(report.samples, 64u);
    EXPECT_GT(report.stepTimeUs, 0);
  }
}

// ---- gradient buckets (issue 34) ----

const std::vector<std::string> kReferenceModel = {"--layers", "784,1024,1024,10", "--dataset",
                                                  "synthetic:n=8192,dim=784,classes=10,seed=1", "--log-every", "1000"};

// The count in a plan's note: "buckets: 4 buckets of ~2.4 MB".
int bucketsIn(const std::string& note) {
  const auto at = note.find("buckets: ");
  return at == std::string::npos ? -1 : std::atoi(note.c_str() + at + 9);
}

std::string lineWith(const std::string& text, const std::string& part) {
  const auto at = text.find(part);
  if (at == std::string::npos) return "";
  const auto begin = text.rfind('\n', at), end = text.find('\n', at);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end == std::string::npos ? end : end - begin - 1);
}

TEST(TrainerProcess, BucketsAreChosenByMeasurementUnlessTheUserGivesASize) {
  TempDir dir;
  auto chosen = runProcess(trainer(join(kReferenceModel, {"--nproc", "2", "--steps", "20"})), {}, dir);
  ASSERT_TRUE(chosen.status.success()) << chosen.err;
  const std::string plan = lineWith(chosen.err, "buckets: ");
  for (const char* part : {"chosen from all-reduce", "among 2 ranks", "backward", "compute slowed",
                           "expected exposed communication", "measured in"}) {
    EXPECT_NE(plan.find(part), std::string::npos) << part << " in: " << chosen.err;
  }
  EXPECT_GE(bucketsIn(plan), 2) << plan;  // the first bucket is at most 1 MiB of 7.5 MB
  EXPECT_NE(chosen.err.find("| " + std::to_string(bucketsIn(plan)) + " buckets |"), std::string::npos) << chosen.err;

  auto given = runProcess(trainer(join(kReferenceModel, {"--nproc", "2", "--steps", "5", "--bucket-mb", "0.5"})), {}, dir);
  ASSERT_TRUE(given.status.success()) << given.err;
  const auto halfMegabyte = trainer::cappedBuckets(trainer::ParamLayout({784, 1024, 1024, 10}), 512 << 10).size();
  EXPECT_NE(given.err.find("buckets: " + std::to_string(halfMegabyte) + " buckets of ~0.5 MB (--bucket-mb 0.5)"),
            std::string::npos)
      << given.err;
  EXPECT_EQ(given.err.find("chosen from"), std::string::npos) << given.err;
  EXPECT_EQ(given.err.find("measured in"), std::string::npos) << given.err;

  auto three = runProcess(trainer(join(kReferenceModel, {"--nproc", "3", "--steps", "5", "--batch-per-rank", "32"})), {}, dir);
  ASSERT_TRUE(three.status.success()) << three.err;
  EXPECT_NE(lineWith(three.err, "buckets: ").find("among 3 ranks"), std::string::npos) << three.err;
}

TEST(TrainerProcess, ALinkThatSlowsDownMidRunIsReplannedOnEveryRankAlike) {
  // From the 20th step, every rank's every all-reduce takes 3 ms longer (a test knob standing in
  // for a slower link). The check after step 100 sees it, on both ranks;
  // a fixed cost per all-reduce that large calls for the fewest buckets, and both ranks change
  // plans at that step boundary: a rank on another plan would reduce other ranges than its peer,
  // and the job would fail or time out (in 20 s) instead of finishing.
  TempDir dir;
  auto r = runProcess(trainer(join(kReferenceModel, {"--nproc", "2", "--steps", "120", "--timeout-s", "20",
                                                     "--metrics-out", dir.file("m.jsonl")})),
                      {{"LOCKSTEP_TEST_COMM_DELAY", "all:3000:20"}}, dir, 120s);
  ASSERT_TRUE(r.status.success()) << r.err;
  EXPECT_EQ(readJsonLines(dir.file("m.jsonl")).size(), 240u) << "both ranks, every step";
  const std::string first = lineWith(r.err, "buckets: "), replanned = lineWith(r.err, "re-planned after step 100:");
  if (bucketsIn(first) <= 2) {
    // A machine busy enough to hide every overlap at start-up plans the fewest buckets already;
    // then fewer is not to be had, and what it measures later is as noisy as what it measured
    // first (BucketPlan.ALinkThatSlowsDown… checks the decision on figures given).
    return;
  }
  ASSERT_FALSE(replanned.empty()) << r.err;
  EXPECT_EQ(bucketsIn(replanned), 2) << replanned;
  EXPECT_NE(replanned.find("all-reduce took"), std::string::npos) << replanned;
}

TEST(TrainerProcess, ANodeWhoseSharedMemoryIsTooSmallKeepsToGloo) {
  // The ranks' gradients live in /dev/shm (shm_comm.h): 15 MB for this model. In a mount
  // namespace of its own with a 1 MB /dev/shm, the segment is refused at start-up and the job
  // all-reduces through Gloo; it must not die of SIGBUS at its first step.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace";
  TempDir dir;
  std::vector<std::string> argv = {"/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                                   "mount -t tmpfs -o size=1m tmpfs /dev/shm && exec \"$0\" \"$@\""};
  for (const auto& arg : trainer(join(kReferenceModel, {"--nproc", "2", "--steps", "20", "--bucket-mb", "1"}))) argv.push_back(arg);
  auto r = runProcess(argv, {}, dir, 120s);
  ASSERT_TRUE(r.status.success()) << r.err;
  EXPECT_NE(r.err.find("done: steps 1..20"), std::string::npos) << r.err;
}

// ---- bad input: a clear error and exit code 2, never a crash ----

struct BadInput {
  const char* name;
  std::function<std::vector<std::string>(const TempDir&)> setUp;
  const char* expectedText;
};

void PrintTo(const BadInput& b, std::ostream* os) { *os << b.name; }

class TrainerBadInput : public ::testing::TestWithParam<BadInput> {};

void writeFeatures(const TempDir& dir, const std::string& name, std::uint64_t n, std::uint64_t d) {
  std::vector<float> x(n * d, 0.5f);
  writeNpy(dir.file(name), "<f4", {n, d}, x.data(), x.size() * 4);
}

void writeLabels(const TempDir& dir, const std::string& name, std::uint64_t n, std::int64_t value = 1) {
  std::vector<std::int64_t> y(n, value);
  writeNpy(dir.file(name), "<i8", {n}, y.data(), y.size() * 8);
}

std::vector<std::string> npyJob(const TempDir& dir, const std::string& layers = "8,16,3") {
  return {"--layers", layers, "--steps", "2", "--dataset", "npy:" + dir.file("x.npy") + "," + dir.file("y.npy")};
}

TEST_P(TrainerBadInput, FailsClearly) {
  TempDir dir;
  auto r = runProcess(trainer(GetParam().setUp(dir)), {}, dir, 60s);
  EXPECT_FALSE(r.timedOut);
  EXPECT_EQ(r.status.signal, 0) << "crashed: " << r.err;
  EXPECT_EQ(r.status.exitCode, 2) << r.err;
  EXPECT_NE(r.err.find(GetParam().expectedText), std::string::npos) << r.err;
}

INSTANTIATE_TEST_SUITE_P(
    Issue2, TrainerBadInput,
    ::testing::Values(
        BadInput{"MissingFeatures", [](const TempDir& d) { writeLabels(d, "y.npy", 4); return npyJob(d); },
                 "cannot open the features file"},
        BadInput{"MissingFeaturesUnderLauncher",
                 [](const TempDir& d) { writeLabels(d, "y.npy", 4); return join(npyJob(d), {"--nproc", "2"}); },
                 "cannot open the features file"},
        BadInput{"Float64Features",
                 [](const TempDir& d) {
                   std::vector<double> x(4 * 8, 0.5);
                   writeNpy(d.file("x.npy"), "<f8", {4, 8}, x.data(), x.size() * 8);
                   writeLabels(d, "y.npy", 4);
                   return npyJob(d);
                 },
                 "must be float32"},
        BadInput{"ThreeDimensionalFeatures",
                 [](const TempDir& d) {
                   std::vector<float> x(4 * 2 * 4, 0.5f);
                   writeNpy(d.file("x.npy"), "<f4", {4, 2, 4}, x.data(), x.size() * 4);
                   writeLabels(d, "y.npy", 4);
                   return npyJob(d);
                 },
                 "must be 2-D"},
        BadInput{"LayerDoesNotMatchFeatures",
                 [](const TempDir& d) { writeFeatures(d, "x.npy", 4, 8); writeLabels(d, "y.npy", 4); return npyJob(d, "6,16,3"); },
                 "8 features per sample but the first layer size is 6"},
        BadInput{"LabelCountMismatch",
                 [](const TempDir& d) { writeFeatures(d, "x.npy", 4, 8); writeLabels(d, "y.npy", 5); return npyJob(d); },
                 "hold 5 labels but the features hold 4 samples"},
        BadInput{"LabelOutOfRange",
                 [](const TempDir& d) { writeFeatures(d, "x.npy", 4, 8); writeLabels(d, "y.npy", 4, 3); return npyJob(d); },
                 "label 3 at index 0 is outside [0, 3)"},
        BadInput{"FloatLabels",
                 [](const TempDir& d) {
                   writeFeatures(d, "x.npy", 4, 8);
                   std::vector<float> y(4, 1.0f);
                   writeNpy(d.file("y.npy"), "<f4", {4}, y.data(), 16);
                   return npyJob(d);
                 },
                 "must be integers"},
        BadInput{"TruncatedFeatures",
                 [](const TempDir& d) {
                   std::vector<float> x(4 * 8, 0.5f);
                   writeNpy(d.file("x.npy"), "<f4", {4, 8}, x.data(), 20 * 4);
                   writeLabels(d, "y.npy", 4);
                   return npyJob(d);
                 },
                 "the file is truncated"},
        BadInput{"NotNpyAtAll",
                 [](const TempDir& d) {
                   std::ofstream(d.file("x.npy")) << "a,b,c\n1,2,3\n";
                   writeLabels(d, "y.npy", 4);
                   return npyJob(d);
                 },
                 "is not a NumPy .npy file"},
        BadInput{"UnknownFlag", [](const TempDir&) { return std::vector<std::string>{"--layers", "8,3", "--steps", "1", "--turbo"}; },
                 "unknown option --turbo"},
        BadInput{"BadLayers", [](const TempDir&) { return std::vector<std::string>{"--layers", "8,x,3", "--steps", "1"}; },
                 "'x' is not a whole number"},
        BadInput{"InitWeightsMissing",
                 [](const TempDir& d) { return join(kSmallJob, {"--steps", "1", "--init-weights", d.file("none.safetensors")}); },
                 "--init-weights: cannot open"},
        BadInput{"InitWeightsMissingUnderLauncher",
                 [](const TempDir& d) {
                   return join(kSmallJob, {"--nproc", "2", "--steps", "1", "--init-weights", d.file("none.safetensors")});
                 },
                 "--init-weights: cannot open"},
        BadInput{"InitWeightsWrongShape",
                 [](const TempDir& d) {
                   const std::vector<float> w(16 * 8), b(16), w2(3 * 16), b2(3);
                   std::ofstream(d.file("w.safetensors"), std::ios::binary)
                       << trainer::encodeSafetensors({{"layers.0.weight", {16, 8}, w.data()}, {"layers.0.bias", {16}, b.data()},
                                                      {"layers.1.weight", {3, 16}, w2.data()}, {"layers.1.bias", {3}, b2.data()}},
                                                     {});
                   return join(kSmallJob, {"--steps", "1", "--init-weights", d.file("w.safetensors")});
                 },
                 "has shape [16, 8] but the model needs [64, 32]"}),
    [](const auto& param) { return std::string(param.param.name); });

TEST(TrainerProcess, InconsistentTorchrunEnvironmentIsRefused) {
  TempDir dir;
  auto r = runProcess(trainer(join(kSmallJob, {"--steps", "1"})), {{"RANK", "2"}, {"WORLD_SIZE", "2"}}, dir);
  EXPECT_EQ(r.status.exitCode, 2);
  EXPECT_NE(r.err.find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << r.err;
  r = runProcess(trainer(join(kSmallJob, {"--steps", "1"})), {{"RANK", "0"}, {"WORLD_SIZE", "2"}}, dir);
  EXPECT_EQ(r.status.exitCode, 2);
  EXPECT_NE(r.err.find("MASTER_ADDR is required"), std::string::npos) << r.err;
}

TEST(TrainerProcess, AMissingPeerIsATimeoutNotAHang) {
  // Only rank 0 of 2 starts: the rendezvous gives up after --timeout-s and says what to check.
  TempDir dir;
  auto r = runProcess(trainer(join(kSmallJob, {"--steps", "5", "--timeout-s", "2"})),
                      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                       {"MASTER_PORT", std::to_string(freePort())}},
                      dir, 30s);
  EXPECT_FALSE(r.timedOut) << "rank 0 waits forever for its peer";
  EXPECT_EQ(r.status.exitCode, 3) << r.err;
  EXPECT_NE(r.err.find("could not connect to its 1 peers"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lockstep::test
