// Issue 45 on GPUs (label `gpu`; run by bench/gpu/device_check.sh on the GPU machine): the kinds of
// data parallelism other than all-reduce on the CUDA backend, against the same kinds on the CPU
// backend, which their own tests hold against all-reduce (ps_test, shard_test).
//
// The parameter server's ranks exchange with it over the hosts (ps_worker.h), so several may share
// one GPU: these tests run on a machine with one. Sharding reduces over NCCL, which takes one GPU
// per rank: one rank shards on one GPU (a world of one part), two ranks need two GPUs and the test
// says so where there are fewer.
//
// Tolerances as in gpu_test.cpp: fp32 on the GPU differs from OpenBLAS in the order of additions,
// about 1e-6 relative per sum; twenty steps compound that well under 1e-4.

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "support/test_support.h"
#include "support/trainer_runs.h"

namespace lockstep::test {
namespace {

const std::vector<std::string> kJob = {"--layers", "64,128,128,10", "--dataset", "synthetic:n=4096,dim=64,classes=10,seed=3",
                                       "--batch-per-rank", "128", "--no-shuffle", "--seed", "7", "--quiet",
                                       "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--timeout-s", "30"};
const std::vector<std::string> kFp32Gpu = {"--backend", "cuda", "--precision", "fp32"};

int visibleGpus(const TempDir& dir) {
  ProcessResult listed;
  try {
    listed = runProcess({"nvidia-smi", "-L"}, {}, dir, std::chrono::seconds(30));
  } catch (const std::exception&) {
    return 0;  // no nvidia-smi: no driver
  }
  int count = 0;
  for (std::size_t at = listed.out.find("GPU "); at != std::string::npos; at = listed.out.find("\nGPU ", at + 1)) ++count;
  return listed.status.success() ? count : 0;
}

void expectSameTraining(const TempDir& dir, const std::string& run, const std::string& reference,
                        double tolerance = 1e-4) {
  const auto expected = globalLosses(dir.file(reference + ".jsonl")), got = globalLosses(dir.file(run + ".jsonl"));
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [step, loss] : expected) EXPECT_NEAR(got.at(step), loss, tolerance * loss) << "step " << step;
  EXPECT_LT(maxRelativeDifference(dir.file(run + ".safetensors"), dir.file(reference + ".safetensors")), tolerance);
}

// A sharded GPU run of `stage` checkpointed every 10 steps, stopped at 10 and resumed to 20, repeats
// the last ten steps of the uninterrupted run `reference`: the checkpoint gathered every rank's part.
void expectResumedAsRun(const TempDir& dir, const std::string& stage, const std::string& reference, const Env& env) {
  const std::vector<std::string> ckpt = {"--backend", "cuda", "--precision", "fp32", "--shard", stage,
                                         "--checkpoint-dir", dir.file("ckpt-" + stage), "--checkpoint-every", "10"};
  ASSERT_TRUE(train(dir, "first-" + stage, kJob, join(ckpt, {"--steps", "10"}), env).process.status.success());
  const TrainerRun resumed = train(dir, "resumed-" + stage, kJob, join(ckpt, {"--steps", "20", "--resume"}), env);
  ASSERT_TRUE(resumed.process.status.success()) << resumed.process.err;
  const auto expected = globalLosses(dir.file(reference + ".jsonl"));
  const auto got = globalLosses(dir.file("resumed-" + stage + ".jsonl"));
  ASSERT_EQ(got.size(), 10u);
  for (const auto& [step, loss] : got) EXPECT_NEAR(loss, expected.at(step), 1e-5 * loss) << "step " << step;
}

// Synchronous, the server (rank 0's process, on the host) sums the GPUs' gradients and updates
// the master: the same training as the CPU backend's server, whose own test holds it to all-reduce.
TEST(GpuKinds, AParameterServerTrainsGpuRanksAsItTrainsCpuRanks) {
  TempDir dir;
  const std::vector<std::string> server = {"--nproc", "2", "--steps", "20", "--sync", "parameter-server"};
  const TrainerRun cpu = train(dir, "cpu", kJob, server);
  ASSERT_TRUE(cpu.process.status.success()) << cpu.process.err;
  const TrainerRun gpu = train(dir, "gpu", kJob, join(server, kFp32Gpu));
  ASSERT_TRUE(gpu.process.status.success()) << gpu.process.err;
  expectSameTraining(dir, "gpu", "cpu");
  ASSERT_EQ(gpu.lines.size(), 40u);
  for (const auto& l : gpu.lines) {
    EXPECT_FALSE(collectiveOf(l, "push").is_null()) << l.dump();
    EXPECT_FALSE(collectiveOf(l, "pull").is_null()) << l.dump();
    // The server keeps the optimizer state, in rank 0's process; the GPUs keep none.
    if (l["rank"] == 1) EXPECT_EQ(l["optimizer_state_bytes"], 0) << l.dump();
    if (l["rank"] == 0) EXPECT_GT(l["optimizer_state_bytes"].get<std::uint64_t>(), 0u) << l.dump();
  }
}

// Split over both ranks' processes, each part holding its range of the master. Both sum on the
// host in rank order; what may differ is the GPU's own rounding (GEMM algorithms, atomic sums), so
// the heuristic's algorithms in both runs and fp32 rounding's tolerance.
TEST(GpuKinds, ASplitServerTrainsGpuRanksAsOneServerDoes) {
  TempDir dir;
  const Env fixed = {{"LOCKSTEP_GEMM_TUNING", "0"}};
  const std::vector<std::string> one = {"--nproc", "2", "--steps", "20", "--sync", "parameter-server"};
  const TrainerRun whole = train(dir, "one", kJob, join(one, kFp32Gpu), fixed);
  ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
  const TrainerRun split = train(dir, "split", kJob, join(one, join({"--ps-ranks", "2"}, kFp32Gpu)), fixed);
  ASSERT_TRUE(split.process.status.success()) << split.process.err;
  expectSameTraining(dir, "split", "one", 1e-5);
  for (const auto& l : split.lines) EXPECT_EQ(collectiveOf(l, "push")["count"], 2) << l.dump();
}

// Asynchronous with rank 1's GPU 4x slower: rank 0 goes on, within the bound, and the loss falls.
TEST(GpuKinds, AsynchronousGpuRanksKeepTheStalenessBound) {
  TempDir dir;
  const TrainerRun async = train(dir, "async", kJob,
                                 join({"--nproc", "2", "--steps", "60", "--sync", "parameter-server", "--staleness", "2"},
                                      kFp32Gpu),
                                 {{"LOCKSTEP_TEST_SLOWDOWN", "1:4"}});
  ASSERT_TRUE(async.process.status.success()) << async.process.err;
  auto [updates, lossByStep] = asyncUpdates(async.lines, 2);
  EXPECT_EQ(lossByStep.size(), 60u) << "--steps counts the server's updates";
  EXPECT_GT(updates[0], updates[1]) << "the fast rank did not wait for the slow one";
  double first = 0, last = 0;
  for (std::uint64_t s = 1; s <= 10; ++s) first += lossByStep.at(s), last += lossByStep.at(60 - s + 1);
  EXPECT_LT(last, 0.95 * first) << "the loss falls";
}

// One rank through NCCL still shards (a world of one part): the owners' reduces, the broadcast of
// the parameters, the bf16 copy's refresh and the gathered checkpoint all run, on one GPU.
TEST(GpuKinds, OptimizerShardingOnOneGpuTrainsAsUnshardedAndResumes) {
  TempDir dir;
  const Env fixed = {{"LOCKSTEP_GEMM_TUNING", "0"}};
  for (const std::string precision : {"fp32", "bf16"}) {
    const std::vector<std::string> job = {"--steps", "20", "--backend", "cuda", "--precision", precision};
    const TrainerRun whole = train(dir, "whole-" + precision, kJob, job, fixed);
    ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
    const TrainerRun sharded = train(dir, "sharded-" + precision, kJob, join(job, {"--shard", "optimizer"}), fixed);
    ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;
    expectSameTraining(dir, "sharded-" + precision, "whole-" + precision, 1e-5);
    for (const auto& l : sharded.lines) {
      EXPECT_FALSE(collectiveOf(l, "reduce_scatter").is_null()) << l.dump();
      EXPECT_FALSE(collectiveOf(l, "all_gather").is_null()) << l.dump();
      EXPECT_GT(l["optimizer_state_bytes"].get<std::uint64_t>(), 0u) << l.dump();
    }
  }
  // Checkpoints every 10 steps gather the state; the resumed run repeats the last ten steps.
  expectResumedAsRun(dir, "optimizer", "sharded-fp32", fixed);
}

// ZeRO 1 over NCCL: each rank keeps half the optimizer state, and trains as unsharded.
TEST(GpuKinds, OptimizerShardingOverNcclTrainsAsUnsharded) {
  TempDir dir;
  if (visibleGpus(dir) < 2) GTEST_SKIP() << "NCCL takes one GPU per rank: this test needs two, and this machine has fewer";
  const std::vector<std::string> two = join({"--nproc", "2", "--steps", "20"}, kFp32Gpu);
  const TrainerRun whole = train(dir, "whole", kJob, two);
  ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
  const TrainerRun sharded = train(dir, "sharded", kJob, join(two, {"--shard", "optimizer"}));
  ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;
  expectSameTraining(dir, "sharded", "whole");
  const auto state = whole.lines[0]["optimizer_state_bytes"].get<double>();
  for (const auto& l : sharded.lines) {
    EXPECT_NEAR(l["optimizer_state_bytes"].get<double>(), state / 2, 0.02 * state) << l.dump();
    EXPECT_FALSE(collectiveOf(l, "reduce_scatter").is_null()) << l.dump();
    EXPECT_FALSE(collectiveOf(l, "all_gather").is_null()) << l.dump();
  }
}

// ZeRO 2 and 3 on one GPU (a world of one part): backward stages each layer, the owners' reduces
// and, at stage 3, each layer's gather run, with micro-steps (a reduce per micro-step, added up), in
// fp32 and bf16 (stage 3 converts each gathered layer; with GELU and AdamW, the fused bias gradient
// and the optimizer state's offsets), and a stage 3 checkpoint gathers the parts. A world of one
// cannot catch what only several ranks do (the parts' offsets, the header's sum): the test over
// NCCL below does.
TEST(GpuKinds, GradientAndParameterShardingOnOneGpuTrainAsUnshardedAndResume) {
  TempDir dir;
  const Env fixed = {{"LOCKSTEP_GEMM_TUNING", "0"}};
  const std::vector<std::string> geluAdamw = {"--activation", "gelu", "--optimizer", "adamw", "--lr", "0.001"};
  for (const std::string precision : {"fp32", "bf16", "bf16-gelu-adamw"}) {
    for (const int accum : {1, 2}) {
      const std::string whole = "whole-" + precision + "-" + std::to_string(accum);
      std::vector<std::string> job = {"--steps", "20", "--backend", "cuda", "--precision", precision.substr(0, 4),
                                      "--accum-steps", std::to_string(accum)};
      if (precision.size() > 4) job = join(job, geluAdamw);
      // One micro-step runs the same operations as unsharded; two add the micro-steps' sums apart
      // rather than in the GEMM, which in fp32 differs by an ulp and may move a bf16 weight's rounding.
      const double tolerance = accum == 1 || precision == "fp32" ? 1e-5 : 1e-3;
      ASSERT_TRUE(train(dir, whole, kJob, job, fixed).process.status.success());
      for (const std::string stage : {"gradients", "parameters"}) {
        const std::string name = stage + "-" + precision + "-" + std::to_string(accum);
        const TrainerRun sharded = train(dir, name, kJob, join(job, {"--shard", stage}), fixed);
        ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;
        expectSameTraining(dir, name, whole, tolerance);
        for (const auto& l : sharded.lines) {
          const auto scatter = collectiveOf(l, "reduce_scatter");
          ASSERT_FALSE(scatter.is_null()) << l.dump();
          EXPECT_EQ(scatter["count"].get<int>(), 3 * accum) << l.dump();  // a layer each, per micro-step
          const auto gather = collectiveOf(l, "all_gather");
          ASSERT_FALSE(gather.is_null()) << l.dump();
          // Stage 3: forward gathers its three layers and backward finds its two held; a second
          // micro-step's forward gathers the first and the last layer again.
          if (stage == "parameters") EXPECT_EQ(gather["count"].get<int>(), 1 + 2 * accum) << l.dump();
        }
      }
    }
  }
  // The communication stream held back 300 us before each reduce and gather: a compute stream that
  // did not wait for a slot to be free, or for a layer to be in, would read or overwrite it early.
  const Env slowLink = {{"LOCKSTEP_GEMM_TUNING", "0"}, {"LOCKSTEP_TEST_COMM_DELAY", "all:300:1"}};
  for (const std::string stage : {"gradients", "parameters"}) {
    const std::vector<std::string> job = {"--steps", "20", "--backend", "cuda", "--precision", "fp32",
                                          "--accum-steps", "2", "--shard", stage};
    const TrainerRun held = train(dir, "held-" + stage, kJob, job, slowLink);
    ASSERT_TRUE(held.process.status.success()) << held.process.err;
    expectSameTraining(dir, "held-" + stage, "whole-fp32-2", 1e-5);
  }
  expectResumedAsRun(dir, "parameters", "parameters-fp32-1", fixed);
}

// ZeRO 2 and 3 over NCCL, on a model of many layers: each rank keeps half the gradients (and at
// stage 3 half the weights) plus two layers, less than the whole, and trains as unsharded.
TEST(GpuKinds, GradientAndParameterShardingOverNcclTrainAsUnshardedInLessMemory) {
  TempDir dir;
  if (visibleGpus(dir) < 2) GTEST_SKIP() << "NCCL takes one GPU per rank: this test needs two, and this machine has fewer";
  std::vector<std::string> deep = kJob;
  deep[1] = "64,128,128,128,128,128,128,128,128,10";
  const std::vector<std::string> two = join({"--nproc", "2", "--steps", "20"}, kFp32Gpu);
  const TrainerRun whole = train(dir, "whole", deep, two);
  ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
  const double grads = whole.lines[0]["grad_bytes"].get<double>(), params = whole.lines[0]["param_bytes"].get<double>();
  for (const std::string stage : {"gradients", "parameters"}) {
    const TrainerRun sharded = train(dir, stage, deep, join(two, {"--shard", stage}));
    ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;
    expectSameTraining(dir, stage, "whole");
    for (const auto& l : sharded.lines) {
      EXPECT_LT(l["grad_bytes"].get<double>(), 0.8 * grads) << l.dump();
      if (stage == "parameters") EXPECT_LT(l["param_bytes"].get<double>(), 0.8 * params) << l.dump();
    }
  }
}

}  // namespace
}  // namespace lockstep::test
