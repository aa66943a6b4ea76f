// Issue 4: the KPI engine against values computed by hand (the arithmetic is in the comments).

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/projection.h"
#include "lockstep/present/present.h"

namespace lockstep::kpi {
namespace {

constexpr std::int64_t t0 = 1'700'000'000'000'000;  // a wall-clock origin, in microseconds
constexpr std::int64_t kSecond = 1'000'000;

JobSpec gpuJob() {
  JobSpec s;
  s.jobId = "k";
  s.worldSize = 2;
  s.steps = 100;
  s.batchPerRank = 10;
  s.targetLoss = 1.62;
  s.backend = Backend::kCuda;
  s.ranks = {{0, "n", 0, 0u}, {1, "n", 1, 1u}};
  s.prices = {2.0, 0.0, 0.5, "USD"};
  return s;
}

StepReport report(std::uint32_t rank, std::uint64_t step, std::int64_t computeUs, std::int64_t exposedUs,
                   std::int64_t timeUs) {
  StepReport r;
  r.jobId = "k";
  r.rank = rank;
  r.worldSize = 2;
  r.step = step;
  r.samples = 10;
  r.loss = 2.0f - 0.1f * static_cast<float>(step);
  r.globalLoss = r.loss;
  r.dataTimeUs = 100'000;
  r.computeTimeUs = computeUs;
  r.exposedCommTimeUs = exposedUs;
  r.stepTimeUs = kSecond;
  r.timeUnixUs = timeUs;
  return r;
}

GpuSample gpu(std::uint32_t index, std::int64_t timeUs, std::optional<float> util, std::optional<std::uint64_t> energy,
              std::optional<std::uint32_t> powerMw = {}) {
  GpuSample s;
  s.node = "n";
  s.gpuIndex = index;
  s.jobId = "k";
  s.timeUnixUs = timeUs;
  s.utilizationPct = util;
  s.energyMillijoules = energy;
  s.powerMilliwatts = powerMw;
  return s;
}

// Ten steps, one a second; rank 0 computes 0.6 s and waits 0.3 s, rank 1 computes 0.8 s and
// waits 0.1 s; both read data for 0.1 s.
JobTracker tenSteps() {
  JobTracker t(gpuJob(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 10; ++s) {
    t.add(report(0, s, 600'000, 300'000, t0 + static_cast<std::int64_t>(s) * kSecond), "n");
    t.add(report(1, s, 800'000, 100'000, t0 + static_cast<std::int64_t>(s) * kSecond), "n");
  }
  t.add(gpu(0, t0 + 2 * kSecond, 40.0f, 1'000'000, 300'000));
  t.add(gpu(0, t0 + 4 * kSecond, 60.0f, 4'600'000, 310'000));
  t.add(gpu(1, t0 + 2 * kSecond, 80.0f, 0));
  t.add(gpu(1, t0 + 4 * kSecond, std::nullopt, 3'600'000));
  return t;
}

TEST(Kpi, ThroughputOverheadScalingAndImbalance) {
  const JobKpis k = tenSteps().snapshot(t0 + 10 * kSecond);
  // Started at the first step's start (t0); 10 s elapsed; the 5 s window holds steps 6..10.
  EXPECT_DOUBLE_EQ(k.elapsedSeconds, 10.0);
  EXPECT_EQ(k.step, 10u);
  ASSERT_EQ(k.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(*k.ranks[0].samplesPerSecond, 10.0);  // 50 samples / 5 s
  EXPECT_DOUBLE_EQ(*k.samplesPerSecond, 20.0);
  EXPECT_DOUBLE_EQ(*k.ranks[0].commOverhead, 0.3);
  EXPECT_DOUBLE_EQ(*k.ranks[1].commOverhead, 0.1);
  EXPECT_DOUBLE_EQ(*k.commOverhead, 0.2);  // (1.5 + 0.5) / 10
  // Alone, rank 0 would do 50 / 3.5 s and rank 1 50 / 4.5 s: mean 12.698; 20 / (2 x 12.698).
  EXPECT_EQ(k.scalingBasis, ScalingBasis::kEstimatedFromCompute);
  EXPECT_NEAR(*k.scalingEfficiency, 20.0 / (2 * (50 / 3.5 + 50 / 4.5) / 2), 1e-12);
  EXPECT_NEAR(*k.loadImbalance, 0.8 / 0.7, 1e-12);  // max 0.8 s over median 0.7 s
  EXPECT_EQ(k.slowestRank, 1u);
  EXPECT_EQ(k.slowestCause, SlowCause::kCompute);
  EXPECT_NEAR(*k.etaSeconds, 90.0, 1e-9);  // 90 steps left at 1 step/s
  // Slowest first: rank 1 is busy 0.9 s a step, rank 0 0.7 s; the median of two is 0.8 s.
  ASSERT_EQ(k.slowestRanks.size(), 2u);
  EXPECT_EQ(k.slowestRanks[0].rank, 1u);
  EXPECT_EQ(k.slowestRanks[0].node, "n");
  EXPECT_NEAR(k.slowestRanks[0].excess, 0.9 / 0.8 - 1, 1e-12);
  EXPECT_EQ(k.slowestRanks[0].cause, SlowCause::kCompute);
  EXPECT_EQ(k.slowestRanks[1].rank, 0u);
  EXPECT_NEAR(k.slowestRanks[1].excess, 0.7 / 0.8 - 1, 1e-12);
}

// Issue 16: at many ranks, the few slowest by name, each with its cause.
TEST(Kpi, TheSlowestRanksAreNamedWithTheirCause) {
  JobSpec spec = gpuJob();
  spec.worldSize = 12;
  spec.ranks.clear();
  for (std::uint32_t r = 0; r < 12; ++r) spec.ranks.push_back({r, "node-" + std::to_string(r / 4), r % 4, r % 4});
  JobTracker t(spec, Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 5; ++s) {
    for (std::uint32_t r = 0; r < 12; ++r) {
      // Rank 9 waits 0.3 s longer on data; rank 4 computes 0.2 s longer; rank 7 0.1 s.
      StepReport rep = report(r, s, 600'000 + (r == 4 ? 200'000 : r == 7 ? 100'000 : 0), 100'000,
                              t0 + static_cast<std::int64_t>(s) * kSecond);
      rep.worldSize = 12;
      if (r == 9) rep.dataTimeUs = *rep.dataTimeUs + 300'000;
      t.add(rep, "node-" + std::to_string(r / 4));
    }
  }
  const JobKpis k = t.snapshot(t0 + 5 * kSecond);
  ASSERT_EQ(k.slowestRanks.size(), kSlowestRanks);
  EXPECT_EQ(k.slowestRanks[0].rank, 9u);
  EXPECT_EQ(k.slowestRanks[0].node, "node-2");
  EXPECT_EQ(k.slowestRanks[0].cause, SlowCause::kDataWait);
  EXPECT_NEAR(k.slowestRanks[0].excess, 0.3 / 0.7, 1e-9);  // 1.0 s busy against the median 0.7 s
  EXPECT_EQ(k.slowestRanks[1].rank, 4u);
  EXPECT_EQ(k.slowestRanks[1].cause, SlowCause::kCompute);
  EXPECT_EQ(k.slowestRanks[2].rank, 7u);
  EXPECT_EQ(k.slowestRanks[3].rank, 0u);  // then the rest tie, lowest rank first
}

// Issue 19: all-reduce bandwidth, worked by hand. Rank 0 reduces 100 MB in 50 ms a step (2 GB/s),
// rank 1 the same bytes in 80 ms (1.25 GB/s: it waited for rank 0). With 2 ranks the bus
// bandwidth is the algorithm bandwidth (2(n-1)/n = 1); with 4 it is 1.5 times it.
TEST(Kpi, AllReduceBandwidthPerRankAndForTheJob) {
  for (const std::uint32_t world : {2u, 4u}) {
    JobSpec spec = gpuJob();
    spec.worldSize = world;
    JobTracker t(spec);
    for (std::uint64_t step = 1; step <= 10; ++step) {
      for (std::uint32_t rank = 0; rank < 2; ++rank) {
        StepReport r = report(rank, step, 600'000, 100'000, t0 + static_cast<std::int64_t>(step) * kSecond);
        r.worldSize = world;
        r.bytesReduced = 100'000'000;
        r.allreduceTimeUs = rank == 0 ? 50'000 : 80'000;
        t.add(r, "n");
      }
    }
    const JobKpis k = t.snapshot(t0 + 10 * kSecond);
    const double factor = world == 2 ? 1.0 : 1.5;
    ASSERT_EQ(k.ranks.size(), 2u);
    EXPECT_DOUBLE_EQ(*k.ranks[0].algBandwidth, 2e9);
    EXPECT_DOUBLE_EQ(*k.ranks[1].algBandwidth, 1.25e9);
    EXPECT_DOUBLE_EQ(*k.ranks[0].busBandwidth, 2e9 * factor);
    EXPECT_DOUBLE_EQ(*k.algBandwidth, (2e9 + 1.25e9) / 2);
    EXPECT_DOUBLE_EQ(*k.busBandwidth, (2e9 + 1.25e9) / 2 * factor);
  }
  // Reports without timed reductions: unknown, not 0.
  EXPECT_FALSE(tenSteps().snapshot(t0 + 10 * kSecond).busBandwidth.has_value());
}

// Issue 42: every collective, by kind. A sharded (FSDP) step among 4 ranks: rank 0 all-gathers 4
// times (8 MiB in all, 300 ms of which 120 ms exposed) and reduce-scatters twice (8 MiB, 200 ms,
// 50 ms exposed) in a 1 s step; rank 1 only all-gathers, 8 MiB in 400 ms, 200 ms exposed. Per
// rank over the 5 steps of the window; the job's, the mean over the ranks that had each kind.
// Bus bandwidth: all-gather 8 MiB / 0.3 s x (4-1)/4; reduce-scatter 8 MiB / 0.2 s x 3/4.
TEST(Kpi, EveryKindOfCollectiveOverTheWindow) {
  JobSpec spec = gpuJob();
  spec.worldSize = 4;
  JobTracker t(spec, Settings{5.0, 0.1, std::nullopt, 100});
  const double mib8 = 8.0 * 1024 * 1024;
  for (std::uint64_t s = 1; s <= 5; ++s) {
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
      StepReport r = report(rank, s, 600'000, 200'000, t0 + static_cast<std::int64_t>(s) * kSecond);
      r.worldSize = 4;
      if (rank == 0) {
        r.collectives = {{CollectiveKind::kAllGather, 4, 300'000, 120'000, 8u << 20},
                         {CollectiveKind::kReduceScatter, 2, 200'000, 50'000, 8u << 20}};
      } else {
        r.collectives = {{CollectiveKind::kAllGather, 4, 400'000, 200'000, 8u << 20}};
      }
      t.add(r, "n");
    }
  }
  const JobKpis k = t.snapshot(t0 + 5 * kSecond);
  ASSERT_EQ(k.ranks.size(), 2u);
  const auto& r0 = k.ranks[0].collectives;
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[0].kind, CollectiveKind::kReduceScatter) << "kCollectiveKindNames' order";
  EXPECT_EQ(r0[1].kind, CollectiveKind::kAllGather);
  EXPECT_DOUBLE_EQ(r0[1].perStep, 4);
  EXPECT_DOUBLE_EQ(*r0[1].timeShare, 0.3);
  EXPECT_DOUBLE_EQ(*r0[1].exposedShare, 0.12);
  EXPECT_DOUBLE_EQ(*r0[1].bytesPerStep, mib8);
  EXPECT_NEAR(*r0[1].busBandwidth, mib8 / 0.3 * 0.75, 1e-3);
  EXPECT_DOUBLE_EQ(r0[0].perStep, 2);
  EXPECT_DOUBLE_EQ(*r0[0].exposedShare, 0.05);
  EXPECT_NEAR(*r0[0].busBandwidth, mib8 / 0.2 * 0.75, 1e-3);
  ASSERT_EQ(k.ranks[1].collectives.size(), 1u);
  // No all-reduce: the all-reduce bandwidth stays unknown.
  EXPECT_FALSE(k.busBandwidth);
  EXPECT_FALSE(k.ranks[0].algBandwidth);

  ASSERT_EQ(k.collectives.size(), 2u);
  EXPECT_EQ(k.collectives[0].kind, CollectiveKind::kReduceScatter);
  EXPECT_DOUBLE_EQ(*k.collectives[0].exposedShare, 0.05) << "rank 0 alone reduce-scattered";
  EXPECT_DOUBLE_EQ(*k.collectives[1].exposedShare, (0.12 + 0.2) / 2);
  EXPECT_DOUBLE_EQ(*k.collectives[1].timeShare, (0.3 + 0.4) / 2);
  EXPECT_NEAR(*k.collectives[1].busBandwidth, (mib8 / 0.3 + mib8 / 0.4) / 2 * 0.75, 1e-3);
  EXPECT_FALSE(k.exposedEnds.firstShare) << "no spans";

  // Without any collectives (tenSteps times no all-reduce): none listed.
  EXPECT_TRUE(tenSteps().snapshot(t0 + 10 * kSecond).collectives.empty());
}

// The trainer's reports carry no collectives, only their all-reduce: that is the one kind, with
// the same bandwidth as the all-reduce KPIs (one rule: lockstep::busFactor).
TEST(Kpi, TheTrainersAllReduceIsItsOneCollective) {
  JobSpec spec = gpuJob();
  spec.worldSize = 4;
  JobTracker t(spec);
  for (std::uint64_t step = 1; step <= 10; ++step) {
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
      StepReport r = report(rank, step, 600'000, 100'000, t0 + static_cast<std::int64_t>(step) * kSecond);
      r.worldSize = 4;
      r.bytesReduced = 100'000'000;
      r.allreduceTimeUs = 50'000;
      t.add(r, "n");
    }
  }
  const JobKpis k = t.snapshot(t0 + 10 * kSecond);
  ASSERT_EQ(k.collectives.size(), 1u);
  EXPECT_EQ(k.collectives[0].kind, CollectiveKind::kAllReduce);
  EXPECT_DOUBLE_EQ(k.collectives[0].perStep, 1);
  EXPECT_DOUBLE_EQ(*k.collectives[0].exposedShare, 0.1);
  EXPECT_DOUBLE_EQ(*k.collectives[0].timeShare, 0.05);
  EXPECT_DOUBLE_EQ(*k.collectives[0].bytesPerStep, 1e8);
  EXPECT_DOUBLE_EQ(*k.collectives[0].busBandwidth, *k.busBandwidth);
  EXPECT_DOUBLE_EQ(*k.busBandwidth, 2e9 * 1.5);
}

// Where the exposed time sits: rank 0's steps spend 90 of their 120 ms exposed in the first
// collective, an all-gather, and 20 ms in the last, a reduce-scatter. A step whose spans stop
// before its last collective (3 spans of 6 collectives) counts for the first, not the last.
TEST(Kpi, TheExposedTimeAtTheStepsFirstAndLastCollective) {
  JobTracker t(gpuJob(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 4; ++s) {
    const std::int64_t end = t0 + static_cast<std::int64_t>(s) * kSecond;
    StepReport r = report(0, s, 600'000, 200'000, end);
    const std::int64_t begin = end - kSecond;
    r.collectives = {{CollectiveKind::kReduceScatter, 1, 30'000, 20'000, 1u << 20},
                     {CollectiveKind::kAllGather, 2, 150'000, 100'000, 2u << 20}};
    // Listed out of order: the first is the earliest to start.
    r.collectiveSpans = {{CollectiveKind::kAllGather, begin + 400'000, 50'000, 10'000, 1u << 20},
                         {CollectiveKind::kAllGather, begin + 1'000, 100'000, 90'000, 1u << 20},
                         {CollectiveKind::kReduceScatter, begin + 900'000, 30'000, 20'000, 1u << 20}};
    if (s == 4) r.collectives[1].count = 5;  // 6 collectives, 3 spans
    t.add(r, "n");
  }
  const ExposedEnds e = t.snapshot(t0 + 4 * kSecond).exposedEnds;
  ASSERT_TRUE(e.firstShare && e.lastShare);
  EXPECT_DOUBLE_EQ(*e.firstShare, 0.75);
  EXPECT_EQ(e.firstKind, CollectiveKind::kAllGather);
  EXPECT_DOUBLE_EQ(*e.lastShare, 20.0 / 120);
  EXPECT_EQ(e.lastKind, CollectiveKind::kReduceScatter);
}

TEST(Kpi, BytesReducedCountWithoutATimedAllReduce) {
  // A DDP program on CPUs (Gloo) counts its gradient bytes but cannot time its all-reduce: the
  // bytes per step are known (the DDP bucket advice needs them), the bandwidth is not.
  JobSpec spec = gpuJob();
  JobTracker t(spec);
  for (std::uint64_t step = 1; step <= 10; ++step) {
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
      StepReport r = report(rank, step, 600'000, 100'000, t0 + static_cast<std::int64_t>(step) * kSecond);
      r.bytesReduced = 7'454'760;
      r.allreduceTimeUs.reset();
      t.add(r, "n");
    }
  }
  const JobKpis k = t.snapshot(t0 + 10 * kSecond);
  ASSERT_TRUE(k.bytesReducedPerStep);
  EXPECT_DOUBLE_EQ(*k.bytesReducedPerStep, 7'454'760);
  EXPECT_FALSE(k.busBandwidth);
}

// Issue 45: what each rank holds of the model's state (its newest report's; the job's, the most any
// rank holds), and an asynchronous job's staleness over the window, per rank and every rank's.
TEST(Kpi, ModelStatePerRankAndStaleness) {
  JobTracker t(gpuJob(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t step = 1; step <= 20; ++step) {
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
      StepReport r = report(rank, step, 600'000, 100'000, t0 + static_cast<std::int64_t>(step) * kSecond);
      r.paramBytes = 1000 * (rank + 1) + step;  // the newest counts
      r.gradBytes = 500;
      r.optimizerStateBytes = rank == 0 ? 4000 : 0;
      r.staleness = rank == 0 ? 1 : (step == 20 ? 9 : 3);
      t.add(r, "n");
    }
  }
  const JobKpis k = t.snapshot(t0 + 20 * kSecond);
  ASSERT_EQ(k.ranks.size(), 2u);
  EXPECT_EQ(k.ranks[0].paramBytes, 1020.0);
  EXPECT_EQ(k.ranks[1].paramBytes, 2020.0);
  EXPECT_EQ(k.ranks[1].optimizerStateBytes, 0.0);
  EXPECT_EQ(k.paramBytesPerRank, 2020.0);
  EXPECT_EQ(k.gradBytesPerRank, 500.0);
  EXPECT_EQ(k.optimizerStateBytesPerRank, 4000.0);
  // The window (5 s) holds steps 16..20: rank 0's 1s, rank 1's 3, 3, 3, 3, 9.
  EXPECT_DOUBLE_EQ(*k.ranks[0].stalenessMean, 1.0);
  EXPECT_DOUBLE_EQ(*k.ranks[1].stalenessMean, 21.0 / 5);
  EXPECT_EQ(k.ranks[1].stalenessP99, 9.0);
  EXPECT_DOUBLE_EQ(*k.stalenessMean, 26.0 / 10);
  EXPECT_EQ(k.stalenessP99, 9.0);
  EXPECT_EQ(present::modelStateText(k),
            "parameters 2.0 KiB, gradients 500 B, optimizer state 3.9 KiB per rank; staleness 2.6 (p99 9)");

  JobTracker synchronous(gpuJob());
  synchronous.add(report(0, 1, 600'000, 100'000, t0 + kSecond), "n");
  const JobKpis none = synchronous.snapshot(t0 + kSecond);
  EXPECT_FALSE(none.paramBytesPerRank || none.stalenessMean) << "not reported: unknown";
  EXPECT_EQ(present::modelStateText(none), "");
}

// Issue 7: a dynamic split shows as rows per rank, and the imbalance as it was at the start and now.
TEST(Kpi, AnUnevenSplitAndTheImbalanceBeforeAndAfter) {
  JobTracker t(gpuJob(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 30; ++s) {
    const std::int64_t time = t0 + static_cast<std::int64_t>(s) * kSecond;
    // Steps 1-14: even rows, rank 1 computes 3x as long. From step 15: 15 rows against 5, balanced.
    StepReport fast = report(0, s, 300'000, 600'000, time), slow = report(1, s, 900'000, 0, time);
    if (s >= 15) {
      fast.samples = 15;
      slow.samples = 5;
      slow.computeTimeUs = 300'000;
      fast.computeTimeUs = 300'000;
    }
    t.add(fast, "n");
    t.add(slow, "n");
  }
  const JobKpis k = t.snapshot(t0 + 30 * kSecond);
  ASSERT_TRUE(k.initialLoadImbalance && k.loadImbalance);
  EXPECT_NEAR(*k.initialLoadImbalance, 900.0 / 600.0, 1e-12);  // max over median of two: 0.9 / 0.6
  EXPECT_NEAR(*k.loadImbalance, 1.0, 1e-12);
  ASSERT_EQ(k.ranks.size(), 2u);
  EXPECT_DOUBLE_EQ(*k.ranks[0].samplesPerStep, 15.0);
  EXPECT_DOUBLE_EQ(*k.ranks[1].samplesPerStep, 5.0);
}

// Issue 7: a restart with fewer ranks repeats step numbers; the KPIs follow the new attempt.
TEST(Kpi, ARestartWithFewerRanksIsMeasuredOnItsOwn) {
  JobTracker t(gpuJob(), Settings{5.0, 0.1, std::nullopt, 100});
  const auto reportOf = [](std::uint32_t rank, std::uint32_t world, std::uint32_t attempt, std::uint64_t step,
                           std::int64_t computeUs, std::int64_t time) {
    StepReport r = report(rank, step, computeUs, 0, time);
    r.worldSize = world;
    r.attempt = attempt;
    return r;
  };
  std::int64_t time = t0;
  for (std::uint64_t s = 1; s <= 20; ++s) {  // attempt 0: three ranks
    time += kSecond;
    for (std::uint32_t r = 0; r < 3; ++r) t.add(reportOf(r, 3, 0, s, 500'000, time), "n");
  }
  for (std::uint64_t s = 11; s <= 30; ++s) {  // attempt 1: two ranks from step 11, rank 1 slower
    time += kSecond;
    t.add(reportOf(0, 2, 1, s, 400'000, time), "n");
    t.add(reportOf(1, 2, 1, s, 800'000, time), "n");
  }
  const JobKpis k = t.snapshot(time);
  EXPECT_EQ(k.attempts, 2u);
  EXPECT_EQ(k.worldSize, 2u);
  ASSERT_EQ(k.ranks.size(), 2u) << "rank 2 belonged to the attempt before";
  ASSERT_TRUE(k.loadImbalance);
  EXPECT_NEAR(*k.loadImbalance, 800.0 / 600.0, 1e-12);  // max over median of the new attempt's two ranks
  EXPECT_EQ(k.step, 30u);
}

TEST(Kpi, CalibratedScalingEfficiencySaysSo) {
  JobTracker t(gpuJob(), Settings{5.0, 0.1, 12.5, 100});
  for (std::uint64_t s = 1; s <= 10; ++s) t.add(report(0, s, 600'000, 300'000, t0 + static_cast<std::int64_t>(s) * kSecond), "n");
  const JobKpis k = t.snapshot(t0 + 10 * kSecond);
  EXPECT_EQ(k.scalingBasis, ScalingBasis::kCalibrated);
  EXPECT_DOUBLE_EQ(*k.scalingEfficiency, 10.0 / (1 * 12.5));
}

TEST(Kpi, LossConvergenceEnergyAndCost) {
  const JobKpis k = tenSteps().snapshot(t0 + 10 * kSecond);
  // Losses 1.9, 1.8, ... 1.0; EMA(0.1) reaches 1.6126 <= 1.62 at step 9 (t0 + 9 s) and 1.5513 at 10.
  EXPECT_NEAR(*k.lastGlobalLoss, 1.0, 1e-6);
  EXPECT_NEAR(*k.smoothedLoss, 1.5513215599, 1e-5);
  EXPECT_NEAR(*k.timeToConvergenceSeconds, 9.0, 1e-9);
  // GPU 0: 40 and 60 (mean 50); GPU 1: 80 and one sample without utilization: mean 80. Job: 65.
  EXPECT_DOUBLE_EQ(*k.gpuUtilizationPct, 65.0);
  ASSERT_EQ(k.gpus.size(), 2u);
  EXPECT_DOUBLE_EQ(*k.gpus[0].powerWatts, 310.0);
  EXPECT_FALSE(k.gpus[1].powerWatts.has_value()) << "no power readings: unknown, not 0";
  // Energy: 3.6e6 mJ on each GPU = 2 x 0.001 kWh.
  EXPECT_NEAR(*k.energyKwh, 0.002, 1e-12);
  // 2 GPUs x 10 s = 1/180 GPU-hours at 2.0, plus 0.002 kWh at 0.5.
  EXPECT_NEAR(*k.gpuHours, 2 * 10.0 / 3600, 1e-12);
  EXPECT_NEAR(*k.costSoFar, 2 * 10.0 / 3600 * 2.0 + 0.002 * 0.5, 1e-12);
  EXPECT_TRUE(k.costComplete);
  EXPECT_NEAR(*k.costProjected, (2 * 10.0 / 3600 * 2.0 + 0.002 * 0.5) * 10, 1e-12);  // 100 of 10 steps
}

// Issue 19: the wait for the last rank, and what waiting cost. tenSteps(): per step, rank 0 is
// exposed 0.3 s and rank 1 0.1 s, so rank 1 arrived 0.2 s after rank 0, which waited that long:
// 0.2 s of the step's 0.4 s of exposed time (a half), an arrival skew of 0.2 s. Over the job, the
// ranks' 20 s of step time hold 4 s exposed (20%), 2 s of it waiting for rank 1 (10%).
TEST(Kpi, TheWaitForTheLastRankAndWhatWaitingCost) {
  const JobKpis k = tenSteps().snapshot(t0 + 10 * kSecond);
  ASSERT_TRUE(k.stragglerWaitShare && k.arrivalSkewUs);
  EXPECT_NEAR(*k.stragglerWaitShare, 0.2 / 0.4, 1e-12);
  EXPECT_NEAR(*k.arrivalSkewUs, 200'000, 1e-6);
  ASSERT_TRUE(k.waitingShare && k.stragglerShare && k.waitingCost && k.stragglerCost);
  EXPECT_NEAR(*k.waitingShare, 4.0 / 20, 1e-12);
  EXPECT_NEAR(*k.stragglerShare, 2.0 / 20, 1e-12);
  const double cost = 2 * 10.0 / 3600 * 2.0 + 0.002 * 0.5;
  EXPECT_NEAR(*k.waitingCost, cost * 0.2, 1e-12);
  EXPECT_NEAR(*k.stragglerCost, cost * 0.1, 1e-12);
  EXPECT_NEAR(*k.waitingGpuHours, 2 * 10.0 / 3600 * 0.2, 1e-12);
  EXPECT_NEAR(*k.stragglerGpuHours, 2 * 10.0 / 3600 * 0.1, 1e-12);

  // A step only one rank reported says nothing about who arrived last; alone, nobody waits.
  JobTracker half(gpuJob(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 5; ++s) half.add(report(0, s, 600'000, 300'000, t0 + static_cast<std::int64_t>(s) * kSecond), "n");
  const JobKpis h = half.snapshot(t0 + 5 * kSecond);
  EXPECT_FALSE(h.stragglerWaitShare.has_value());
  EXPECT_FALSE(h.arrivalSkewUs.has_value());
  EXPECT_NEAR(*h.stragglerShare, 0.0, 1e-12) << "no complete step: no wait counted";
  EXPECT_NEAR(*h.waitingShare, 0.3, 1e-12);
  // Untimed steps: the cost of waiting is unknown, not 0.
  JobTracker untimed(gpuJob());
  StepReport r = report(0, 1, 0, 0, t0 + kSecond);
  r.dataTimeUs.reset();
  r.computeTimeUs.reset();
  r.exposedCommTimeUs.reset();
  untimed.add(r, "n");
  EXPECT_FALSE(untimed.snapshot(t0 + kSecond).waitingCost.has_value());
}

// Issue 19: what more ranks would buy, worked by hand. Measured at 2 ranks: 64 samples a step,
// data + compute 80 ms, 5 ms more, 15 ms exposed; 100 MB all-reduced at 2 GB/s bus bandwidth, so
// the all-reduce took 1e8 x 1 / 2e9 = 50 ms, 35 ms of it hidden behind compute.
//   1 rank: no all-reduce; step 85 ms: 64 / 0.085 = 752.9 samples/s, efficiency 1.
//   4 ranks: 1e8 x 1.5 / 2e9 = 75 ms, 40 ms exposed; step 125 ms: 256 / 0.125 = 2048 samples/s,
//            efficiency 85 / 125 = 0.68; 1e6 samples take 488.3 s x 4 ranks x 0.001/s = 1.953.
//   8 ranks: 87.5 ms, 52.5 ms exposed; step 137.5 ms: 512 / 0.1375 samples/s, efficiency 0.618.
TEST(Kpi, AProjectionToOtherRankCountsOnAWorkedExample) {
  ScalingInputs in;
  in.ranks = 2;
  in.samplesPerRankStep = 64;
  in.busyUs = 80'000;
  in.otherUs = 5'000;
  in.exposedUs = 15'000;
  in.bytesPerStep = 1e8;
  in.busBandwidth = 2e9;
  in.costPerRankSecond = 0.001;
  in.jobSamples = 1e6;
  EXPECT_EQ(projectionRanks(2), (std::vector<std::uint32_t>{1, 2, 4, 8, 16}));
  const auto p = project(in, {1, 2, 4, 8});
  ASSERT_EQ(p.size(), 4u);
  EXPECT_NEAR(p[0].stepUs, 85'000, 1e-6);
  EXPECT_NEAR(p[0].samplesPerSecond, 64 / 0.085, 1e-6);
  EXPECT_NEAR(p[0].efficiency, 1.0, 1e-12);
  EXPECT_NEAR(p[1].stepUs, 100'000, 1e-6) << "the measured rank count gives back the measured step";
  EXPECT_NEAR(p[2].exposedUs, 40'000, 1e-6);
  EXPECT_NEAR(p[2].samplesPerSecond, 2048, 1e-6);
  EXPECT_NEAR(p[2].efficiency, 0.68, 1e-12);
  EXPECT_NEAR(*p[2].costPerJob, 1e6 / 2048.0 * 4 * 0.001, 1e-9);
  EXPECT_NEAR(p[3].samplesPerSecond, 512 / 0.1375, 1e-6);
  EXPECT_NEAR(p[3].efficiency, 85.0 / 137.5, 1e-12);

  // A 1-rank job's measured step (74 ms) is the 1-rank point and the baseline of efficiency; the
  // 2-rank job's step stays the many-rank one. Without a bandwidth, only 1 rank projects.
  ScalingInputs one = in;
  one.ranks = 1;
  one.busyUs = 70'000;
  one.otherUs = 4'000;
  one.exposedUs = 0;
  one.bytesPerStep.reset();
  one.busBandwidth.reset();
  EXPECT_EQ(project(one, {1, 2, 4}).size(), 1u);
  const auto mixed = project(withStepOf(in, one), {1, 4});
  ASSERT_EQ(mixed.size(), 2u);
  EXPECT_NEAR(mixed[0].stepUs, 74'000, 1e-6);
  EXPECT_NEAR(mixed[1].stepUs, 125'000, 1e-6);
  EXPECT_NEAR(mixed[1].efficiency, 74.0 / 125, 1e-12);

  // Ranks sharing one node's cores share its compute, its all-reduce bandwidth and their overlap:
  // at 4 ranks each has half of what the 2 had: 170 ms of work; the all-reduce 1e8 x 1.5 / 1e9 =
  // 150 ms, of which 2 x 35 hide; a step of 170 + 80 = 250 ms. Alone, a rank has twice: 42.5 ms.
  ScalingInputs shared = in;
  shared.sharedNode = true;
  const auto node = project(shared, {1, 4});
  ASSERT_EQ(node.size(), 2u);
  EXPECT_NEAR(node[0].stepUs, 42'500, 1e-6);
  EXPECT_NEAR(node[1].exposedUs, 80'000, 1e-6);
  EXPECT_NEAR(node[1].stepUs, 250'000, 1e-6);
  EXPECT_NEAR(node[1].samplesPerSecond, 256 / 0.25, 1e-6);
  EXPECT_NEAR(node[1].efficiency, 42.5 / 250, 1e-12);
  // One BLAS thread a rank on 2 cores: a rank alone cannot use the second core, so it is no
  // faster than at 2 ranks (85 ms); at 4, two ranks share each core, as above.
  shared.nodeCores = 2;
  shared.threadsPerRank = 1;
  const auto pinned = project(shared, {1, 4});
  ASSERT_EQ(pinned.size(), 2u);
  EXPECT_NEAR(pinned[0].stepUs, 85'000, 1e-6);
  EXPECT_NEAR(pinned[1].stepUs, 250'000, 1e-6);

  // Exposed time beyond the whole all-reduce (60 ms against 50: a wait for the last rank) stays
  // at any count: the measured step comes back (80 + 5 + 60), and 4 ranks expose 75 + 10 ms.
  ScalingInputs waiting = in;
  waiting.exposedUs = 60'000;
  const auto late = project(waiting, {2, 4});
  ASSERT_EQ(late.size(), 2u);
  EXPECT_NEAR(late[0].stepUs, 145'000, 1e-6);
  EXPECT_NEAR(late[1].exposedUs, 85'000, 1e-6);

  // From a snapshot: tenSteps() has no timed all-reduce, so it projects 1 rank only.
  const JobKpis k = tenSteps().snapshot(t0 + 10 * kSecond);
  const auto from = scalingInputs(k, gpuJob());
  ASSERT_TRUE(from);
  EXPECT_EQ(from->ranks, 2u);
  EXPECT_NEAR(from->busyUs, (700'000 + 900'000) / 2.0, 1e-6);  // data 0.1 s + compute 0.6 or 0.8 s
  EXPECT_NEAR(from->exposedUs, 200'000, 1e-6);
  EXPECT_NEAR(from->otherUs, 1e6 - 800'000 - 200'000, 1e-6);
  EXPECT_NEAR(*from->jobSamples, 100.0 * 20, 1e-9);  // 100 steps x 2 ranks x 10
  EXPECT_FALSE(from->sharedNode) << "a CUDA job's ranks each have a GPU";
  JobSpec cpu = gpuJob();
  cpu.backend = Backend::kCpu;
  EXPECT_TRUE(sharesOneNode(cpu)) << "both ranks on node n";
  cpu.ranks.push_back({2, "m", 0, std::nullopt});
  EXPECT_FALSE(sharesOneNode(cpu)) << "a rank on another node";
}

TEST(Kpi, CostCountsEveryGpuOfTheAllocationUsedOrNot) {
  // A Slurm allocation of 8 GPUs running 2 ranks: the 8 are paid for (issue 17).
  JobSpec spec = gpuJob();
  spec.allocatedGpus = 8;
  JobTracker t(spec, Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 10; ++s) t.add(report(0, s, 600'000, 300'000, t0 + static_cast<std::int64_t>(s) * kSecond), "n");
  const JobKpis k = t.snapshot(t0 + 10 * kSecond);
  EXPECT_NEAR(*k.gpuHours, 8 * 10.0 / 3600, 1e-12);
  EXPECT_NEAR(*k.costSoFar, 8 * 10.0 / 3600 * 2.0, 1e-12);
}

TEST(Kpi, AGapLowersThroughputInsteadOfHidingIt) {
  JobTracker t(gpuJob(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 5; ++s) t.add(report(0, s, 600'000, 300'000, t0 + static_cast<std::int64_t>(s) * kSecond), "n");
  t.add(report(0, 6, 600'000, 300'000, t0 + 12 * kSecond), "n");  // nothing for 7 s
  const JobKpis k = t.snapshot(t0 + 12 * kSecond);
  EXPECT_DOUBLE_EQ(*k.ranks[0].samplesPerSecond, 10.0 / 5.0);  // only step 6 in (7 s, 12 s]
  // The throughput chart (samples per second of job time, a second once the next begins) shows
  // the empty seconds 6..11 as zeros.
  t.add(report(0, 7, 600'000, 300'000, t0 + 13 * kSecond), "n");
  std::map<double, double> series;
  for (const auto& p : t.throughputSeries()) series[p.x] = p.y;
  ASSERT_EQ(series.size(), 12u);  // seconds 1..12
  EXPECT_DOUBLE_EQ(series.at(5.0), 10.0);
  for (double s = 6; s <= 11; ++s) EXPECT_DOUBLE_EQ(series.at(s), 0.0) << "second " << s;
  EXPECT_DOUBLE_EQ(series.at(12.0), 10.0);
}

TEST(Kpi, ARestartedStepCounterIsANewAttemptNotBadArithmetic) {
  JobTracker t(gpuJob(), Settings{5.0, 0.1, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 10; ++s) t.add(report(0, s, 600'000, 300'000, t0 + static_cast<std::int64_t>(s) * kSecond), "n");
  // The job resumes from a checkpoint at step 6: the counter goes back.
  for (std::uint64_t s = 6; s <= 8; ++s) {
    t.add(report(0, s, 600'000, 300'000, t0 + (static_cast<std::int64_t>(s) + 10) * kSecond), "n");
  }
  const JobKpis k = t.snapshot(t0 + 18 * kSecond);
  EXPECT_EQ(k.attempts, 2u);
  EXPECT_EQ(k.ranks[0].step, 8u);
  // The window holds only the new attempt's three reports (steps 6..8 at 16..18 s).
  EXPECT_DOUBLE_EQ(*k.ranks[0].samplesPerSecond, 30.0 / 5.0);
  // The loss chart continues with the repeated steps.
  EXPECT_DOUBLE_EQ(t.lossSeries().back().x, 8.0);

  // An attempt number from the trainer says the same.
  StepReport r = report(0, 1, 600'000, 300'000, t0 + 30 * kSecond);
  r.attempt = 3;
  t.add(r, "n");
  EXPECT_EQ(t.snapshot(t0 + 30 * kSecond).attempts, 4u);
}

TEST(Kpi, ACpuJobWithoutNvmlSaysWhatIsUnknown) {
  JobSpec spec = gpuJob();
  spec.backend = Backend::kCpu;
  spec.ranks.clear();
  spec.prices = {0.0, 0.05, 0.3, "USD"};
  JobTracker t(spec, Settings{5.0, 0.1, std::nullopt, 100});
  t.add(report(0, 1, 600'000, 300'000, t0 + kSecond), "n");
  ProcessSample p;
  p.jobId = "k";
  p.rank = 0;
  p.cpuPct = 100.0f;
  p.timeUnixUs = t0 + kSecond;
  t.add(p);
  p.cpuPct = 50.0f;
  p.timeUnixUs = t0 + 3 * kSecond;
  t.add(p);
  const JobKpis k = t.snapshot(t0 + 3 * kSecond);
  EXPECT_FALSE(k.gpuUtilizationPct.has_value());
  EXPECT_FALSE(k.energyKwh.has_value());
  EXPECT_DOUBLE_EQ(*k.gpuHours, 0.0);  // no GPUs: zero, and known
  EXPECT_NEAR(*k.coreHours, 0.5 * 2.0 / 3600, 1e-12);  // 50% of a core for 2 s
  // The energy is priced but unmeasured: the cost counts the CPU time and says it is incomplete.
  EXPECT_FALSE(k.costComplete);
  EXPECT_NEAR(*k.costSoFar, 0.5 * 2.0 / 3600 * 0.05, 1e-15);
  EXPECT_NE(std::find_if(k.missing.begin(), k.missing.end(),
                         [](const std::string& m) { return m.rfind("energy", 0) == 0; }),
            k.missing.end());
}

TEST(Kpi, EnergyCounterResetsStartANewSegment) {
  JobTracker t(gpuJob(), Settings{});
  t.add(gpu(0, t0, 50.0f, 10'000'000));
  t.add(gpu(0, t0 + kSecond, 50.0f, 13'600'000));  // +3.6e6
  t.add(gpu(0, t0 + 2 * kSecond, 50.0f, 1'000));   // the driver was reloaded
  t.add(gpu(0, t0 + 3 * kSecond, 50.0f, 3'601'000));  // +3.6e6
  EXPECT_NEAR(*t.snapshot(t0 + 3 * kSecond).energyKwh, 0.002, 1e-12);
}

TEST(Kpi, OtherJobsAndEndedJobs) {
  JobTracker t = tenSteps();
  StepReport other = report(0, 11, 1, 1, t0 + 11 * kSecond);
  other.jobId = "someone-else";
  t.add(other, "n");
  JobEvent end{"k", JobEventKind::kFinished, t0 + 10 * kSecond, {}, {}, {}, "finished", "", {}};
  t.add(end);
  EXPECT_TRUE(t.ended());
  // A finished job's KPIs stay as they were at its end, whatever the clock says now.
  const JobKpis later = t.snapshot(t0 + 100 * kSecond);
  EXPECT_EQ(later.step, 10u);
  EXPECT_DOUBLE_EQ(later.elapsedSeconds, 10.0);
  EXPECT_DOUBLE_EQ(*later.samplesPerSecond, 20.0);
}


// Issue 13: a job that runs the user's own program. Its reports may carry no timings (the
// program calls lockstep.step() without lockstep.watch()) and no global loss (it does not
// all-reduce its loss); or it sends none at all.
JobSpec commandJob() {
  JobSpec s;
  s.jobId = "k";
  s.worldSize = 2;
  s.command = CommandSpec{{"python3", "train.py"}, "/tmp", {}};
  s.targetLoss = 1.0;
  return s;
}

StepReport untimed(std::uint32_t rank, std::uint64_t step, std::uint32_t samples, float loss, std::int64_t timeUs) {
  StepReport r;
  r.jobId = "k";
  r.rank = rank;
  r.worldSize = 2;
  r.step = step;
  r.samples = samples;
  r.loss = loss;
  r.tokens = std::uint64_t{samples} * 128;
  r.stepTimeUs = kSecond;
  r.timeUnixUs = timeUs;
  return r;
}

TEST(Kpi, ACommandJobWithoutReportsSaysHowToGetThem) {
  JobTracker t(commandJob(), Settings{});
  t.add(JobEvent{"k", JobEventKind::kStarted, t0, {}, {}, {}, "started", "", {}});
  const JobKpis k = t.snapshot(t0 + 5 * kSecond);
  EXPECT_FALSE(k.samplesPerSecond);
  EXPECT_FALSE(k.commOverhead);
  EXPECT_FALSE(k.scalingEfficiency);
  EXPECT_EQ(k.totalSteps, 0u);  // only the program knows its length
  EXPECT_NE(k.noStepsReason.find("add lockstep.step(...)"), std::string::npos) << k.noStepsReason;
  EXPECT_NE(std::find_if(k.missing.begin(), k.missing.end(),
                         [](const std::string& m) { return m.find("lockstep.step") != std::string::npos; }),
            k.missing.end());
}

TEST(Kpi, UntimedStepsGiveThroughputAndLossButNoSplit) {
  JobTracker t(commandJob(), Settings{5.0, 0.5, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 10; ++s) {
    const std::int64_t time = t0 + static_cast<std::int64_t>(s) * kSecond;
    // Rank 0: 30 samples at loss 2; rank 1: 10 samples at loss 1. The samples' mean: 1.75.
    t.add(untimed(0, s, 30, 2.0f, time), "n");
    t.add(untimed(1, s, 10, 1.0f, time), "n");
  }
  const JobKpis k = t.snapshot(t0 + 10 * kSecond);
  EXPECT_DOUBLE_EQ(*k.samplesPerSecond, 40.0);  // 200 samples in the 5 s window
  EXPECT_DOUBLE_EQ(*k.tokensPerSecond, 40.0 * 128);
  EXPECT_EQ(k.totalSamples, 400u);
  EXPECT_EQ(*k.totalTokens, 400u * 128);
  EXPECT_DOUBLE_EQ(*k.meanSamplesPerSecond, 40.0);  // 400 samples over 10 s
  EXPECT_NEAR(*k.lastGlobalLoss, 1.75, 1e-12);
  ASSERT_EQ(t.lossSeries().size(), 10u);
  EXPECT_NEAR(t.lossSeries().back().y, 1.75, 1e-12);
  // Unknown, not 0: nothing measured the split.
  EXPECT_FALSE(k.commOverhead);
  EXPECT_FALSE(k.loadImbalance);
  EXPECT_FALSE(k.scalingEfficiency);
  EXPECT_FALSE(k.ranks[0].meanComputeUs);
  EXPECT_TRUE(t.stepSplits().empty());
  EXPECT_TRUE(k.noStepsReason.empty());
  EXPECT_NE(k.noTimingsReason.find("lockstep.watch"), std::string::npos) << k.noTimingsReason;
}

// A rank's start-up (a Python program importing torch, say) is not in its training rate.
TEST(Kpi, StartUpIsNotPartOfTheRate) {
  JobTracker t(commandJob(), Settings{10.0, 0.5, std::nullopt, 100});
  t.add(JobEvent{"k", JobEventKind::kStarted, t0, {}, {}, {}, "started", "", {}});
  for (std::uint64_t s = 1; s <= 3; ++s) {
    // Steps of 1 s from t0 + 4 s on: the ranks took 4 s to start.
    t.add(untimed(0, s, 10, 1.0f, t0 + static_cast<std::int64_t>(4 + s) * kSecond), "n");
  }
  const JobKpis k = t.snapshot(t0 + 7 * kSecond);
  EXPECT_DOUBLE_EQ(k.elapsedSeconds, 7.0);           // the job's time includes it
  EXPECT_DOUBLE_EQ(*k.ranks[0].samplesPerSecond, 10.0);  // 30 samples in the 3 s of steps, not in 7 s
  EXPECT_NEAR(*k.meanSamplesPerSecond, 30.0 / 7.0, 1e-12);  // the whole job's mean keeps it in
}

// An ended job's pace is that of its last steps: the ranks' tear-down after their last report (an
// evaluation, destroy_process_group) counts in its elapsed time, not in its throughput.
TEST(Kpi, AnEndedJobsRateLeavesOutItsTearDown) {
  JobTracker t(commandJob(), Settings{10.0, 0.5, std::nullopt, 100});
  for (std::uint64_t s = 1; s <= 4; ++s) t.add(untimed(0, s, 10, 1.0f, t0 + static_cast<std::int64_t>(s) * kSecond), "n");
  t.add(JobEvent{"k", JobEventKind::kFinished, t0 + 9 * kSecond, {}, {}, {}, "finished", "", {}});
  const JobKpis k = t.snapshot(t0 + 100 * kSecond);
  EXPECT_DOUBLE_EQ(k.elapsedSeconds, 9.0);
  EXPECT_DOUBLE_EQ(*k.ranks[0].samplesPerSecond, 10.0);  // 40 samples in its 4 s of steps
  EXPECT_NEAR(*k.meanSamplesPerSecond, 40.0 / 9.0, 1e-12);
}

TEST(Kpi, ACalibrationRunGivesACommandJobItsScalingEfficiency) {
  JobTracker t(commandJob(), Settings{5.0, 0.1, 25.0, 100});
  for (std::uint64_t s = 1; s <= 10; ++s) {
    const std::int64_t time = t0 + static_cast<std::int64_t>(s) * kSecond;
    t.add(untimed(0, s, 20, 2.0f, time), "n");
    t.add(untimed(1, s, 20, 2.0f, time), "n");
  }
  const JobKpis k = t.snapshot(t0 + 10 * kSecond);
  EXPECT_EQ(k.scalingBasis, ScalingBasis::kCalibrated);
  EXPECT_DOUBLE_EQ(*k.scalingEfficiency, 40.0 / (2 * 25.0));
}

}  // namespace
}  // namespace lockstep::kpi
