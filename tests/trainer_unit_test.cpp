// Issue 2: the trainer's parts on their own: sampling, the model's gradients, optimizers against
// hand-computed values, buckets, file formats and flag parsing.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>

#include "checkpoint.h"
#include "dataset.h"
#include "dist_env.h"
#include "lockstep/common/files.h"
#include "lockstep/common/npy.h"
#include "metrics.h"
#include "model.h"
#include "optimizer.h"
#include "lockstep/jobflags/options.h"
#include "safetensors.h"
#include "sampler.h"
#include "support/test_support.h"

namespace lockstep::trainer {
namespace {

using test::TempDir;
using lockstep::writeFileAtomic;
using namespace lockstep::jobflags;

// ---- sampling ----

class ShardingTest : public ::testing::TestWithParam<std::tuple<std::uint32_t, std::uint64_t, bool>> {};

TEST_P(ShardingTest, EachEpochIsCoveredExactlyOnceByDisjointShards) {
  const auto [world, samples, shuffle] = GetParam();
  const std::uint32_t batch = 7, accum = 2;
  GlobalBatchSampler sampler(samples, world, batch, accum, shuffle, 123);
  std::vector<std::uint32_t> idx;
  for (std::uint32_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> seen(samples, 0);
    std::vector<std::set<std::uint32_t>> perRank(world);
    for (std::uint64_t k = 0; k < sampler.stepsPerEpoch(); ++k) {
      const std::uint64_t step = epoch * sampler.stepsPerEpoch() + k;
      ASSERT_EQ(sampler.epochOf(step), epoch);
      for (std::uint32_t m = 0; m < accum; ++m) {
        for (std::uint32_t r = 0; r < world; ++r) {
          sampler.indices(step, m, r, idx);
          ASSERT_LE(idx.size(), batch);
          for (auto i : idx) {
            ASSERT_LT(i, samples);
            ++seen[i];
            perRank[r].insert(i);
          }
        }
      }
    }
    for (std::uint64_t i = 0; i < samples; ++i) ASSERT_EQ(seen[i], 1) << "sample " << i << " epoch " << epoch;
    for (std::uint32_t a = 0; a < world; ++a)
      for (std::uint32_t b = a + 1; b < world; ++b)
        for (auto i : perRank[a]) ASSERT_EQ(perRank[b].count(i), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes1To4UnevenN, ShardingTest,
                         ::testing::Combine(::testing::Values(1u, 2u, 3u, 4u), ::testing::Values(1ull, 97ull, 100ull, 1001ull),
                                            ::testing::Bool()));

TEST(Sampler, NoShuffleGlobalStepTakesTheSameSamplesHoweverSplit) {
  // Global step k consumes [k*G, (k+1)*G) whether 1 rank x 128, 2 x 64 or 4 x 16 x accum 2.
  const std::uint64_t n = 1000;
  GlobalBatchSampler one(n, 1, 128, 1, false, 0), two(n, 2, 64, 1, false, 0), four(n, 4, 16, 2, false, 0);
  std::vector<std::uint32_t> idx;
  for (std::uint64_t step : {0ull, 3ull, 7ull /* the short last step */, 8ull /* next epoch */}) {
    std::vector<std::uint32_t> a, b, c;
    one.indices(step, 0, 0, a);
    for (std::uint32_t r = 0; r < 2; ++r) {
      two.indices(step, 0, r, idx);
      b.insert(b.end(), idx.begin(), idx.end());
    }
    for (std::uint32_t m = 0; m < 2; ++m)
      for (std::uint32_t r = 0; r < 4; ++r) {
        four.indices(step, m, r, idx);
        c.insert(c.end(), idx.begin(), idx.end());
      }
    std::vector<std::uint32_t> expected;
    for (std::uint64_t p = (step % 8) * 128; p < std::min<std::uint64_t>((step % 8 + 1) * 128, n); ++p) expected.push_back(p);
    EXPECT_EQ(a, expected) << "step " << step;
    EXPECT_EQ(b, expected) << "step " << step;
    EXPECT_EQ(c, expected) << "step " << step;
  }
}

TEST(Sampler, AnUnevenSplitTakesTheSameSamplesEachStep) {
  GlobalBatchSampler even(1000, 3, 20, 2, true, 4), uneven(1000, 3, 20, 2, true, 4);
  uneven.setSplit({35, 5, 20});
  std::vector<std::uint32_t> out;
  for (std::uint64_t step = 0; step < 40; ++step) {
    for (std::uint32_t micro = 0; micro < 2; ++micro) {
      std::multiset<std::uint32_t> a, b;
      std::vector<std::size_t> sizes;
      for (std::uint32_t r = 0; r < 3; ++r) {
        even.indices(step, micro, r, out);
        a.insert(out.begin(), out.end());
        uneven.indices(step, micro, r, out);
        b.insert(out.begin(), out.end());
        sizes.push_back(out.size());
      }
      EXPECT_EQ(a, b) << "step " << step << " micro " << micro;
      if (step % uneven.stepsPerEpoch() != uneven.stepsPerEpoch() - 1) {
        EXPECT_EQ(sizes, (std::vector<std::size_t>{35, 5, 20}));
      }
    }
  }
}

TEST(Sampler, SplitByCostGivesSlowerRanksFewerRows) {
  // Rank 1 takes 3x the time per sample: a quarter of the rows.
  EXPECT_EQ(splitByCost({1.0f, 3.0f}, 128, 256), (std::vector<std::uint32_t>{96, 32}));
  // Equal costs: even; the total is kept through rounding.
  EXPECT_EQ(splitByCost({2.0f, 2.0f, 2.0f}, 100, 100), (std::vector<std::uint32_t>{34, 33, 33}));
  // Caps: no rank above maxRows or below 1; what the cap frees goes to the others.
  EXPECT_EQ(splitByCost({1.0f, 100.0f, 100.0f}, 90, 50), (std::vector<std::uint32_t>{50, 20, 20}));
  EXPECT_EQ(splitByCost({1.0f, 1e6f}, 64, 256), (std::vector<std::uint32_t>{63, 1}));
  // An unmeasured rank (0) counts at the mean cost of the others.
  EXPECT_EQ(splitByCost({1.0f, 0.0f}, 10, 10), (std::vector<std::uint32_t>{5, 5}));
  // Damped: halfway from the current split to the ideal one.
  EXPECT_EQ(splitByCost({1.0f, 3.0f}, 128, 256, {64, 64}), (std::vector<std::uint32_t>{80, 48}));
  const auto split = splitByCost({0.3f, 0.7f, 1.9f, 0.01f}, 257, 200);
  EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0u), 257u);
  for (auto rows : split) EXPECT_TRUE(rows >= 1 && rows <= 200) << rows;
  EXPECT_EQ(split[3], 200u) << "the fastest rank is capped";
}

TEST(Sampler, ShuffleIsSharedAcrossRanksAndChangesEachEpoch) {
  GlobalBatchSampler a(500, 2, 50, 1, true, 9), b(500, 2, 50, 1, true, 9), other(500, 2, 50, 1, true, 10);
  std::vector<std::uint32_t> x, y, z, nextEpoch;
  a.indices(0, 0, 1, x);
  b.indices(0, 0, 1, y);
  other.indices(0, 0, 1, z);
  a.indices(a.stepsPerEpoch(), 0, 1, nextEpoch);
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  EXPECT_NE(x, nextEpoch);
  std::vector<std::uint32_t> ordered(50);
  std::iota(ordered.begin(), ordered.end(), 50u);
  EXPECT_NE(x, ordered);
}

// ---- the model ----

// Summed cross-entropy in double precision, straight from the definition.
double referenceLoss(const ParamLayout& layout, const std::vector<float>& params, const std::vector<float>& x,
                     const std::vector<std::int32_t>& y, std::uint32_t batch, Activation act) {
  const auto& sizes = layout.layers();
  double total = 0;
  for (std::uint32_t s = 0; s < batch; ++s) {
    std::vector<double> in(x.begin() + s * sizes[0], x.begin() + (s + 1) * sizes[0]);
    for (std::size_t l = 0; l < layout.layerCount(); ++l) {
      std::vector<double> out(sizes[l + 1]);
      for (std::uint32_t o = 0; o < sizes[l + 1]; ++o) {
        double z = params[layout.bias(l).offset + o];
        for (std::uint32_t i = 0; i < sizes[l]; ++i) z += params[layout.weight(l).offset + o * sizes[l] + i] * in[i];
        if (l + 1 < layout.layerCount()) {
          z = act == Activation::kRelu ? std::max(z, 0.0) : 0.5 * z * (1 + std::erf(z / std::sqrt(2.0)));
        }
        out[o] = z;
      }
      in = out;
    }
    const double m = *std::max_element(in.begin(), in.end());
    double sum = 0;
    for (double z : in) sum += std::exp(z - m);
    total += std::log(sum) + m - in[static_cast<std::size_t>(y[s])];
  }
  return total;
}

class GradientCheck : public ::testing::TestWithParam<Activation> {};

TEST_P(GradientCheck, BackwardMatchesFiniteDifferences) {
  const Activation act = GetParam();
  ParamLayout layout({5, 7, 6, 4});
  std::vector<float> params(layout.totalFloats());
  initParameters(layout, 3, params.data());
  const std::uint32_t batch = 3;
  std::vector<float> x(batch * 5);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.7f * static_cast<float>(i)) * 1.5f;
  const std::vector<std::int32_t> y = {0, 3, 1};

  Mlp model(layout, act, batch);
  const double loss = model.forward(params.data(), x.data(), y.data(), batch);
  EXPECT_NEAR(loss, referenceLoss(layout, params, x, y, batch, act), 1e-4);
  std::vector<float> grads(layout.totalFloats(), 0.0f);
  std::vector<std::size_t> readyOffsets;
  // Cut inside the middle weight to exercise split GEMMs.
  const std::vector<std::size_t> cuts = {layout.weight(1).offset + 2 * 7, layout.totalFloats()};
  model.backward(params.data(), grads.data(), false, cuts, [&](std::size_t end) { readyOffsets.push_back(end); });
  EXPECT_TRUE(std::is_sorted(readyOffsets.begin(), readyOffsets.end()));
  EXPECT_EQ(readyOffsets.back(), layout.totalFloats());

  for (const auto& t : layout.tensors()) {
    for (std::size_t i = 0; i < t.count; ++i) {
      std::vector<float> p = params;
      const double h = 1e-3;
      p[t.offset + i] = static_cast<float>(params[t.offset + i] + h);
      const double up = referenceLoss(layout, p, x, y, batch, act);
      p[t.offset + i] = static_cast<float>(params[t.offset + i] - h);
      const double down = referenceLoss(layout, p, x, y, batch, act);
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(grads[t.offset + i], numeric, 2e-3 + 1e-2 * std::abs(numeric)) << t.name << "[" << i << "]";
    }
  }

  // Accumulating a second identical pass doubles every gradient.
  model.forward(params.data(), x.data(), y.data(), batch);
  std::vector<float> twice = grads;
  model.backward(params.data(), twice.data(), true, cuts, [](std::size_t) {});
  for (const auto& t : layout.tensors())
    for (std::size_t i = 0; i < t.count; ++i) EXPECT_NEAR(twice[t.offset + i], 2 * grads[t.offset + i], 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Activations, GradientCheck, ::testing::Values(Activation::kRelu, Activation::kGelu),
                         [](const auto& param) { return param.param == Activation::kRelu ? "Relu" : "Gelu"; });

TEST(Model, LayoutIsAlignedDisjointAndLastLayerFirst) {
  ParamLayout layout({784, 1024, 1024, 10});
  EXPECT_EQ(layout.parameterCount(), 784u * 1024 + 1024 + 1024u * 1024 + 1024 + 1024u * 10 + 10);
  EXPECT_EQ(layout.bias(2).offset, ParamLayout::kHeaderFloats);
  std::size_t previousEnd = ParamLayout::kHeaderFloats;
  for (std::size_t l = 3; l-- > 0;) {
    for (const TensorSlot* t : {&layout.bias(l), &layout.weight(l)}) {
      EXPECT_EQ(t->offset, previousEnd) << t->name;
      EXPECT_EQ(t->offset % ParamLayout::kAlignFloats, 0u) << t->name;
      previousEnd = t->offset + t->paddedCount;
    }
  }
  EXPECT_EQ(previousEnd, layout.totalFloats());
  EXPECT_EQ(layout.tensors()[0].name, "layers.0.weight");
  EXPECT_EQ(layout.tensors()[1].name, "layers.0.bias");
  EXPECT_EQ(layout.weight(0).shape, (std::vector<std::uint64_t>{1024, 784}));
}

TEST(Model, BucketsTileTheBufferWithinTheirCaps) {
  ParamLayout layout({784, 1024, 1024, 10});
  for (std::size_t capMb : {1, 2, 25}) {
    const std::size_t cap = capMb << 20;
    const auto buckets = planBuckets(layout, cap, std::min<std::size_t>(cap, 1 << 20));
    ASSERT_FALSE(buckets.empty());
    EXPECT_EQ(buckets.front().begin, 0u);
    EXPECT_EQ(buckets.back().end, layout.totalFloats());
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      if (i > 0) {
        EXPECT_EQ(buckets[i].begin, buckets[i - 1].end);
      }
      EXPECT_LE((buckets[i].end - buckets[i].begin) * 4, i == 0 ? std::min<std::size_t>(cap, 1 << 20) : cap);
    }
    if (capMb == 25) {
      EXPECT_EQ(buckets.size(), 2u);  // a 1 MiB first bucket, then the rest
    }
  }
  // Cuts inside a weight fall on row boundaries.
  for (const auto& b : planBuckets(layout, 1 << 20, 1 << 20)) {
    for (std::size_t l = 0; l < 3; ++l) {
      const auto& w = layout.weight(l);
      if (b.end > w.offset && b.end < w.offset + w.count) {
        EXPECT_EQ((b.end - w.offset) % layout.layers()[l], 0u);
      }
    }
  }
}

// ---- optimizers, against values computed by hand ----

TEST(Optimizer, SgdMomentumNesterovAndWeightDecayFollowPyTorch) {
  ParamLayout layout({1, 2});  // weight [2,1] at the end, bias [2] after the header
  const std::size_t w = layout.weight(0).offset;
  OptimizerSpec spec;
  spec.momentum = 0.9;
  spec.weightDecay = 0.1;
  Optimizer opt(spec, layout);
  std::vector<float> p(layout.totalFloats(), 0.0f), g(layout.totalFloats(), 0.0f);
  p[w] = 1.0f;
  g[w] = 4.0f;  // summed gradient over 2 samples: the mean is 2
  opt.beginStep(0.5);
  opt.apply(p.data(), g.data(), 0, layout.totalFloats(), 0.5f);
  // d = 2 + 0.1*1 = 2.1; buf = 2.1 (first step); p = 1 - 0.5*2.1 = -0.05
  EXPECT_NEAR(p[w], -0.05f, 1e-6);
  opt.beginStep(0.5);
  opt.apply(p.data(), g.data(), 0, layout.totalFloats(), 0.5f);
  // d = 2 + 0.1*(-0.05) = 1.995; buf = 0.9*2.1 + 1.995 = 3.885; p = -0.05 - 0.5*3.885 = -1.9925
  EXPECT_NEAR(p[w], -1.9925f, 1e-5);

  spec.nesterov = true;
  spec.weightDecay = 0;
  Optimizer nesterov(spec, layout);
  p[w] = 1.0f;
  nesterov.beginStep(0.1);
  nesterov.apply(p.data(), g.data(), 0, layout.totalFloats(), 0.5f);
  // d = 2, buf = 2, step = d + 0.9*buf = 3.8: p = 1 - 0.38
  EXPECT_NEAR(p[w], 0.62f, 1e-6);
}

TEST(Optimizer, AdamWFollowsPyTorch) {
  ParamLayout layout({1, 2});
  const std::size_t w = layout.weight(0).offset;
  OptimizerSpec spec;
  spec.kind = OptimizerKind::kAdamW;
  spec.weightDecay = 0.01;
  Optimizer opt(spec, layout);
  std::vector<float> p(layout.totalFloats(), 0.0f), g(layout.totalFloats(), 0.0f);
  p[w] = 1.0f;
  g[w] = 0.5f;
  opt.beginStep(0.1);
  opt.apply(p.data(), g.data(), 0, layout.totalFloats(), 1.0f);
  // p = 1*(1-0.001) = 0.999; m = 0.05, v = 0.00025; mhat = 0.5, vhat = 0.25 -> step 0.1*0.5/(0.5+1e-8)
  EXPECT_NEAR(p[w], 0.899f, 1e-6);
  opt.beginStep(0.1);
  g[w] = -0.5f;
  opt.apply(p.data(), g.data(), 0, layout.totalFloats(), 1.0f);
  // p = 0.899*0.999 = 0.898101; m = 0.9*0.05 - 0.05 = -0.005, v = 0.999*0.00025 + 0.00025 = 0.00049975
  // mhat = -0.005/0.19 = -0.0263158, vhat = 0.00049975/0.001999 = 0.25 -> p += 0.1*0.0263158/0.5
  EXPECT_NEAR(p[w], 0.898101f + 0.00526316f, 2e-6);
  EXPECT_EQ(opt.stepsTaken(), 2);
}

TEST(Optimizer, LinearScalingRule) {
  JobSpec s;
  s.optimizer.lr = 0.1;
  s.batchPerRank = 64;
  s.worldSize = 4;
  s.accumSteps = 2;
  EXPECT_DOUBLE_EQ(effectiveLearningRate(s), 0.1);
  s.optimizer.lrScaling = LrScaling::kLinear;
  EXPECT_DOUBLE_EQ(effectiveLearningRate(s), 0.8);
  s.optimizer.lrBaseBatch = 256;
  EXPECT_DOUBLE_EQ(effectiveLearningRate(s), 0.2);
}

// ---- files ----

TEST(Safetensors, RoundTripAndMetadata) {
  const std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1.5f};
  const std::string bytes = encodeSafetensors({{"w", {2, 3}, a.data()}, {"b", {1}, b.data()}}, {{"step", "7"}});
  EXPECT_EQ((bytes.size() - 8 - 28) % 8, 0u);  // the header keeps the data 8-byte aligned
  auto file = decodeSafetensors(bytes, "mem");
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(file->tensors.at("w").shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(file->tensors.at("w").data, a);
  EXPECT_EQ(file->tensors.at("b").data, b);
  EXPECT_EQ(file->metadata.at("step"), "7");
}

TEST(Safetensors, RefusesDamagedFiles) {
  const std::vector<float> a = {1, 2};
  const std::string good = encodeSafetensors({{"w", {2}, a.data()}}, {});
  EXPECT_FALSE(decodeSafetensors(good.substr(0, good.size() - 1), "x").ok());  // truncated data
  EXPECT_FALSE(decodeSafetensors(good.substr(0, 5), "x").ok());
  std::string hugeHeader = good;
  hugeHeader[7] = 0x7f;
  EXPECT_FALSE(decodeSafetensors(hugeHeader, "x").ok());
  std::string notJson = good;
  notJson[8] = '[';
  EXPECT_FALSE(decodeSafetensors(notJson, "x").ok());
  std::string bf16 = good;
  const auto pos = bf16.find("F32");
  bf16.replace(pos, 3, "F16");
  auto r = decodeSafetensors(bf16, "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("float32"), std::string::npos);
}

// Issue 14: --init-weights pointed at the agent's secret key printed its first 8 bytes as a
// "header length" into an event every client sees.
TEST(Safetensors, AnErrorNeverEchoesTheFilesBytes) {
  const std::string secret = "0123456789ABCDEFsecret-key-material\n";
  std::uint64_t asLength = 0;
  for (int i = 0; i < 8; ++i) asLength |= std::uint64_t{static_cast<unsigned char>(secret[i])} << (8 * i);
  auto r = decodeSafetensors(secret, "agent.key");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message.find(std::to_string(asLength)), std::string::npos) << r.error().message;
  EXPECT_EQ(r.error().message.find("01234567"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("is it a safetensors file?"), std::string::npos) << r.error().message;
}

TEST(Safetensors, RefusesOverlappingTensors) {
  const std::vector<float> a = {1, 2};
  std::string bytes = encodeSafetensors({{"a", {2}, a.data()}, {"b", {2}, a.data()}}, {});
  // Point b's data at a's.
  const auto pos = bytes.find("[8,16]");
  ASSERT_NE(pos, std::string::npos);
  bytes.replace(pos, 6, "[0, 8]");
  auto r = decodeSafetensors(bytes, "x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("overlap"), std::string::npos) << r.error().message;
}

TEST(Checkpoint, SaveFindLatestLoadAndRetention) {
  TempDir dir;
  ParamLayout layout({3, 4, 2});
  JobSpec spec;
  spec.layers = {3, 4, 2};
  spec.optimizer.momentum = 0.9;
  Optimizer opt(spec.optimizer, layout);
  std::vector<float> p(layout.totalFloats());
  initParameters(layout, 1, p.data());
  (*opt.stateBuffers()[0].data)[layout.weight(1).offset] = 0.25f;
  opt.setStepsTaken(30);
  const ResumeSettings settings = resumeSettings(spec, 1000, 42);
  {
    CheckpointWriter writer(dir.path().string(), layout, 2);
    for (std::uint64_t step : {10, 20, 30}) ASSERT_TRUE(writer.submit(snapshotCheckpoint(step, settings, p, opt)).ok());
    auto last = writer.finish();
    ASSERT_TRUE(last.ok()) << last.error().message;
    EXPECT_EQ(std::filesystem::path(*last).filename(), "step-00000030.safetensors");
  }
  auto latest = latestCheckpoint(dir.path().string());
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ(std::filesystem::path(**latest).filename(), "step-00000030.safetensors");
  EXPECT_FALSE(std::filesystem::exists(dir.file("step-00000010.safetensors")));  // keep = 2

  Optimizer restored(spec.optimizer, layout);
  std::vector<float> q(layout.totalFloats(), 0.0f);
  auto loaded = loadCheckpoint(**latest, layout, q.data(), restored, settings);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ(*loaded, 30u);
  EXPECT_EQ(q, p);
  EXPECT_EQ((*restored.stateBuffers()[0].data)[layout.weight(1).offset], 0.25f);
  EXPECT_EQ(restored.stepsTaken(), 30);

  // Every setting that changes the computation must match: here momentum, and the data.
  for (auto [change, text] : std::initializer_list<std::pair<std::function<ResumeSettings()>, const char*>>{
           {[&] {
              JobSpec other = spec;
              other.optimizer.momentum = 0.5;
              return resumeSettings(other, 1000, 42);
            },
            "momentum = 0.90000000000000002 but this run has momentum = 0.5"},
           {[&] { return resumeSettings(spec, 1000, 43); }, "dataset_hash = 42 but this run has dataset_hash = 43"}}) {
    auto refused = loadCheckpoint(**latest, layout, q.data(), restored, change());
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find(text), std::string::npos) << refused.error().message;
  }
}

TEST(Checkpoint, NamesThatAreNotStepNumbersAreIgnored) {
  TempDir dir;
  std::ofstream(dir.file("step-99999999999999999999999.safetensors")) << "x";
  std::ofstream(dir.file("step-12x.safetensors")) << "x";
  auto latest = latestCheckpoint(dir.path().string());
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());
}

TEST(Checkpoint, WeightsWithForeignNamesExplainTheConvention) {
  TempDir dir;
  const std::vector<float> w(4 * 3), b(4);
  ASSERT_TRUE(writeFileAtomic(dir.file("seq.safetensors"),
                              encodeSafetensors({{"0.weight", {4, 3}, w.data()}, {"0.bias", {4}, b.data()}}, {}))
                  .ok());
  ParamLayout layout({3, 4});
  std::vector<float> p(layout.totalFloats());
  auto r = loadWeights(dir.file("seq.safetensors"), layout, p.data());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no tensor 'layers.0.weight'"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("0.weight"), std::string::npos);

  ParamLayout wider({3, 5});
  ASSERT_TRUE(saveWeights(dir.file("w.safetensors"), layout, p.data()).ok());
  std::vector<float> q(wider.totalFloats());
  r = loadWeights(dir.file("w.safetensors"), wider, q.data());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("has shape [4, 3] but the model needs [5, 3]"), std::string::npos) << r.error().message;
}

TEST(Npy, HeaderParsing) {
  TempDir dir;
  const std::vector<float> x(6, 1.0f);
  test::writeNpy(dir.file("x.npy"), "<f4", {2, 3}, x.data(), x.size() * 4);
  const std::string bytes = test::readText(dir.file("x.npy"));
  auto h = parseNpyHeader(bytes, "x.npy");
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_EQ(h->descr, "<f4");
  EXPECT_EQ(h->shape, (std::vector<std::uint64_t>{2, 3}));
  EXPECT_EQ(h->dataOffset % 64, 0u);
  EXPECT_FALSE(h->fortranOrder);
  EXPECT_FALSE(parseNpyHeader("PK\x03\x04 not npy", "z.npz").ok());
}

TEST(Synthetic, DeterministicBalancedAndInRange) {
  auto a = makeSyntheticDataset({4000, 16, 5, 7});
  auto b = makeSyntheticDataset({4000, 16, 5, 7});
  auto c = makeSyntheticDataset({4000, 16, 5, 8});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->features, b->features);
  EXPECT_EQ(a->labels, b->labels);
  EXPECT_NE(a->features, c->features);
  std::vector<int> counts(5, 0);
  for (auto y : a->labels) {
    ASSERT_GE(y, 0);
    ASSERT_LT(y, 5);
    ++counts[static_cast<std::size_t>(y)];
  }
  // No class is missing or dominant (a uniform split would be 800 each).
  for (int n : counts) {
    EXPECT_GT(n, 200);
    EXPECT_LT(n, 2000);
  }
}

// ---- flags ----

TEST(Options, TheIssueExampleParses) {
  auto o = parseTrainerArgs({"--backend", "cpu", "--nproc", "2", "--layers", "784,1024,1024,10", "--dataset",
                             "synthetic:n=65536,dim=784,classes=10,seed=1", "--batch-per-rank", "64", "--steps", "200",
                             "--optimizer", "sgd", "--lr", "0.01", "--momentum", "0.9", "--metrics-out", "m.jsonl"});
  ASSERT_TRUE(o.ok()) << o.error().message;
  EXPECT_EQ(o->nproc, 2u);
  EXPECT_EQ(o->spec.worldSize, 2u);
  EXPECT_EQ(o->spec.layers, (std::vector<std::uint32_t>{784, 1024, 1024, 10}));
  EXPECT_EQ(std::get<SyntheticDataset>(o->spec.dataset), (SyntheticDataset{65536, 784, 10, 1}));
  EXPECT_DOUBLE_EQ(o->spec.optimizer.momentum, 0.9);
  EXPECT_EQ(o->metricsOut, "m.jsonl");
  EXPECT_EQ(withoutNproc({"--nproc", "2", "--steps", "3", "--nproc=4"}), (std::vector<std::string>{"--steps", "3"}));
}

TEST(Options, AJobSpecSurvivesTheTripThroughTrainerFlags) {
  // The agent turns a JobSpec into flags; the trainer must read back the same job.
  JobSpec spec;
  spec.jobId = "trip-1";
  spec.layers = {12, 40, 7};
  spec.activation = Activation::kGelu;
  spec.dataset = NpyDataset{"/data/x.npy", "/data/y.npy"};
  spec.batchPerRank = 48;
  spec.accumSteps = 3;
  spec.optimizer = {OptimizerKind::kAdamW, 0.1 / 3, 0.0, false, 0.013, 0.85, 0.995, 1e-7, LrScaling::kLinear, 96};
  spec.epochs = 4;
  spec.targetLoss = 0.125;
  spec.shuffle = false;
  spec.seed = 1234567890123ull;
  spec.bucketMb = 2.5;
  spec.checkpointEvery = 50;
  spec.checkpointDir = "/ckpt";
  spec.keepCheckpoints = 7;  // lockstepctl once dropped it: it reaches the ranks now
  spec.initWeightsPath = "/w.safetensors";
  spec.timeoutS = 90;
  const auto args = jobSpecToTrainerArgs(spec, "/m.jsonl");
  auto parsed = parseTrainerArgs(args);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->spec, spec);
  EXPECT_EQ(parsed->metricsOut, "/m.jsonl");
  // Issue 14: only a restart attempt resumes; a new job on a directory with checkpoints is refused.
  EXPECT_FALSE(parsed->resume);
  JobSpec restart = spec;
  restart.attempt = 1;
  auto resumed = parseTrainerArgs(jobSpecToTrainerArgs(restart, "/m.jsonl"));
  ASSERT_TRUE(resumed.ok()) << resumed.error().message;
  EXPECT_TRUE(resumed->resume);  // a restart continues from the last attempt's checkpoints

  spec.dataset = SyntheticDataset{1000, 12, 7, 9};
  spec.optimizer = {OptimizerKind::kSgd, 0.05, 0.9, true, 0.0, 0.9, 0.999, 1e-8, LrScaling::kNone, 0};
  spec.epochs = 0;
  spec.steps = 77;
  spec.targetLoss.reset();
  spec.checkpointDir.clear();
  spec.checkpointEvery = 0;
  spec.keepCheckpoints = 0;
  parsed = parseTrainerArgs(jobSpecToTrainerArgs(spec, "/m.jsonl"));
  ASSERT_TRUE(parsed.ok()) << parsed.error().message;
  EXPECT_EQ(parsed->spec, spec);
}

TEST(Options, MistakesNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--layers", "784,10", "--steps", "1", "--bogus"}, "unknown option --bogus"},
      {{"--layers", "784,abc", "--steps", "1"}, "--layers: 'abc' is not a whole number"},
      {{"--layers", "784,10"}, "give --steps N or --epochs N"},
      {{"--steps", "1"}, "--layers is required"},
      {{"--layers", "784,10", "--steps", "1", "--lr"}, "--lr needs a value"},
      {{"--layers", "784,10", "--steps", "1", "--optimizer", "lamb"}, "'lamb' is not one of sgd, adamw"},
      {{"--layers", "784,10", "--steps", "1", "--dataset", "synthetic:n=10,colour=red"}, "unknown key 'colour'"},
      {{"--layers", "784,10", "--steps", "1", "--dataset", "npy:only-one.npy"}, "needs two file names"},
      {{"--layers", "784,10", "--steps", "1", "--dataset", "synthetic:dim=512"}, "first layer size is 784"},
      {{"--layers", "784,10", "--steps", "1", "--resume"}, "--resume needs --checkpoint-dir"},
      {{"--layers", "784,10", "--steps", "1", "--momentum", "1.5"}, "momentum is 1.5"},
  };
  for (const auto& [args, expected] : cases) {
    auto o = parseTrainerArgs(args);
    ASSERT_FALSE(o.ok()) << expected;
    EXPECT_NE(o.error().message.find(expected), std::string::npos) << o.error().message;
  }
}

// ---- metrics lines (--metrics-out) ----

TEST(MetricsLine, AStepReportSurvivesTheTripThroughItsLine) {
  StepReport r;
  r.jobId = "j";
  r.rank = 3;
  r.worldSize = 4;
  r.attempt = 1;
  r.step = 12'345'678'901ull;
  r.epoch = 2;
  r.samples = 64;
  r.loss = 0.25f;
  r.globalLoss = 0.5f;
  r.dataTimeUs = 10;
  r.computeTimeUs = 20;
  r.allreduceTimeUs = 7;
  r.bytesReduced = 7'455'744;
  r.stepTimeUs = 40;
  r.timeUnixUs = 1'700'000'000'000'000;
  r.lr = NAN;  // written as null, read back as NaN
  auto back = stepReportFromJson(stepReportJson(r));
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_FALSE(back->exposedCommTimeUs.has_value()) << "unknown stays unknown";
  EXPECT_TRUE(std::isnan(back->lr));
  back->lr = r.lr = 0.01;
  EXPECT_EQ(*back, r);
}

TEST(MetricsLine, ABadLineNamesTheField) {
  StepReport r;
  r.jobId = "j";
  const std::string good = stepReportJson(r);
  const auto error = [&](const std::string& from, const std::string& to) {
    std::string line = good;
    const auto at = line.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    line.replace(at, from.size(), to);
    const auto parsed = stepReportFromJson(line);
    return parsed ? std::string("parsed") : parsed.error().message;
  };
  EXPECT_EQ(error("\"rank\":0", "\"rank\":-1"), "not a step report line: \"rank\" must be a whole number from 0");
  EXPECT_EQ(error("\"rank\":0", "\"rank\":4294967296"), "not a step report line: \"rank\" must be a whole number from 0");
  EXPECT_EQ(error("\"samples\":0", "\"samples\":1.5"), "not a step report line: \"samples\" must be a whole number from 0");
  EXPECT_EQ(error("\"epoch\":0", "\"epoch\":true"), "not a step report line: \"epoch\" must be a whole number from 0");
  EXPECT_EQ(error("\"job_id\":\"j\"", "\"job\":\"j\""), "not a step report line: \"job_id\" must be a string (it is missing)");
  EXPECT_EQ(error("\"loss\":", "\"loss\":\"x\",\"was\":"), "not a step report line: \"loss\" must be a number or null");
  EXPECT_FALSE(stepReportFromJson(""));
  EXPECT_FALSE(stepReportFromJson("[1]"));
}

TEST(MetricsLine, AFileIsReadLineByLineAndABadLineIsNamed) {
  TempDir dir;
  StepReport r;
  r.jobId = "j";
  const std::string good = stepReportJson(r);  // ends in a newline
  ASSERT_TRUE(writeFileAtomic(dir.file("ok.jsonl"), good + "\n" + good));
  const auto read = readStepReports(dir.file("ok.jsonl"));
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_EQ(read->size(), 2u) << "the blank line between is skipped";
  ASSERT_TRUE(writeFileAtomic(dir.file("bad.jsonl"), good + "\n{\"job_id\": 1}\n"));
  const auto bad = readStepReports(dir.file("bad.jsonl"));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, dir.file("bad.jsonl") + " line 3: not a step report line: \"job_id\" must be a string");
  EXPECT_FALSE(readStepReports(dir.file("missing.jsonl")));
}

// A rank of a job as large as a spec may be (32,768 ranks) reads its place from torchrun's
// variables; one past it is refused, naming the variable.
TEST(DistEnv, ARankOfTheLargestJobASpecAllowsReadsItsPlace) {
  const auto withEnv = [](const char* worldSize) {
    ::setenv("RANK", "16383", 1);
    ::setenv("WORLD_SIZE", worldSize, 1);
    ::setenv("LOCAL_RANK", "7", 1);
    ::setenv("LOCAL_WORLD_SIZE", "8", 1);
    ::setenv("MASTER_ADDR", "10.0.0.1", 1);
    ::setenv("MASTER_PORT", "29500", 1);
    auto env = distEnvFromEnvironment();
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
      ::unsetenv(name);
    }
    return env;
  };
  const auto big = withEnv("16384");
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ(big->worldSize, 16384u);
  EXPECT_EQ(big->rank, 16383u);
  EXPECT_TRUE(withEnv("32768").ok());
  const auto over = withEnv("32769");
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().message.find("WORLD_SIZE"), std::string::npos) << over.error().message;
}

}  // namespace
}  // namespace lockstep::trainer
