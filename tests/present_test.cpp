// Issue 15: one presentation module for every face of Lockstep. The dashboard, the History window,
// lockstepctl and the reports each had their own "–", durations, percentages and money, and an
// ended job's samples/s meant the whole job in one place and the last 10 s in another.

#include <gtest/gtest.h>

#include <cmath>

#include "lockstep/present/present.h"
#include "lockstep/protocol/names.h"

namespace lockstep::present {
namespace {

TEST(Present, NumbersUnitsAndTheUnknownValue) {
  EXPECT_EQ(number(12400.26, 1), "12,400.3");
  EXPECT_EQ(number(-1234567, 0), "-1,234,567");
  EXPECT_EQ(number(-0.001, 1), "0.0");
  EXPECT_EQ(number(NAN, 1), kUnknown);
  EXPECT_EQ(figure(std::nullopt, 0, " W"), kUnknown) << "unknown is never 0";
  EXPECT_EQ(figure(250.4, 0, " W"), "250 W");
  EXPECT_EQ(percent(0.412), "41.2%");
  EXPECT_EQ(percent(std::nullopt), kUnknown);
  EXPECT_EQ(bytes(1.5 * (1u << 30)), "1.5 GiB");
  EXPECT_EQ(bytes(512), "512 B");
  EXPECT_EQ(bandwidth(12.34e9), "12.3 GB/s");
  EXPECT_EQ(bandwidth(5e7), "0.050 GB/s");
  EXPECT_EQ(bandwidth(std::nullopt), kUnknown);
}

TEST(Present, DurationsChangeUnitWhereTheyReadBest) {
  EXPECT_EQ(duration(4.25), "4.2 s");
  EXPECT_EQ(duration(42), "42 s");
  EXPECT_EQ(duration(89), "89 s");
  EXPECT_EQ(duration(90), "1.5 min");
  EXPECT_EQ(duration(5399), "90.0 min");
  EXPECT_EQ(duration(7560), "2.1 h");
  EXPECT_EQ(duration(INFINITY), kUnknown);
}

TEST(Present, AJobsNodesAreNamedWhenFewAndCountedWhenMany) {
  EXPECT_EQ(nodesText({"a", "b"}), "a, b");
  EXPECT_EQ(nodesText({"a", "b", "c", "d"}), "a, b, c, d");
  EXPECT_EQ(nodesText({"a", "b", "c", "d", "e"}), "5 nodes (a, b, c, …)");
  EXPECT_EQ(nodesText({}), "");
}

TEST(Present, MoneyKeepsAShortJobsFractionOfACent) {
  EXPECT_EQ(money(2.5, "USD"), "2.50 USD");
  EXPECT_EQ(money(0.0031, "EUR"), "0.0031 EUR");
  EXPECT_EQ(money(0, "USD"), "0.00 USD");
}

TEST(Present, AJobsSamplesPerSecondIsTheWindowWhileItRunsAndTheMeanOnceItEnded) {
  kpi::JobKpis k;
  k.samplesPerSecond = 900;       // the last 10 s
  k.meanSamplesPerSecond = 600;   // start to end, start-up included
  EXPECT_EQ(jobThroughput(k, false), 900);
  EXPECT_EQ(jobThroughput(k, true), 600);
  k.meanSamplesPerSecond.reset();  // a file from before the mean was kept
  EXPECT_EQ(jobThroughput(k, true), 900);
  EXPECT_NE(jobThroughputMeaning(true), jobThroughputMeaning(false));
}

// Issue 42: a collective as the timeline labels it, and the Communication tile's split by kind.
TEST(Present, TheKindOfDataParallelismSaysWhatIsSharedAndHow) {
  JobSpec spec;
  EXPECT_EQ(parallelismText(spec), "all-reduce");
  spec.shard = Shard::kParameters;
  EXPECT_EQ(parallelismText(spec), "all-reduce, sharded: " + std::string(titleOf(Shard::kParameters)));
  spec.shard = Shard::kNone;
  spec.sync = Sync::kParameterServer;
  EXPECT_EQ(parallelismText(spec), "parameter server, synchronous");
  spec.staleness = 3;
  EXPECT_EQ(parallelismText(spec), "parameter server, asynchronous (staleness ≤ 3)");
  spec.staleness = 0;
  spec.psRanks = 4;
  EXPECT_EQ(parallelismText(spec), "parameter server split over 4 ranks, synchronous");
  spec.psRanks = 1;
  EXPECT_EQ(parallelismText(spec), "parameter server, synchronous");
}

TEST(Present, ACollectiveIsItsKindAndItsBytesAndTheSplitGoesLargestFirst) {
  EXPECT_EQ(collectiveLabel(CollectiveKind::kAllGather, 8u << 20), "all-gather 8.0 MiB");
  EXPECT_EQ(collectiveLabel(CollectiveKind::kBarrier, 0), "barrier");
  const auto kind = [](CollectiveKind k, std::optional<double> exposed) {
    kpi::CollectiveKpis c;
    c.kind = k;
    c.exposedShare = exposed;
    return c;
  };
  const std::vector<kpi::CollectiveKpis> kinds = {kind(CollectiveKind::kAllReduce, 0.12), kind(CollectiveKind::kReduceScatter, std::nullopt),
                                                  kind(CollectiveKind::kAllGather, 0.31), kind(CollectiveKind::kBroadcast, 0.001)};
  EXPECT_EQ(collectiveSplit(kinds), "all-gather 31.0% \u00b7 all-reduce 12.0% \u00b7 broadcast 0.1%");
  EXPECT_EQ(collectiveSplit(kinds, 1), "all-gather 31.0%");
  EXPECT_EQ(collectiveSplit({}), "");
  EXPECT_EQ(phaseLegend(kpi::Phase::kCollective), "collective (filled: exposed)");
}

// Issue 46: FLOP/s with the prefix that reads best, also where rounding carries into the next one.
TEST(Present, FlopsRatesTakeThePrefixThatReadsBest) {
  EXPECT_EQ(flopsRate(2.5e9), "2.5 GFLOP/s");  // the everyday ones are in mfu_test.cpp
  EXPECT_EQ(flopsRate(1.2e18), "1.2 EFLOP/s");
  EXPECT_EQ(flopsRate(640), "640 FLOP/s");
  EXPECT_EQ(flopsRate(999.96e12), "1.0 PFLOP/s") << "not 1,000.0 TFLOP/s";
  EXPECT_EQ(flopsRate(999'999.6), "1.0 MFLOP/s");
  EXPECT_EQ(flopsRate(std::nullopt), kUnknown);
  EXPECT_EQ(flopsRate(-1), kUnknown);
  EXPECT_EQ(flopsRate(INFINITY), kUnknown);
}

// Issue 46: MFU with the figures it is the ratio of, what they came from, and "–" without a peak.
TEST(Present, MfuSaysItsFiguresAndWhatTheyCameFrom) {
  kpi::JobKpis k;
  EXPECT_EQ(mfuText(k), "") << "no rank counted FLOPs: nothing to say";
  EXPECT_EQ(mfuBasisText(k), "");
  k.modelFlopsPerSecond = 3.3e15;
  k.flopsBasis = "declared by the program";
  EXPECT_EQ(mfuText(k), "– (3.3 PFLOP/s; no peak known)");
  EXPECT_EQ(mfuBasisText(k), "FLOPs: declared by the program");
  k.peakFlops = 7.9e15;
  k.mfu = 3.3e15 / 7.9e15;
  k.peakBasis = "node-a: NVIDIA H100 datasheet, BF16 dense";
  EXPECT_EQ(mfuText(k), "41.8% of peak (3.3 PFLOP/s of 7.9 PFLOP/s)");
  EXPECT_EQ(mfuBasisText(k), "FLOPs: declared by the program; peak: node-a: NVIDIA H100 datasheet, BF16 dense");
  k.flopsBasis.clear();
  EXPECT_EQ(mfuBasisText(k), "peak: node-a: NVIDIA H100 datasheet, BF16 dense");
  // Two ranks of 40 TFLOP/s, one with a 100 TFLOP/s peak: the MFU is that rank's, and so are the
  // figures it is shown as the ratio of.
  k.modelFlopsPerSecond = 8e13;
  k.peakFlops = 1e14;
  k.mfu = 0.4;
  EXPECT_EQ(mfuText(k), "40.0% of peak (40.0 TFLOP/s of 100.0 TFLOP/s)");
}

}  // namespace
}  // namespace lockstep::present
