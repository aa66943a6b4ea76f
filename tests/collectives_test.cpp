// Issue 42: communication measured whatever the program does. Real agents, real lockstepctl,
// Debian's PyTorch with Gloo in real processes (tests/programs/collectives.py): programs that
// average their gradients with their own dist.all_reduce, with dist.all_gather, asynchronously,
// with ZeroRedundancyOptimizer over DDP, and a hand-written ZeRO-3. Each program times its own
// collectives by its own clock; Lockstep's exposed share must agree with it, and its report,
// history and trace must hold the collectives by kind.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "lockstep/history/history.h"
#include "lockstep/protocol/collectives.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

const std::string kProgram = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/programs/collectives.py";
// The program's model at --hidden 256: 64x256 + 256 + 256x256 + 256 + 256x8 + 8 float32 parameters.
constexpr std::uint64_t kParameterBytes = (64 * 256 + 256 + 256 * 256 + 256 + 256 * 8 + 8) * 4;

struct Collectives : ::testing::Test {
  void SetUp() override { ASSERT_TRUE(ctl.pairWith(agent)); }

  // Runs the program in `mode` on two ranks to its end; returns each rank's own measurements.
  std::map<std::uint32_t, Json> runToEnd(const std::string& jobId, const std::string& mode) {
    const auto run = ctl({"start", "--ranks", "2", "--wait", "--job-id", jobId, "--", "/usr/bin/python3", kProgram,
                          "--mode", mode, "--hidden", "256", "--steps", "20", "--own", dir.file(jobId + "-%d.json")},
                         240s);
    EXPECT_EQ(run.status.exitCode, 0) << run.out << run.err;
    std::map<std::uint32_t, Json> own;
    for (std::uint32_t rank : {0u, 1u}) own[rank] = Json::parse(readText(dir.file(jobId + "-" + std::to_string(rank) + ".json")), nullptr, false);
    return own;
  }
  // Lockstep's exposed share of a rank's step time, against the program's own: within 0.05 + 20%.
  void expectExposedShareAgrees(const std::vector<StepReport>& reports, std::map<std::uint32_t, Json>& own) const {
    for (std::uint32_t rank : {0u, 1u}) {
      double exposed = 0, step = 0;
      for (const auto& r : reports) {
        if (r.rank != rank) continue;
        ASSERT_TRUE(r.exposedCommTimeUs) << "step " << r.step << ": measured, not unknown";
        exposed += static_cast<double>(*r.exposedCommTimeUs);
        step += static_cast<double>(r.stepTimeUs);
      }
      ASSERT_TRUE(own[rank].is_object()) << "rank " << rank << " wrote its own figures";
      const double theirs = own[rank]["collective_s"].get<double>() / own[rank]["step_s"].get<double>();
      const double ours = exposed / step;
      EXPECT_NEAR(ours, theirs, 0.05 + 0.2 * theirs) << "rank " << rank;
      EXPECT_GT(theirs, 0.02) << "the collectives took a measurable share";
    }
  }
  // Kind -> the rank's per-step entries, each step checked to hold `kinds` exactly.
  static std::map<CollectiveKind, std::vector<CollectiveTimes>> byKind(const std::vector<StepReport>& reports) {
    std::map<CollectiveKind, std::vector<CollectiveTimes>> out;
    for (const auto& r : reports) {
      for (const auto& c : r.collectives) out[c.kind].push_back(c);
    }
    return out;
  }
  // The trace lockstepctl writes: its collective boxes' names.
  std::multiset<std::string> tracedCollectives(const std::string& jobId) const {
    const auto r = ctl({"trace", jobId, "--out", dir.file(jobId + ".trace.json")});
    EXPECT_EQ(r.status.exitCode, 0) << r.err;
    const Json trace = Json::parse(readText(dir.file(jobId + ".trace.json")), nullptr, false);
    std::multiset<std::string> names;
    if (!trace.is_object()) return names;
    for (const auto& e : trace["traceEvents"]) {
      if (e.value("cat", "") == "collective") names.insert(e.value("name", ""));
    }
    return names;
  }

  TempDir dir;
  AgentProcess agent{dir, "node-a"};
  Ctl ctl{dir, dir.file("config")};
};

TEST_F(Collectives, AProgramThatAveragesItsOwnGradientsWithAllReduceIsMeasured) {
  auto own = runToEnd("own-allreduce", "allreduce");
  const auto reports = ctl.steps("own-allreduce");
  ASSERT_EQ(reports.size(), 40u);
  for (const auto& r : reports) {
    ASSERT_EQ(r.collectives.size(), 1u) << "step " << r.step;
    EXPECT_EQ(r.collectives[0].kind, CollectiveKind::kAllReduce);
    EXPECT_EQ(r.collectives[0].count, 1u);
    EXPECT_EQ(r.collectives[0].bytes, kParameterBytes);
    EXPECT_EQ(r.collectives[0].exposedUs, r.collectives[0].timeUs) << "blocking: all of it exposed";
    ASSERT_EQ(r.collectiveSpans.size(), 1u);
    EXPECT_LE(r.collectiveSpans[0].startUnixUs + r.collectiveSpans[0].durationUs, r.timeUnixUs);
  }
  expectExposedShareAgrees(reports, own);

  const auto report = ctl({"report", "own-allreduce", "--out", dir.file("r.json")});
  ASSERT_EQ(report.status.exitCode, 0) << report.err;
  const Json kpis = Json::parse(readText(dir.file("r.json")), nullptr, false)["kpis"];
  EXPECT_TRUE(kpis["comm_overhead"].is_number()) << "was null before: " << kpis.dump();
  EXPECT_EQ(tracedCollectives("own-allreduce").count("all_reduce"), 40u);
}

TEST_F(Collectives, AllGatherAndALocalMeanAreMeasuredWithTheWholeOutputsBytes) {
  auto own = runToEnd("own-allgather", "allgather");
  const auto reports = ctl.steps("own-allgather");
  ASSERT_EQ(reports.size(), 40u);
  const auto kinds = byKind(reports);
  ASSERT_EQ(kinds.size(), 1u);
  ASSERT_EQ(kinds.count(CollectiveKind::kAllGather), 1u);
  for (const auto& c : kinds.at(CollectiveKind::kAllGather)) EXPECT_EQ(c.bytes, 2 * kParameterBytes);
  expectExposedShareAgrees(reports, own);
}

TEST_F(Collectives, AnAsynchronousAllReduceIsExposedOnlyWhileWaitedOn) {
  auto own = runToEnd("own-async", "async");
  const auto reports = ctl.steps("own-async");
  ASSERT_EQ(reports.size(), 40u);
  double time = 0, exposed = 0;
  for (const auto& c : byKind(reports).at(CollectiveKind::kAllReduce)) {
    EXPECT_LE(c.exposedUs, c.timeUs);
    time += static_cast<double>(c.timeUs);
    exposed += static_cast<double>(c.exposedUs);
  }
  EXPECT_LT(exposed, time) << "part of it ran behind the program's compute: hidden";
  expectExposedShareAgrees(reports, own);
}

TEST_F(Collectives, ZeroRedundancyOptimizersBroadcastsAfterStepAreMeasuredBesideDdpsAllReduce) {
  auto own = runToEnd("own-zero", "zero");
  const auto reports = ctl.steps("own-zero");
  ASSERT_EQ(reports.size(), 40u);
  const auto kinds = byKind(reports);
  ASSERT_EQ(kinds.count(CollectiveKind::kBroadcast), 1u) << "its parameters' broadcasts";
  ASSERT_EQ(kinds.count(CollectiveKind::kAllReduce), 1u) << "DDP's";
  for (const auto& c : kinds.at(CollectiveKind::kBroadcast)) {
    EXPECT_EQ(c.bytes, kParameterBytes) << "every parameter, from the rank that owns it";
    EXPECT_EQ(c.count, 6u) << "one per parameter tensor";
  }
  for (std::uint32_t rank : {0u, 1u}) {  // inside the program's timing of opt.step()
    double broadcastExposed = 0;
    for (const auto& r : reports) {
      for (const auto& c : r.collectives) {
        if (r.rank == rank && c.kind == CollectiveKind::kBroadcast) broadcastExposed += static_cast<double>(c.exposedUs) / 1e6;
      }
    }
    EXPECT_GT(broadcastExposed, 0.0) << "rank " << rank << " waited on its broadcasts";
    EXPECT_LE(broadcastExposed, own[rank]["collective_s"].get<double>() * 1.05 + 0.01) << "rank " << rank;
  }
  EXPECT_EQ(tracedCollectives("own-zero").count("broadcast"), 40u * 6);
}

TEST_F(Collectives, AHandWrittenZero3GathersBeforeForwardAndReducesAfterBackward) {
  auto own = runToEnd("own-zero3", "zero3");
  const auto reports = ctl.steps("own-zero3");
  ASSERT_EQ(reports.size(), 40u);
  const auto kinds = byKind(reports);
  ASSERT_EQ(kinds.count(CollectiveKind::kAllGather), 1u);
  ASSERT_EQ(kinds.count(CollectiveKind::kReduce), 1u);
  for (const auto& c : kinds.at(CollectiveKind::kAllGather)) EXPECT_EQ(c.count, 6u);
  double data = 0, gathering = 0;
  for (const auto& r : reports) {
    ASSERT_EQ(r.collectiveSpans.size(), 12u);
    EXPECT_EQ(r.collectiveSpans.front().kind, CollectiveKind::kAllGather) << "before forward";
    EXPECT_EQ(r.collectiveSpans.back().kind, CollectiveKind::kReduce) << "after backward";
    ASSERT_TRUE(r.dataTimeUs);
    data += static_cast<double>(*r.dataTimeUs);
    for (const auto& c : r.collectives) gathering += c.kind == CollectiveKind::kAllGather ? static_cast<double>(c.exposedUs) : 0.0;
  }
  EXPECT_LT(data, 0.5 * gathering) << "the all-gathers before forward are communication, not waiting for data";
  expectExposedShareAgrees(reports, own);
}

TEST_F(Collectives, ARankStuckBeforeAnAllGatherIsNamedAsNotReachingIt) {
  const auto run = ctl({"start", "--ranks", "2", "--job-id", "zero3-stuck", "--stall-after-s", "3", "--",
                        "/usr/bin/python3", kProgram, "--mode", "zero3", "--hidden", "256", "--steps", "100000",
                        "--hang-rank", "1", "--hang-at", "5"});
  ASSERT_EQ(run.status.exitCode, 0) << run.err;
  Json stalled;
  waitUntil([&] {
    const auto r = ctl({"--json", "status", "zero3-stuck"}, 30s);
    stalled = r.status.exitCode == 0 ? Json::parse(r.out, nullptr, false) : Json();
    return stalled.is_object() && stalled.contains("stall");
  }, 90s);
  (void)ctl({"stop", "zero3-stuck", "--grace-ms", "1000"}, 30s);
  ASSERT_TRUE(stalled.is_object() && stalled.contains("stall")) << stalled.dump(2);
  EXPECT_EQ(stalled["stall"]["ranks"], Json::array({1})) << stalled.dump(2);
  const std::string message = stalled["stall"]["message"];
  // Four steps of 6 all-gathers and 6 reduces, then the first all-gather of step 5.
  EXPECT_NE(message.find("rank 1 did not reach all-gather #49"), std::string::npos) << message;
}

}  // namespace
}  // namespace lockstep::test
