// Model FLOPs utilization (issue 46; docs/kpis.md): the KPI engine's MFU from the step reports'
// FLOPs and the peaks their agents set, and the table of GPU datasheet peaks.

#include <gtest/gtest.h>

#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/peaks.h"
#include "lockstep/present/present.h"

namespace lockstep::kpi {
namespace {

constexpr std::int64_t t0 = 1'700'000'000'000'000;
constexpr std::int64_t kSecond = 1'000'000;

JobSpec job() {
  JobSpec s;
  s.jobId = "m";
  s.worldSize = 2;
  s.steps = 100;
  s.ranks = {{0, "n", 0, 0u}, {1, "n", 1, 1u}};
  return s;
}

StepReport step(std::uint32_t rank, std::uint64_t n, std::optional<double> flops, std::optional<double> peak) {
  StepReport r;
  r.jobId = "m";
  r.rank = rank;
  r.worldSize = 2;
  r.step = n;
  r.samples = 10;
  r.loss = 1.0f;
  r.stepTimeUs = kSecond;
  r.timeUnixUs = t0 + static_cast<std::int64_t>(n) * kSecond;
  r.flops = flops;
  if (flops) r.flopsBasis = FlopsBasis::kDeclared;
  r.peakFlops = peak;
  return r;
}

JobEvent peakEvent(const std::string& message) {
  JobEvent e;
  e.jobId = "m";
  e.kind = JobEventKind::kPeak;
  e.timeUnixUs = t0;
  e.message = message;
  return e;
}

// One step a second; the 5 s window holds steps 16..20 of each rank.
TEST(Mfu, EachRanksAndTheJobsOverTheWindow) {
  JobTracker t(job(), Settings{5.0, 0.1, std::nullopt, 100});
  t.add(peakEvent("not yet measured on m"), "m");
  t.add(peakEvent("10.0 TFLOP/s per GPU on n: a test GPU"), "n");
  t.add(peakEvent("10.0 TFLOP/s per GPU on n: a test GPU"), "n");  // said again: kept once
  t.add(peakEvent("another part's peak"), "m");                   // m's newest replaces its first
  for (std::uint64_t n = 1; n <= 20; ++n) {
    t.add(step(0, n, 2e12, 1e13), "n");
    t.add(step(1, n, n == 20 ? 7e12 : 3e12, 1e13), "n");
  }
  const JobKpis k = t.snapshot(t0 + 20 * kSecond);
  ASSERT_EQ(k.ranks.size(), 2u);
  // Rank 0: 5 steps x 2e12 over 5 s = 2e12 FLOP/s of 1e13; rank 1: (4 x 3e12 + 7e12) / 5 s.
  EXPECT_DOUBLE_EQ(*k.ranks[0].modelFlopsPerSecond, 2e12);
  EXPECT_DOUBLE_EQ(*k.ranks[0].mfu, 0.2);
  EXPECT_DOUBLE_EQ(*k.ranks[1].modelFlopsPerSecond, 3.8e12);
  EXPECT_DOUBLE_EQ(*k.ranks[1].mfu, 0.38);
  EXPECT_DOUBLE_EQ(*k.modelFlopsPerSecond, 5.8e12);
  EXPECT_DOUBLE_EQ(*k.peakFlops, 2e13);
  EXPECT_DOUBLE_EQ(*k.mfu, 0.29);
  EXPECT_EQ(k.flopsBasis, "declared by the program");
  EXPECT_EQ(k.peakBasis, "another part's peak; 10.0 TFLOP/s per GPU on n: a test GPU");
  EXPECT_EQ(present::mfuText(k), "29.0% of peak (5.8 TFLOP/s of 20.0 TFLOP/s)");
  EXPECT_EQ(present::mfuBasisText(k),
            "FLOPs: declared by the program; peak: another part's peak; 10.0 TFLOP/s per GPU on n: a test GPU");
}

// A rank without a peak (its GPU not in the table) counts in the FLOP/s, not in the utilization:
// the job's MFU is over the ranks whose peak is known.
TEST(Mfu, RanksWithoutAPeakAreLeftOutOfTheUtilization) {
  JobTracker t(job(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t n = 1; n <= 10; ++n) {
    t.add(step(0, n, 2e12, 1e13), "n");
    StepReport other = step(1, n, 3e12, std::nullopt);
    other.flopsBasis = FlopsBasis::kTokens;
    t.add(other, "n");
  }
  const JobKpis k = t.snapshot(t0 + 10 * kSecond);
  EXPECT_DOUBLE_EQ(*k.modelFlopsPerSecond, 5e12);
  EXPECT_DOUBLE_EQ(*k.peakFlops, 1e13);
  EXPECT_DOUBLE_EQ(*k.mfu, 0.2);
  EXPECT_FALSE(k.ranks[1].mfu);
  EXPECT_EQ(k.flopsBasis, "mixed");
}

TEST(Mfu, UnknownWithoutFlopsOrWithoutAnyPeak) {
  JobTracker none(job(), Settings{5.0, 0.1, std::nullopt, 100});
  JobTracker noPeak(job(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t n = 1; n <= 5; ++n) {
    none.add(step(0, n, std::nullopt, 1e13), "n");  // a peak alone is no utilization
    noPeak.add(step(0, n, 1e12, std::nullopt), "n");
  }
  const JobKpis a = none.snapshot(t0 + 5 * kSecond);
  EXPECT_FALSE(a.modelFlopsPerSecond || a.mfu || a.peakFlops);
  EXPECT_EQ(present::mfuText(a), "");
  const JobKpis b = noPeak.snapshot(t0 + 5 * kSecond);
  EXPECT_DOUBLE_EQ(*b.modelFlopsPerSecond, 1e12);
  EXPECT_FALSE(b.mfu || b.peakFlops);
  EXPECT_EQ(present::mfuText(b), "– (1.0 TFLOP/s; no peak known)");
}

// NVML's names of the GPUs, against the datasheets' dense figures.
TEST(Mfu, GpuPeaksByNameAndPrecision) {
  const auto tflops = [](std::string_view name, Precision p) -> std::optional<double> {
    const auto peak = gpuPeak(name, p);
    return peak ? std::optional<double>(peak->flops / 1e12) : std::nullopt;
  };
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", Precision::kBf16), 989.5);
  EXPECT_EQ(gpuPeak("NVIDIA H100 80GB HBM3", Precision::kBf16)->model, "H100 SXM");
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", Precision::kTf32), 494.5);
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", Precision::kFp32), 67);
  EXPECT_EQ(tflops("NVIDIA H100 80GB HBM3", Precision::kFp8), 1979);
  EXPECT_EQ(tflops("NVIDIA H100 PCIe", Precision::kBf16), 756.5);
  EXPECT_EQ(tflops("NVIDIA H100 NVL", Precision::kBf16), 835.5);
  EXPECT_EQ(tflops("NVIDIA H200", Precision::kBf16), 989.5);
  EXPECT_EQ(tflops("NVIDIA H200 NVL", Precision::kBf16), 835.5);
  EXPECT_EQ(tflops("NVIDIA GH200 480GB", Precision::kBf16), 989.5);
  EXPECT_EQ(tflops("NVIDIA A100-SXM4-80GB", Precision::kBf16), 312);
  EXPECT_EQ(tflops("NVIDIA A100 80GB PCIe", Precision::kTf32), 156);
  EXPECT_FALSE(tflops("NVIDIA A100-SXM4-40GB", Precision::kFp8)) << "the A100 has no fp8";
  EXPECT_EQ(tflops("NVIDIA L40S", Precision::kBf16), 362);
  EXPECT_EQ(tflops("NVIDIA L4", Precision::kBf16), 121) << "not the L40S's";
  EXPECT_EQ(tflops("NVIDIA A10", Precision::kBf16), 125) << "not the A100's";
  EXPECT_EQ(tflops("Tesla V100-SXM2-32GB", Precision::kFp16), 125);
  EXPECT_EQ(tflops("Tesla V100-PCIE-16GB", Precision::kFp16), 112);
  EXPECT_FALSE(tflops("Tesla V100-SXM2-32GB", Precision::kBf16));
  EXPECT_FALSE(tflops("NVIDIA GeForce RTX 3050", Precision::kBf16)) << "not in the table: unknown, not a guess";
}

TEST(Mfu, FlopRatesWithTheirPrefix) {
  EXPECT_EQ(present::flopsRate(989.5e12), "989.5 TFLOP/s");
  EXPECT_EQ(present::flopsRate(7.9e15), "7.9 PFLOP/s");
  EXPECT_EQ(present::flopsRate(180.3e9), "180.3 GFLOP/s");
  EXPECT_EQ(present::flopsRate(512), "512 FLOP/s");
  EXPECT_EQ(present::flopsRate(std::nullopt), "–");
}

}  // namespace
}  // namespace lockstep::kpi
