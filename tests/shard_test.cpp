// Issue 45: sharded training (--shard), as users run it: real trainer processes, real collectives
// (shared memory on one node, Gloo over loopback), real checkpoint files.

#include <gtest/gtest.h>

#include <map>

#include "support/test_support.h"
#include "support/trainer_runs.h"

namespace lockstep::test {
namespace {

// AdamW keeps two floats of state per parameter: sharding it shows most.
const std::vector<std::string> kJob = {"--layers", "32,64,10", "--dataset", "synthetic:n=2048,seed=3", "--quiet",
                                       "--batch-per-rank", "32", "--optimizer", "adamw", "--lr", "0.003",
                                       "--seed", "11", "--no-shuffle", "--bucket-mb", "0.002"};

void expectSameLosses(const TempDir& dir, const std::string& a, const std::string& b, double tolerance) {
  const auto expected = globalLosses(dir.file(a + ".jsonl")), got = globalLosses(dir.file(b + ".jsonl"));
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [step, loss] : got) EXPECT_NEAR(loss, expected.at(step), tolerance * expected.at(step)) << "step " << step;
}

// Three ranks, so that the parts are uneven and no rank owns a bucket whole. On one node the
// reduce-scatter sums in the all-reduce's order, so the sharded run equals the unsharded one bit for bit.
TEST(Shard, OptimizerShardingTrainsAsUnshardedAndKeepsAThirdOfTheState) {
  TempDir dir;
  const TrainerRun whole = train(dir, "whole", kJob, {"--nproc", "3", "--steps", "20"});
  ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
  const TrainerRun sharded = train(dir, "sharded", kJob, {"--nproc", "3", "--steps", "20", "--shard", "optimizer"});
  ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;

  expectSameLosses(dir, "whole", "sharded", 0);
  EXPECT_EQ(maxRelativeDifference(dir.file("whole.safetensors"), dir.file("sharded.safetensors")), 0.0);

  ASSERT_EQ(sharded.lines.size(), 60u);
  const auto wholeState = whole.lines.front()["optimizer_state_bytes"].get<double>();
  for (std::size_t i = 0; i < sharded.lines.size(); ++i) {
    const auto& l = sharded.lines[i];
    EXPECT_EQ(l["param_bytes"], whole.lines[i]["param_bytes"]);
    EXPECT_EQ(l["grad_bytes"], whole.lines[i]["grad_bytes"]);
    // A third, give or take the alignment of the parts (128 floats, two buffers).
    EXPECT_NEAR(l["optimizer_state_bytes"].get<double>(), wholeState / 3, 2 * 128 * 4) << l.dump();
    const auto scattered = collectiveOf(l, "reduce_scatter"), gathered = collectiveOf(l, "all_gather");
    ASSERT_FALSE(scattered.is_null()) << l.dump();
    ASSERT_FALSE(gathered.is_null()) << l.dump();
    EXPECT_GT(scattered["count"].get<int>(), 1) << "the buckets are reduce-scattered one by one";
    EXPECT_EQ(gathered["count"], 1);
    EXPECT_EQ(gathered["exposed_us"], gathered["time_us"]);
  }
  for (const auto& l : whole.lines) EXPECT_TRUE(collectiveOf(l, "reduce_scatter").is_null());
}

// Over Gloo (ranks on other nodes), the parameters come back by broadcasts from their owners; the
// sums are Gloo's, so equal within rounding.
TEST(Shard, OptimizerShardingOverGlooTrainsAsUnsharded) {
  TempDir dir;
  const Env gloo = {{"LOCKSTEP_ALLREDUCE", "gloo"}};
  const TrainerRun whole = train(dir, "whole", kJob, {"--nproc", "2", "--steps", "20"}, gloo);
  ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
  const TrainerRun sharded = train(dir, "sharded", kJob, {"--nproc", "2", "--steps", "20", "--shard", "optimizer"}, gloo);
  ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;
  expectSameLosses(dir, "whole", "sharded", 1e-5);
  EXPECT_LE(maxRelativeDifference(dir.file("whole.safetensors"), dir.file("sharded.safetensors")), 1e-5);
}

// A sharded job's checkpoint holds every parameter's optimizer state: it resumes bit-exactly,
// sharded or not.
TEST(Shard, AShardedJobResumesExactlyAndItsCheckpointHoldsTheWholeState) {
  TempDir dir;
  const std::vector<std::string> every10 = {"--nproc", "2", "--shard", "optimizer", "--checkpoint-every", "10"};
  const TrainerRun full = train(dir, "full", kJob, join(every10, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt-full")}));
  ASSERT_TRUE(full.process.status.success()) << full.process.err;
  const TrainerRun first = train(dir, "first", kJob, join(every10, {"--steps", "20", "--checkpoint-dir", dir.file("ckpt")}));
  ASSERT_TRUE(first.process.status.success()) << first.process.err;
  std::filesystem::copy(dir.file("ckpt"), dir.file("ckpt-copy"));
  const TrainerRun resumed = train(dir, "resumed", kJob, join(every10, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt"), "--resume"}));
  ASSERT_TRUE(resumed.process.status.success()) << resumed.process.err;
  expectResumedAsWhole(dir, "full", "resumed", 10);

  // Unsharded from the same checkpoint: the same losses, so the file held all of the state.
  const TrainerRun unsharded = train(dir, "unsharded", kJob, {"--nproc", "2", "--checkpoint-every", "10", "--steps", "30",
                                                 "--checkpoint-dir", dir.file("ckpt-copy"), "--resume"});
  ASSERT_TRUE(unsharded.process.status.success()) << unsharded.process.err;
  expectSameLosses(dir, "resumed", "unsharded", 1e-6);
}

// Stages 2 and 3: a rank keeps its part of the gradients (and of the parameters), staging one
// bucket, and gathers a layer's parameters when it computes it. Four layers, so that the widest is
// well under the whole; 512-float buckets, so that the staging is too.
const std::vector<std::string> kDeeper = {"--layers", "32,64,64,64,10", "--dataset", "synthetic:n=2048,seed=3", "--quiet",
                                          "--batch-per-rank", "32", "--optimizer", "adamw", "--lr", "0.003",
                                          "--seed", "11", "--no-shuffle", "--bucket-mb", "0.002", "--nproc", "3",
                                          "--steps", "20"};

TEST(Shard, GradientAndParameterShardingTrainAsUnshardedHoldingLessPerRank) {
  TempDir dir;
  const TrainerRun whole = train(dir, "whole", kDeeper, {});
  ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
  const auto wholeBytes = whole.lines.front()["param_bytes"].get<double>();
  ASSERT_EQ(whole.lines.front()["grad_bytes"].get<double>(), wholeBytes);
  for (const std::string stage : {"gradients", "parameters"}) {
    SCOPED_TRACE(stage);
    const TrainerRun sharded = train(dir, stage, kDeeper, {"--shard", stage});
    ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;
    // The same sums in the same order (shared memory): the same training, bit for bit.
    expectSameLosses(dir, "whole", stage, 0);
    EXPECT_EQ(maxRelativeDifference(dir.file("whole.safetensors"), dir.file(stage + ".safetensors")), 0.0);
    ASSERT_EQ(sharded.lines.size(), whole.lines.size());
    for (const auto& l : sharded.lines) {
      // A third of the gradients, and two buckets (512 floats each) staged.
      EXPECT_NEAR(l["grad_bytes"].get<double>(), wholeBytes / 3 + 2 * 512 * 4, 2 * 128 * 4) << l.dump();
      if (stage == "parameters") {
        // A third of the parameters, and two of the widest layer (64 x 64 weights and their bias,
        // padded): the one computing and the next, gathered meanwhile.
        EXPECT_NEAR(l["param_bytes"].get<double>(), wholeBytes / 3 + 2 * (64 * 64 + 128) * 4, 2 * 128 * 4) << l.dump();
      } else {
        EXPECT_EQ(l["param_bytes"].get<double>(), wholeBytes) << l.dump();
      }
      const auto scattered = collectiveOf(l, "reduce_scatter"), gathered = collectiveOf(l, "all_gather");
      ASSERT_FALSE(scattered.is_null()) << l.dump();
      ASSERT_FALSE(gathered.is_null()) << l.dump();
      EXPECT_GT(scattered["count"].get<int>(), 1) << "one bucket at a time";
      // Stage 2 gathers the updated parameters once. Stage 3 gathers each layer for forward (4),
      // and for backward layer 1 again (it still holds layers 3 and 2; layer 0 needs none).
      EXPECT_EQ(gathered["count"].get<int>(), stage == "parameters" ? 5 : 1) << l.dump();
      EXPECT_LE(scattered["exposed_us"].get<double>(), scattered["time_us"].get<double>()) << l.dump();
    }
  }
}

// Over Gloo, with micro-steps (each reduce-scattered, the parts added up) and an epoch's short last
// step: equal within rounding.
TEST(Shard, GradientAndParameterShardingOverGlooWithMicroStepsTrainAsUnsharded) {
  TempDir dir;
  const Env gloo = {{"LOCKSTEP_ALLREDUCE", "gloo"}};
  const std::vector<std::string> job = {"--layers", "32,64,64,10", "--dataset", "synthetic:n=1000,seed=3", "--quiet",
                                        "--batch-per-rank", "48", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.01",
                                        "--seed", "11", "--no-shuffle", "--nproc", "3", "--epochs", "2", "--accum-steps", "2",
                                        "--bucket-mb", "0.004"};
  const TrainerRun whole = train(dir, "whole", job, {}, gloo);
  ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
  for (const std::string stage : {"gradients", "parameters"}) {
    const TrainerRun sharded = train(dir, stage, job, {"--shard", stage}, gloo);
    ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;
    expectSameLosses(dir, "whole", stage, 1e-5);
    EXPECT_LE(maxRelativeDifference(dir.file("whole.safetensors"), dir.file(stage + ".safetensors")), 1e-5) << stage;
    // Gloo has no reduce-scatter here: each bucket is all-reduced (its slot whole), and said so.
    for (const auto& l : sharded.lines) {
      EXPECT_TRUE(collectiveOf(l, "reduce_scatter").is_null()) << l.dump();
      EXPECT_GT(collectiveOf(l, "all_reduce")["count"].get<int>(), 2) << l.dump();
    }
  }
}

// On one node, with several buckets per micro-step, two micro-steps, and an epoch whose last step
// leaves rank 2 nothing in its last micro-step: rank 2 still asks for every layer and bucket (no
// rank waits for it), the header is all-reduced once a step, and the training is unsharded's.
TEST(Shard, ShardedParametersWithMicroStepsAndAnEmptySliceOnOneRank) {
  TempDir dir;
  // 1,120 samples: 5 steps of 3 ranks x 32 x 2 micro-steps, then 160: micro-step 0's 96 and 64 more.
  const std::vector<std::string> job = {"--layers", "32,64,64,10", "--dataset", "synthetic:n=1120,seed=3", "--quiet",
                                        "--batch-per-rank", "32", "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.01",
                                        "--seed", "11", "--no-shuffle", "--nproc", "3", "--epochs", "1", "--accum-steps", "2",
                                        "--bucket-mb", "0.004"};
  const TrainerRun whole = train(dir, "whole", job, {});
  ASSERT_TRUE(whole.process.status.success()) << whole.process.err;
  const TrainerRun sharded = train(dir, "sharded", job, {"--shard", "parameters", "--timeout-s", "20"});
  ASSERT_TRUE(sharded.process.status.success()) << sharded.process.err;
  expectSameLosses(dir, "whole", "sharded", 1e-5);
  EXPECT_LE(maxRelativeDifference(dir.file("whole.safetensors"), dir.file("sharded.safetensors")), 1e-5);
  bool shortSlice = false;
  for (const auto& l : sharded.lines) {
    shortSlice = shortSlice || (l["rank"] == 2 && l["samples"].get<int>() < 64);
    EXPECT_EQ(collectiveOf(l, "all_reduce")["count"], 1) << "the header, once a step: " << l.dump();
    EXPECT_GT(collectiveOf(l, "reduce_scatter")["count"].get<int>(), 2) << "several buckets, twice: " << l.dump();
  }
  EXPECT_TRUE(shortSlice) << "the last step did not leave rank 2 short";
}

// Sharded parameters are gathered whole for each checkpoint: the job resumes bit-exactly.
TEST(Shard, AJobWithShardedParametersResumesExactly) {
  TempDir dir;
  const std::vector<std::string> every10 = {"--nproc", "3", "--shard", "parameters", "--checkpoint-every", "10"};
  const TrainerRun full = train(dir, "full", kJob, join(every10, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt-full")}));
  ASSERT_TRUE(full.process.status.success()) << full.process.err;
  const TrainerRun first = train(dir, "first", kJob, join(every10, {"--steps", "20", "--checkpoint-dir", dir.file("ckpt")}));
  ASSERT_TRUE(first.process.status.success()) << first.process.err;
  const TrainerRun resumed = train(dir, "resumed", kJob, join(every10, {"--steps", "30", "--checkpoint-dir", dir.file("ckpt"), "--resume"}));
  ASSERT_TRUE(resumed.process.status.success()) << resumed.process.err;
  expectResumedAsWhole(dir, "full", "resumed", 10);
}

TEST(Shard, EveryStageGoesToTheGpuBackendAndWhatIsNotAKindIsRefusedClearly) {
  TempDir dir;
  // Every stage runs on GPUs (NCCL): here each gets as far as looking for one.
  for (const char* stage : {"optimizer", "gradients", "parameters"}) {
    const TrainerRun gpu = train(dir, std::string("g-") + stage, kJob,
                                 {"--nproc", "2", "--steps", "2", "--shard", stage, "--backend", "cuda"});
    expectTheGpuBackendTakesIt(gpu);
  }
  const TrainerRun bogus = train(dir, "b", kJob, {"--nproc", "2", "--steps", "2", "--shard", "half"});
  EXPECT_FALSE(bogus.process.status.success());
  EXPECT_NE(bogus.process.err.find("is not one of none, optimizer, gradients, parameters"), std::string::npos) << bogus.process.err;
}

}  // namespace
}  // namespace lockstep::test
