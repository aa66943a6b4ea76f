// Issue 46: model FLOPs utilization through the real parts. The trainer counts the FLOPs of its
// GEMMs per sample; an agent sets each rank's peak (its cores' share of the CPU's sgemm) on the
// reports it takes and says where it came from; an agent measures that sgemm once and shows it.

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "support/agent_support.h"
#include "support/trainer_runs.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

// 16 → 32 → 8 → 4: forward and the weights' gradients in every layer (2 x 2 x in x out FLOPs each
// sample), the inputs' gradients in all but the first.
constexpr double kFlopsPerSample = 2 * 2 * 16 * 32 + 3 * 2 * 32 * 8 + 3 * 2 * 8 * 4;
const std::vector<std::string> kJob = {"--layers", "16,32,8,4", "--dataset", "synthetic:n=620,seed=5", "--batch-per-rank",
                                       "10"};

TEST(MfuProcess, TheTrainerReportsTheFlopsOfItsGemms) {
  TempDir dir;
  // 620 samples in steps of 3 ranks x 10 x 2 micro-steps leave the last step of each epoch 20.
  const TrainerRun run = train(dir, "flops", kJob, {"--nproc", "3", "--epochs", "2", "--accum-steps", "2", "--quiet"});
  ASSERT_TRUE(run.process.status.success()) << run.process.err;
  ASSERT_FALSE(run.lines.empty());
  for (const auto& line : run.lines) {
    const double samples = line["samples"].get<double>();
    ASSERT_TRUE(line.contains("flops")) << line.dump();
    EXPECT_DOUBLE_EQ(line["flops"].get<double>(), samples * kFlopsPerSample) << line.dump();
    EXPECT_EQ(line["flops_basis"], "declared");
    EXPECT_EQ(line["precision"], "fp32");
    EXPECT_TRUE(line.value("peak_flops", Json()).is_null()) << "no agent took it: no peak";
  }
}

struct MfuAgent : ::testing::Test {
  void SetUp() override { ASSERT_TRUE(ctl.pairWith(agent)); }
  TempDir dir;
  AgentProcess agent{dir, "node-a"};
  Ctl ctl{dir, dir.file("config")};
};

// The test agent's CPU peak is set (kTestCpuPeakGflops a core); each rank has a core of its own.
TEST_F(MfuAgent, EachRankGetsItsCoresPeakAndTheJobSaysWhereItCameFrom) {
  const auto done = ctl(join({"start", "--wait", "--job-id", "mfu", "--ranks", "2", "--cpus-per-rank", "1", "--steps",
                              "150"},
                             kJob),
                        150s);
  ASSERT_EQ(done.status.exitCode, 0) << done.out << done.err;
  const auto steps = ctl.steps("mfu");
  ASSERT_EQ(steps.size(), 300u);
  for (const auto& s : steps) {
    ASSERT_TRUE(s.flops && s.peakFlops) << "step " << s.step << " of rank " << s.rank;
    EXPECT_DOUBLE_EQ(*s.flops, s.samples * kFlopsPerSample);
    EXPECT_EQ(*s.peakFlops, kTestCpuPeakGflops * 1e9);
  }
  std::vector<std::string> peaks;
  for (const auto& e : ctl.events("mfu")) {
    if (e.kind == JobEventKind::kPeak) peaks.push_back(e.message);
  }
  EXPECT_EQ(peaks, std::vector<std::string>{"1 core × 50.0 GFLOP/s = 50.0 GFLOP/s per rank, fp32: one core's 50.0 "
                                            "GFLOP/s as --cpu-peak sets on node-a"})
      << "said once for the job, both ranks having the same";
}

// An own program (tests/programs/ddp_mlp.py: DDP over Linear(32, 256), ReLU, Linear(256, 4), batches
// of 64, which reports tokens) under lockstep.watch: its FLOPs 6 x parameters x tokens, its precision
// from its parameters, its peak the agent's.
TEST_F(MfuAgent, AnOwnProgramsFlopsAreSixTimesItsParametersPerToken) {
  const std::string program = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/programs/ddp_mlp.py";
  const auto done = ctl({"start", "--wait", "--job-id", "own-mfu", "--ranks", "2", "--cpus-per-rank", "1", "--",
                         "/usr/bin/python3", program, "--instrument", "--steps", "12"},
                        180s);
  ASSERT_EQ(done.status.exitCode, 0) << done.out << done.err;
  const double parameters = 32 * 256 + 256 + 256 * 4 + 4;
  const auto steps = ctl.steps("own-mfu");
  ASSERT_EQ(steps.size(), 24u);
  for (const auto& s : steps) {
    ASSERT_TRUE(s.flops && s.flopsBasis && s.precision && s.tokens) << "step " << s.step << " of rank " << s.rank;
    EXPECT_DOUBLE_EQ(*s.flops, 6 * parameters * static_cast<double>(*s.tokens));
    EXPECT_EQ(*s.flopsBasis, FlopsBasis::kTokens);
    EXPECT_EQ(*s.precision, Precision::kFp32);
    EXPECT_EQ(s.peakFlops, kTestCpuPeakGflops * 1e9);
  }
}

TEST(MfuProcess, AnAgentMeasuresItsCpuPeakOnceAndShowsIt) {
  TempDir dir;
  AgentProcess agent{dir, "node-m", {"--cpu-peak", "measure"}};
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  ASSERT_TRUE(waitUntil([&] { return std::filesystem::exists(agent.stateDir() + "/cpu-peak.json"); }, 60s));
  Json node;
  ASSERT_TRUE(waitUntil(
      [&] {
        const auto r = ctl({"--json", "nodes"}, 30s);
        const Json all = Json::parse(r.out, nullptr, false);
        if (!all.is_array() || all.empty()) return false;
        node = all[0];
        return node.value("cpu_core_peak_flops", Json()).is_number();
      },
      30s));
  EXPECT_GT(node["cpu_core_peak_flops"].get<double>(), 1e9) << node.dump();
  EXPECT_NE(node["cpu_peak_basis"].get<std::string>().find("one core's sgemm measured on node-m on 20"), std::string::npos)
      << node.dump();
  const auto text = ctl({"nodes"}, 30s);
  EXPECT_NE(text.out.find("CPU peak "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("GFLOP/s per core (one core's sgemm measured on node-m"), std::string::npos) << text.out;
}

}  // namespace
}  // namespace lockstep::test
