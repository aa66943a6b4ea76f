// Issue 6 on a real GPU (label `gpu`; run by bench/gpu/device_check.sh on the GPU machine):
// the CUDA backend against the CPU backend from the same initial weights and unshuffled data, bf16
// against fp32, checkpoint and resume, and the agent's NVML readings while a CUDA job trains.
//
// Tolerances. fp32 on the GPU differs from OpenBLAS only in the order of additions (GEMM tiling,
// which may differ between runs as the GEMM algorithms are picked by timing, and atomics in the
// bias sums): each sum of k products carries a relative error of about
// k * 2^-24 in the worst case, about sqrt(k) * 2^-24 ~ 1e-6 in practice for k <= 4096. Twenty
// SGD steps at lr 0.05 with momentum compound this by at most a small factor, so weights agree to
// ~1e-5 relative; we allow 1e-4 (relative L2 over all weights) and losses to 1e-4 per step. (fp32
// against fp64 in PyTorch on these workloads: weights 1e-7 to 7e-7 apart, losses 2e-7;
// bench/gpu/precision_divergence.py.)
// bf16 keeps 8 bits of mantissa (relative error 2^-9 ~ 2e-3 per rounding) in activations and
// weights copies, with fp32 accumulation and fp32 master weights, and its fused GELU is the tanh
// approximation: its loss, averaged over windows of 20 steps, must stay within 3% of fp32's, and
// its weights within 3% (relative L2) after 200 steps. (Per step, a small loss makes the relative
// difference as large as the logits' absolute bf16 error.) PyTorch's bf16 autocast on the CPU, same
// model and schedule on similar data, stays within 0.2% for windows, 0.6% for single steps and
// 0.2% for the weights (bench/gpu/precision_divergence.py), so 3% leaves room for the GPU's own rounding.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "lockstep/client/launch.h"
#include "model.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kJob = {"--layers", "64,128,128,10", "--batch-per-rank", "256", "--no-shuffle",
                                       "--seed", "7", "--quiet"};
// 16 full batches of 256 an epoch.
const std::string kData = "synthetic:n=4096,dim=64,classes=10,seed=3";
// 14 full batches of 256 and a last one of 116 rows (with two micro-steps of 256: 7 full steps,
// then one of 116 rows and an empty micro-step), so that GEMM shapes first met mid-run and empty
// micro-steps are exercised.
const std::string kDataWithTail = "synthetic:n=3700,dim=64,classes=10,seed=3";

struct TrainedRun {
  std::vector<double> losses;
  std::vector<float> weights;
};

TrainedRun train(const TempDir& dir, const std::string& name, std::vector<std::string> extra,
                 const std::string& data = kData, const Env& env = {}) {
  std::vector<std::string> args = {trainerPath(), "--dataset", data};
  args.insert(args.end(), kJob.begin(), kJob.end());
  args.insert(args.end(), extra.begin(), extra.end());
  const std::string weights = dir.file(name + ".safetensors"), metrics = dir.file(name + ".jsonl");
  args.insert(args.end(), {"--save-weights", weights, "--metrics-out", metrics, "--timeout-s", "30"});
  auto r = runProcess(args, env, dir, 120s);
  EXPECT_EQ(r.status.exitCode, 0) << name << ": " << r.err;
  TrainedRun run;
  for (const auto& line : readJsonLines(metrics)) run.losses.push_back(line.at("global_loss").get<double>());
  trainer::ParamLayout layout({64, 128, 128, 10});
  run.weights.assign(layout.totalFloats(), 0.0f);
  auto loaded = trainer::loadWeights(weights, layout, run.weights.data());
  EXPECT_TRUE(loaded) << name << ": " << (loaded ? "" : loaded.error().message);
  return run;
}

double relativeL2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

void expectClose(const TrainedRun& gpu, const TrainedRun& cpu, double weightTolerance, double lossTolerance) {
  ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
  for (std::size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_NEAR(gpu.losses[i], cpu.losses[i], lossTolerance * std::abs(cpu.losses[i])) << "step " << i + 1;
  }
  EXPECT_LT(relativeL2(gpu.weights, cpu.weights), weightTolerance);
}

TEST(Gpu, Fp32SgdMatchesTheCpuBackend) {
  TempDir dir;
  const std::vector<std::string> sgd = {"--steps", "20", "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), sgd.begin(), sgd.end());
    return more;
  };
  const TrainedRun cpu = train(dir, "cpu", with({"--backend", "cpu"}));
  const TrainedRun gpu = train(dir, "gpu", with({"--backend", "cuda", "--precision", "fp32"}));
  expectClose(gpu, cpu, 1e-4, 1e-4);
}

TEST(Gpu, Fp32GeluAdamWAccumulationMatchesTheCpuBackend) {
  // Exact GELU, AdamW, two micro-steps, and epochs whose last step is cut short (116 rows, then an
  // empty micro-step).
  TempDir dir;
  const std::vector<std::string> common = {"--activation", "gelu", "--optimizer", "adamw", "--lr", "0.001",
                                           "--weight-decay", "0.01", "--accum-steps", "2", "--epochs", "2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), common.begin(), common.end());
    return more;
  };
  const TrainedRun cpu = train(dir, "cpu", with({"--backend", "cpu"}), kDataWithTail);
  const TrainedRun gpu = train(dir, "gpu", with({"--backend", "cuda", "--precision", "fp32"}), kDataWithTail);
  ASSERT_EQ(cpu.losses.size(), 16u);
  expectClose(gpu, cpu, 1e-4, 1e-4);
}

double windowMean(const std::vector<double>& v, std::size_t from, std::size_t to) {
  double sum = 0;
  for (std::size_t i = from; i < to; ++i) sum += v[i];
  return sum / static_cast<double>(to - from);
}

TEST(Gpu, Bf16TracksFp32) {
  // With a short last batch each epoch: bf16 GEMM shapes (fused epilogues included) first met mid-run.
  TempDir dir;
  const std::vector<std::string> common = {"--backend", "cuda", "--activation", "gelu", "--steps", "200",
                                           "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), common.begin(), common.end());
    return more;
  };
  const TrainedRun fp32 = train(dir, "fp32", with({"--precision", "fp32"}), kDataWithTail);
  const TrainedRun bf16 = train(dir, "bf16", with({"--precision", "bf16"}), kDataWithTail);
  ASSERT_EQ(bf16.losses.size(), 200u);
  ASSERT_EQ(fp32.losses.size(), 200u);
  EXPECT_LT(fp32.losses.back(), 0.8 * fp32.losses.front()) << "the job must learn for the comparison to mean anything";
  for (std::size_t w = 0; w < 200; w += 20) {
    const double reference = windowMean(fp32.losses, w, w + 20);
    EXPECT_NEAR(windowMean(bf16.losses, w, w + 20), reference, 0.03 * reference) << "steps " << w + 1 << "-" << w + 20;
  }
  EXPECT_LT(relativeL2(bf16.weights, fp32.weights), 3e-2);
}

TEST(Gpu, ResumingFromACheckpointRepeatsTheRun) {
  // The heuristic's GEMM algorithms in all three runs (timing could pick others in each); what may
  // still differ is the order of the bias sums' atomics, within fp32 rounding.
  TempDir dir;
  const Env fixed = {{"LOCKSTEP_GEMM_TUNING", "0"}};
  const std::vector<std::string> common = {"--backend", "cuda", "--precision", "fp32", "--steps", "20",
                                           "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), common.begin(), common.end());
    return more;
  };
  const TrainedRun whole = train(dir, "whole", with({}), kData, fixed);
  // Stop at 10 by asking for 10 steps with checkpoints every 10, then resume to 20.
  std::vector<std::string> first = {"--backend", "cuda", "--precision", "fp32", "--steps", "10", "--optimizer",
                                    "sgd", "--lr", "0.05", "--momentum", "0.9", "--checkpoint-dir", dir.file("ckpt"),
                                    "--checkpoint-every", "10"};
  train(dir, "first", first, kData, fixed);
  const TrainedRun resumed = train(dir, "resumed", with({"--checkpoint-dir", dir.file("ckpt"), "--checkpoint-every", "10",
                                                  "--resume"}), kData, fixed);
  ASSERT_EQ(resumed.losses.size(), 10u);
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(resumed.losses[i], whole.losses[10 + i], 1e-5 * whole.losses[10 + i]) << "step " << 11 + i;
  }
  // Rounding differences (a ReLU gate flipping on a pre-activation within rounding of 0) stay far
  // below 1e-4. The last ten steps move the weights by 5.6% (relative L2); starting them from the
  // step-10 weights without momentum and from the epoch's start lands 3.1% away (both measured with
  // the CPU backend).
  EXPECT_LT(relativeL2(resumed.weights, whole.weights), 1e-4);
}

TEST(Gpu, TheAgentReportsRealNvmlReadingsWhileACudaJobTrains) {
  TempDir dir;
  AgentProcess agent(dir, "gpu-node", {"--sample-hz", "10"});
  auto c = connectAuthorized(agent, dir);
  ASSERT_TRUE(c);
  ASSERT_FALSE(c->hello().gpus.empty()) << "NVML found no GPU: " << c->hello().gpuStatus;
  // About 10 s at ~1 ms a step: many of the agent's samples; stopped once it has what it needs.
  JobSpec spec = smallJob("nvml-job", 1, 10000);
  spec.backend = Backend::kCuda;
  spec.precision = Precision::kBf16;
  spec.layers = {1024, 4096, 4096, 10};
  spec.dataset = SyntheticDataset{16384, 1024, 10, 1};
  spec.batchPerRank = 4096;
  auto placed = placeJob({c.get()}, {1}, spec, 10s);
  ASSERT_TRUE(placed) << placed.error().message;
  ASSERT_TRUE(launchJob({c.get()}, *placed, 10s));

  std::uint64_t seq = 0;
  float maxUtil = 0;
  bool power = false, energy = false, reports = false;
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  while (std::chrono::steady_clock::now() < deadline && !(maxUtil >= 50 && power && energy && reports)) {
    auto batch = c->fetch(seq, 1000, 200, 10s);
    ASSERT_TRUE(batch) << batch.error().message;
    for (const auto& m : batch->messages) {
      seq = m.seq;
      if (const auto* g = std::get_if<GpuSample>(&m.payload); g && g->jobId == "nvml-job") {
        if (g->utilizationPct) maxUtil = std::max(maxUtil, *g->utilizationPct);
        power |= g->powerMilliwatts.has_value() && *g->powerMilliwatts > 0;
        energy |= g->energyMillijoules.has_value();
      }
      reports |= std::holds_alternative<StepReport>(m.payload);
    }
  }
  EXPECT_TRUE(reports) << "the CUDA job reported no steps";
  EXPECT_GE(maxUtil, 50.0f) << "GPU utilization while training";
  EXPECT_TRUE(power) << "power readings";
  EXPECT_TRUE(energy) << "energy counter readings";
  (void)c->stopJob("nvml-job", 0, 10s);
}

// Issue 13 on a GPU: an instrumented PyTorch DDP script through an agent, NCCL at world size 1;
// watch() measures the all-reduce with CUDA events (the CPU path cannot see GPU time).
TEST(Gpu, AnInstrumentedDdpScriptReportsItsAllReduceFromCudaEvents) {
  const char* python = std::getenv("LOCKSTEP_TORCH_PYTHON");
  TempDir dir;
  AgentProcess agent(dir, "gpu-node");
  auto c = connectAuthorized(agent, dir);
  ASSERT_TRUE(c);
  ASSERT_FALSE(c->hello().gpus.empty()) << "NVML found no GPU: " << c->hello().gpuStatus;
  JobSpec spec;
  spec.jobId = "own-cuda";
  spec.backend = Backend::kCuda;
  spec.command = CommandSpec{{python ? python : "/usr/bin/python3", std::string(LOCKSTEP_SOURCE_DIR) + "/tests/programs/ddp_cuda.py", "50"},
                             dir.path().string(), {}};
  auto placed = placeJob({c.get()}, {1}, spec, 10s);
  ASSERT_TRUE(placed) << placed.error().message;
  ASSERT_TRUE(launchJob({c.get()}, *placed, 10s));
  std::uint64_t seq = 0;
  std::vector<StepReport> reports;
  bool ended = false;
  const auto deadline = std::chrono::steady_clock::now() + 180s;
  while (std::chrono::steady_clock::now() < deadline && !ended) {
    auto batch = c->fetch(seq, 1000, 200, 10s);
    ASSERT_TRUE(batch) << batch.error().message;
    for (const auto& m : batch->messages) {
      seq = m.seq;
      if (const auto* r = std::get_if<StepReport>(&m.payload); r && r->jobId == "own-cuda") reports.push_back(*r);
      if (const auto* e = std::get_if<JobEvent>(&m.payload); e && e->jobId == "own-cuda") {
        ended |= e->kind == JobEventKind::kFinished || e->kind == JobEventKind::kFailed;
        EXPECT_NE(e->kind, JobEventKind::kFailed) << e->message << "\n" << e->logTail;
      }
    }
  }
  ASSERT_TRUE(ended) << "the job did not end in time";
  ASSERT_EQ(reports.size(), 50u) << "every step, the last ones read at exit";
  for (const auto& r : reports) {
    ASSERT_TRUE(r.exposedCommTimeUs && r.allreduceTimeUs && r.computeTimeUs) << "step " << r.step;
    EXPECT_LE(*r.exposedCommTimeUs, *r.allreduceTimeUs);
    EXPECT_LE(*r.exposedCommTimeUs, r.stepTimeUs);
    EXPECT_EQ(r.bytesReduced, std::uint64_t{(1024 * 4096 + 4096 + 4096 * 1000 + 1000) * 4});
    EXPECT_TRUE(std::isfinite(r.loss));
  }
}

}  // namespace
}  // namespace lockstep::test
