// Issue 34: the trainer chooses its gradient buckets from measurements. The planner on worked
// examples (timing figures given, the plan or forecast expected), and the agreement between real
// processes over real Gloo: ranks that measured differently still choose one plan.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <sstream>

#include "bucket_measure.h"
#include "bucket_plan.h"
#include "comm.h"
#include "lockstep/common/store.h"
#include "model.h"
#include "shm_comm.h"

namespace lockstep::trainer {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// A backward that makes the buffer final at an even pace over `micros`.
PlanFigures evenBackward(const ParamLayout& layout, double micros) {
  PlanFigures f;
  f.readyEnds = {layout.totalFloats()};
  f.readyMicros = {micros};
  return f;
}

CommCurve affine(double fixedMicros, double microsPerMiB) {
  CommCurve c;
  for (double bytes : {64.0 * 1024, 1.0 * kMiB, 8.0 * kMiB}) {
    c.bytes.push_back(bytes);
    c.micros.push_back(fixedMicros + microsPerMiB * bytes / kMiB);
  }
  return c;
}

TEST(BucketPlan, TheCurveIsLinearBetweenPointsAndBeyondAndNeverBelowTheSmallest) {
  const CommCurve c = affine(100, 500);
  EXPECT_DOUBLE_EQ(c.at(1024), c.micros[0]);                 // below the first point: its time
  EXPECT_NEAR(c.at(0.5 * kMiB), 100 + 250, 1e-6);            // between
  EXPECT_NEAR(c.at(16 * kMiB), 100 + 8000, 1e-6);            // beyond: the fit's slope
  EXPECT_EQ(c.describe(), "all-reduce 0.10 ms + 0.50 ms/MB");
  const CommCurve noisy{{64.0 * 1024, 1.0 * kMiB}, {400, 300}};  // the larger measured quicker
  EXPECT_EQ(noisy.describe(), "all-reduce 0.35 ms + 0.00 ms/MB");
  EXPECT_DOUBLE_EQ(noisy.at(kMiB), 400);
  EXPECT_DOUBLE_EQ(noisy.at(8 * kMiB), 400);
}

TEST(BucketPlan, TwoNeighbouringSizesDoNotSetTheSlopeBeyondThem) {
  // A re-plan's window: 10 ms whatever the size, two buckets 2.6 KB apart 71 us apart by noise
  // (as measured in CI). The last segment's slope, 27 ms/MB, made 6 MB cost 57 ms, so no plan with
  // larger buckets could win; the fit over all points says 11.3 ms.
  const CommCurve window{{1045504, 1426880, 2490368, 2492992}, {10372, 10448, 10572, 10643}};
  EXPECT_NEAR(window.at(6.4e6), 10643 + window.fit().microsPerByte * (6.4e6 - 2492992), 1e-6);
  EXPECT_LT(window.at(6.4e6), 12000);
}

TEST(BucketPlan, ASimulatedStepByHand) {
  // Two buckets, final at 2 ms and 4 ms of backward; every all-reduce 1 ms; no optimizer.
  const ParamLayout layout({256, 1024, 10});
  const std::vector<Bucket> two = {{0, layout.bias(0).offset}, {layout.bias(0).offset, layout.totalFloats()}};
  PlanFigures f;
  f.readyEnds = {two[0].end, two[1].end};
  f.readyMicros = {2000, 4000};
  f.allReduce.bytes = {4};
  f.allReduce.micros = {1000};
  // Communication beside compute for free: the first hides behind backward, the second is exposed.
  StepForecast free = simulateStep(two, f);
  EXPECT_NEAR(free.stepMicros, 5000, 1e-6);
  EXPECT_NEAR(free.exposedMicros, 1000, 1e-6);
  EXPECT_NEAR(free.backwardEndMicros, 4000, 1e-6);
  // Communication that stops compute: backward ends 1 ms later, the second all-reduce after it.
  f.contention = 1;
  StepForecast stopped = simulateStep(two, f);
  EXPECT_NEAR(stopped.stepMicros, 6000, 1e-6);
  EXPECT_NEAR(stopped.exposedMicros, 1000, 1e-6);
  EXPECT_NEAR(stopped.backwardEndMicros, 5000, 1e-6);
  // The optimizer of the first bucket (0.5 ms) runs while the second is reduced.
  f.contention = 0;
  f.optimizerMicrosPerFloat = 500.0 / static_cast<double>(two[0].end);
  StepForecast withOptimizer = simulateStep(two, f);
  EXPECT_NEAR(withOptimizer.exposedMicros, 500, 1e-6);
  EXPECT_NEAR(withOptimizer.stepMicros, 5000 + 500.0 / two[0].end * (two[1].end - two[1].begin), 1e-3);
}

TEST(BucketPlan, ALongBackwardOrBadFiguresEndTheSimulation) {
  // A 28.9 s backward: the last end's time, interpolated, came out a rounding step above the
  // backward's end, and the simulation waited for it forever.
  PlanFigures f;
  f.readyEnds = {78348519};
  f.readyMicros = {28901887.8};
  f.allReduce.bytes = {4};
  f.allReduce.micros = {1000};
  const std::vector<Bucket> one = {{0, 78348519}}, two = {{0, 1000}, {1000, 78348519}};
  EXPECT_NEAR(simulateStep(one, f).stepMicros, 28901887.8 + 1000, 1e-3);
  EXPECT_NEAR(simulateStep(two, f).exposedMicros, 1000, 1e-3);
  for (std::size_t points : {3u, 7u, 33u}) {  // and with the end interpolated between points
    f.readyEnds.clear();
    f.readyMicros.clear();
    for (std::size_t i = 1; i <= points; ++i) {
      f.readyEnds.push_back(78348519 * i / points);
      f.readyMicros.push_back(28901887.8 * static_cast<double>(i) / points);
    }
    EXPECT_TRUE(std::isfinite(simulateStep(two, f).stepMicros));
  }
  f.contention = NAN;
  EXPECT_FALSE(std::isfinite(simulateStep(two, f).stepMicros));
  f.contention = 0;
  f.readyMicros.back() = NAN;
  EXPECT_FALSE(std::isfinite(simulateStep(two, f).stepMicros));
}

TEST(BucketPlan, LatencyThatCostsMoreThanItHidesGivesOneBucket) {
  // 0.8 MB of gradients; each all-reduce costs 5 ms whatever its size; backward takes 2 ms.
  const ParamLayout layout({784, 256, 10});
  PlanFigures f = evenBackward(layout, 2000);
  f.allReduce = affine(5000, 1);
  const BucketPlan plan = chooseBuckets(layout, f);
  EXPECT_EQ(plan.buckets.size(), 1u) << describeBuckets(plan.buckets);
}

TEST(BucketPlan, FreeOverlapAndNoLatencyGiveSmallBucketsAndLittleExposed) {
  // The whole buffer's all-reduce takes 40% of backward, runs beside it for free, costs nothing
  // fixed: small buckets leave only the last one after backward. (Plans within 1% of the best step
  // count as equal, and the one with the fewest buckets among them is chosen.)
  const ParamLayout layout({784, 1024, 1024, 10});
  const double bytes = static_cast<double>(layout.totalFloats()) * sizeof(float);
  PlanFigures f = evenBackward(layout, 10000);
  f.allReduce = affine(0, 4000 / (bytes / kMiB));
  const BucketPlan plan = chooseBuckets(layout, f);
  EXPECT_GE(plan.buckets.size(), 20u) << describeBuckets(plan.buckets);
  EXPECT_LE(plan.forecast.exposedMicros, 0.02 * plan.forecast.stepMicros);
  EXPECT_GT(plan.defaultForecast.exposedMicros, 3000);  // 25 MB: one 1 MiB bucket, then the rest after backward
}

TEST(BucketPlan, CommunicationThatStopsComputeGivesTheFewestBuckets) {
  // Overlap buys nothing when the all-reduce takes the rank's only core; each bucket's fixed cost
  // still counts.
  const ParamLayout layout({784, 1024, 1024, 10});
  PlanFigures f = evenBackward(layout, 5000);
  f.allReduce = affine(100, 400);
  f.contention = 1;
  const BucketPlan plan = chooseBuckets(layout, f);
  EXPECT_EQ(plan.buckets.size(), cappedBuckets(layout, layout.totalFloats() * sizeof(float)).size());
}

TEST(BucketPlan, ABandwidthBoundStepStartsEarlyWithoutPayingForTinyBuckets) {
  // The all-reduce takes three times the backward: the step is the communication, started as
  // early as it can be; a few buckets beat both one bucket and the smallest ones.
  const ParamLayout layout({784, 1024, 1024, 10});
  PlanFigures f = evenBackward(layout, 4000);
  f.allReduce = affine(300, 12000 / (layout.totalFloats() * sizeof(float) / kMiB));
  const BucketPlan plan = chooseBuckets(layout, f);
  const double whole = simulateStep(cappedBuckets(layout, layout.totalFloats() * sizeof(float)), f).stepMicros;
  const double tiny = simulateStep(cappedBuckets(layout, 16 << 10), f).stepMicros;
  EXPECT_LT(plan.forecast.stepMicros, whole);
  EXPECT_LT(plan.forecast.stepMicros, tiny);
  EXPECT_GT(plan.buckets.size(), 2u);
  EXPECT_LT(plan.buckets.size(), 60u);
}

TEST(BucketPlan, TheEventSaysThePlanAndWhatItRestsOn) {
  const ParamLayout layout({784, 1024, 1024, 10});
  PlanFigures f = evenBackward(layout, 4000);
  f.allReduce = affine(100, 500);
  f.worldSize = 2;
  f.contention = 0.5;
  const std::string text = describePlan(chooseBuckets(layout, f), f);
  EXPECT_EQ(text.rfind("buckets: ", 0), 0u) << text;
  for (const char* part : {"chosen from all-reduce 0.10 ms + 0.50 ms/MB among 2 ranks", "backward 4.0 ms",
                           "compute slowed 50%", "expected exposed communication", "(25 MB buckets: "}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << " in: " << text;
  }
  EXPECT_EQ(describeBuckets(cappedBuckets(layout, 25u << 20)), "2 buckets of ~6.1 MB");
}

// ---- between two real processes over real Gloo ----

// What one rank does with its communicator (and the job's store); its text goes back to the test.
using RankWork = std::function<std::string(int rank, std::unique_ptr<Comm>& comm, StoreClient& store)>;

std::string asRank(int rank, std::uint16_t port, const RankWork& work) {
  auto store = StoreClient::connect("127.0.0.1", port, std::chrono::seconds(20), "", rank);
  if (!store) return "no store: " + store.error().message;
  GlooOptions gloo;
  gloo.rank = rank;
  gloo.worldSize = 2;
  gloo.storePrefix = "plan-test/";
  gloo.localHost = "127.0.0.1";
  gloo.timeout = std::chrono::seconds(20);
  auto comm = connectGloo(**store, gloo);
  if (!comm) return "no Gloo: " + comm.error().message;
  return work(rank, *comm, **store);
}

std::string readAll(int fd) {
  std::string text;
  char chunk[4096];
  for (ssize_t n; (n = ::read(fd, chunk, sizeof chunk)) > 0;) text.append(chunk, static_cast<std::size_t>(n));
  return text;
}

// Runs `work` as rank 1 in a forked process and as rank 0 here; returns their texts.
std::pair<std::string, std::string> onTwoRanks(const RankWork& work) {
  int portPipe[2], outPipe[2];
  if (::pipe(portPipe) != 0 || ::pipe(outPipe) != 0) return {"no pipe", ""};
  // Fork before any thread starts (the store server has one); the child learns the port by pipe.
  const pid_t child = ::fork();
  if (child == 0) {
    std::uint16_t port = 0;
    const std::string text = ::read(portPipe[0], &port, sizeof port) == sizeof port ? asRank(1, port, work) : "no port";
    const bool sent = ::write(outPipe[1], text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::_exit(sent ? 0 : 1);
  }
  ::close(outPipe[1]);
  std::string mine = "no child";
  if (child > 0) {
    auto server = StoreServer::start("127.0.0.1", 0);
    if (server.ok()) {
      const std::uint16_t port = (*server)->port();
      if (::write(portPipe[1], &port, sizeof port) == static_cast<ssize_t>(sizeof port)) mine = asRank(0, port, work);
    }
  }
  ::close(portPipe[1]);  // a child still waiting for the port reads the end and gives up
  const std::string theirs = readAll(outPipe[0]);
  int status = 0;
  if (child > 0) ::waitpid(child, &status, 0);
  for (int fd : {portPipe[0], outPipe[0]}) ::close(fd);
  return {mine, theirs};
}

TEST(BucketPlan, RanksThatMeasuredDifferentlyChooseTheSamePlan) {
  // Each rank measures its own figures on a small real model; rank 1's are then made to differ
  // further (all-reduce 3x, compute 0.5x, contention 0.9 against 0.1).
  const auto [mine, theirs] = onTwoRanks([](int rank, std::unique_ptr<Comm>& gloo, StoreClient&) -> std::string {
    Comm& comm = *gloo;
    const ParamLayout layout({64, 512, 256, 10});
    std::vector<float> params(layout.totalFloats()), x(32 * 64);
    initParameters(layout, 7, params.data());
    std::mt19937 random(static_cast<unsigned>(rank));
    std::uniform_real_distribution<float> uniform(-1, 1);
    for (float& v : x) v = uniform(random);
    std::vector<std::int32_t> labels(32, 3);
    Mlp model(layout, Activation::kRelu, 32);
    OptimizerSpec sgd;
    auto measured = measureCpuStep(comm, {model, layout, sgd, params.data(), x.data(), labels.data(), 32});
    if (!measured) return "measuring failed: " + measured.error().message;
    PlanFigures own = rank == 1 ? scaledFigures(*measured, 3.0, 0.5) : *measured;
    own.contention = rank == 1 ? 0.9 : 0.1;
    auto agreed = agreeOnFigures(comm, own);
    if (!agreed) return "agreeing failed: " + agreed.error().message;
    const BucketPlan plan = chooseBuckets(layout, *agreed);
    std::ostringstream text;
    text << "cap " << plan.capBytes << " contention " << agreed->contention << " ends";
    for (const auto& b : plan.buckets) text << ' ' << b.end;
    text << " curve";
    for (double v : agreed->allReduce.micros) text << ' ' << v;
    text << " own-contention " << own.contention;
    return text.str();
  });
  ASSERT_NE(mine.find("own-contention 0.1"), std::string::npos) << mine;
  ASSERT_NE(theirs.find("own-contention 0.9"), std::string::npos) << theirs;
  // Everything agreed on, and the plan, is the same; the contention is the mean.
  EXPECT_EQ(mine.substr(0, mine.find(" own-contention")), theirs.substr(0, theirs.find(" own-contention")));
  EXPECT_NE(mine.find("contention 0.5 "), std::string::npos) << mine;
}

TEST(BucketPlan, ALinkThatSlowsDownIsReplannedAtTheSameStepOnBothRanks) {
  // A plan of many buckets from figures where overlap pays; then 100 steps in which every
  // all-reduce took 3 ms longer on one rank's clock and 2.5 ms on the other's: a fixed cost that
  // large calls for the fewest buckets. Both ranks agree on the window and switch alike, after
  // step 100 and not before.
  const auto [mine, theirs] = onTwoRanks([](int rank, std::unique_ptr<Comm>& gloo, StoreClient&) -> std::string {
    Comm& comm = *gloo;
    const ParamLayout layout({784, 1024, 1024, 10});
    PlanFigures f = evenBackward(layout, 6000);
    f.allReduce = affine(100, 400);
    f.worldSize = 2;
    const BucketPlan first = chooseBuckets(layout, f);
    PlanWatch watch(layout, f, first, 100);
    const auto t0 = std::chrono::steady_clock::now();
    const auto us = [&](double micros) { return t0 + std::chrono::microseconds(static_cast<std::int64_t>(micros)); };
    std::string text = "first " + std::to_string(first.buckets.size());
    for (std::uint64_t step = 1; step <= 100; ++step) {
      std::vector<BucketTiming> timings;
      double free = 0;
      for (const auto& b : first.buckets) {
        const double ready = f.readyAt(b.end), from = std::max(ready, free);
        free = from + f.allReduce.at(static_cast<double>(b.end - b.begin) * 4) + (rank == 0 ? 3000 : 2500);
        timings.push_back({us(ready), us(from), us(free)});
      }
      watch.noteStep(timings, t0, us(6000));
      auto replanned = watch.check(comm, step);
      if (!replanned) return "check failed: " + replanned.error().message;
      if (*replanned) text += " | after " + std::to_string(step) + ": " + **replanned;
    }
    return text + " | now " + std::to_string(watch.plan().buckets.size());
  });
  EXPECT_EQ(mine, theirs);
  EXPECT_EQ(mine.rfind("first ", 0), 0u) << mine;
  EXPECT_GT(std::atoi(mine.c_str() + 6), 2) << mine;
  EXPECT_NE(mine.find(" | after 100: re-planned after step 100: all-reduce took"), std::string::npos) << mine;
  EXPECT_NE(mine.find("buckets: 2 buckets"), std::string::npos) << mine;
  EXPECT_NE(mine.find(" | now 2"), std::string::npos) << mine;
}

// ---- the shared-memory all-reduce (shm_comm.h) between the same two processes ----

TEST(SharedMemoryAllReduce, SumsAndFallsBackToGlooAndSeesAPeerThatIsGoneAtOnce) {
  // Ranks on one node sum through a shared segment of 1000 floats, copied or in place in each
  // rank's own buffer there; a longer range goes through Gloo. Then rank 1's process ends while rank 0 waits in an all-reduce: rank 0 learns it from
  // the peer's pidfd at once, not at the 20 s timeout.
  const auto [mine, theirs] = onTwoRanks([](int rank, std::unique_ptr<Comm>& gloo, StoreClient& store) -> std::string {
    auto comm = connectSharedMemory(std::move(gloo), store, "shm-test/", 1000, std::chrono::seconds(20));
    if (!comm) return "connect failed: " + comm.error().message;
    std::string text;
    for (std::size_t n : {1u, 7u, 1000u, 1500u}) {
      std::vector<float> data(n);
      for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<float>((rank + 1) * (i + 1));
      if (auto r = (*comm)->allReduceSum(data.data(), n); !r) return text + " failed: " + r.error().message;
      bool right = true;
      for (std::size_t i = 0; i < n; ++i) right = right && data[i] == static_cast<float>(3 * (i + 1));
      text += (right ? " ok " : " wrong ") + std::to_string(n);
    }
    // In place: a range of each rank's own buffer in the segment, summed into every rank's buffer
    // at the same offset, the rest of the buffer untouched.
    float* own = (*comm)->inPlaceBuffer(1000);
    if (own == nullptr || (*comm)->inPlaceBuffer(1001) != nullptr) return text + " no in-place buffer of 1000 only";
    for (std::size_t i = 0; i < 1000; ++i) own[i] = static_cast<float>((rank + 1) * (i + 1));
    if (auto r = (*comm)->allReduceSum(own + 100, 500); !r) return text + " in place failed: " + r.error().message;
    bool right = true;
    for (std::size_t i = 0; i < 1000; ++i) {
      right = right && own[i] == static_cast<float>((i >= 100 && i < 600 ? 3 : rank + 1) * (i + 1));
    }
    text += right ? " ok in place" : " wrong in place";
    (*comm)->releaseBuffers();
    if (rank == 1) return text;  // and its process ends
    std::vector<float> last(10, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    auto r = (*comm)->allReduceSum(last.data(), last.size());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return text + " | " + (r ? std::string("no error") : r.error().message) + " after " + std::to_string(seconds) + " s";
  });
  EXPECT_EQ(theirs, " ok 1 ok 7 ok 1000 ok 1500 ok in place");
  EXPECT_EQ(mine.rfind(" ok 1 ok 7 ok 1000 ok 1500 ok in place | ", 0), 0u) << mine;
  EXPECT_NE(mine.find("rank 1's process ended after "), std::string::npos) << mine;
  const auto after = mine.rfind("after ");
  ASSERT_NE(after, std::string::npos) << mine;
  EXPECT_LT(std::stod(mine.substr(after + 6)), 5.0) << mine;
  // Nothing is left in /dev/shm.
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    EXPECT_EQ(entry.path().filename().string().rfind("lockstep-comm-", 0), std::string::npos) << entry.path();
  }
}

}  // namespace
}  // namespace lockstep::trainer
