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

}  // namespace
}  // namespace lockstep::present
