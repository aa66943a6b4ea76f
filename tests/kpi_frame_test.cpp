// Issue 46 §1: a job's KPIs as its supervising agent sends them (kpi/frame.h): every figure comes
// back as it went, the rows asked for and no others, and a frame an agent did not write is refused
// with what was wrong.

#include <gtest/gtest.h>

#include "lockstep/kpi/frame.h"
#include "lockstep/v1/lockstep.pb.h"

namespace lockstep::kpi {
namespace {

// Every field of JobKpis set, each figure to a value of its own (a field the codec forgot comes
// back unknown or 0, and the comparison fails).
JobKpis everyField() {
  double next = 1.25;
  auto v = [&next] { return next += 1.0; };
  JobKpis k;
  k.jobId = "frame-job";
  k.worldSize = 16384;
  k.attempts = 2;
  k.step = 1234;
  k.totalSteps = 5000;
  k.elapsedSeconds = v();
  for (Maybe* m : {&k.samplesPerSecond, &k.tokensPerSecond, &k.meanSamplesPerSecond, &k.commOverhead, &k.algBandwidth,
                   &k.busBandwidth, &k.bytesReducedPerStep, &k.paramBytesPerRank, &k.gradBytesPerRank,
                   &k.optimizerStateBytesPerRank, &k.stalenessMean, &k.stalenessP99, &k.modelFlopsPerSecond,
                   &k.peakFlops, &k.mfu, &k.samplesPerRankStep, &k.meanBusyUs, &k.meanExposedUs, &k.meanStepUs,
                   &k.stragglerWaitShare, &k.arrivalSkewUs, &k.scalingEfficiency, &k.gpuUtilizationPct,
                   &k.loadImbalance, &k.initialLoadImbalance, &k.lastGlobalLoss, &k.smoothedLoss,
                   &k.timeToConvergenceSeconds, &k.etaSeconds, &k.energyKwh, &k.gpuHours, &k.coreHours,
                   &k.costSoFar, &k.costProjected, &k.waitingShare, &k.stragglerShare, &k.waitingCost,
                   &k.stragglerCost, &k.waitingGpuHours, &k.stragglerGpuHours}) {
    *m = v();
  }
  k.totalSamples = 1ull << 60;
  k.totalTokens = (1ull << 62) + 3;
  k.flopsBasis = "declared by the program";
  k.peakBasis = "H100 SXM bf16 dense";
  k.scalingBasis = ScalingBasis::kEstimatedFromCompute;
  k.slowestRank = 7;
  k.slowestCause = SlowCause::kDataWait;
  k.slowestRanks = {{3, "node-1", 0.25, SlowCause::kDataWait}, {9, "node-4", 0.125, SlowCause::kCompute}};
  k.costComplete = false;
  k.missing = {"energy (no energy counter)", "prices"};
  k.noStepsReason = "no steps yet";
  k.noTimingsReason = "untimed";
  k.collectives = {{CollectiveKind::kAllReduce, 2.0, v(), v(), v(), v()},
                   {CollectiveKind::kPull, 1.0, v(), std::nullopt, v(), std::nullopt}};
  k.exposedEnds = {v(), v(), CollectiveKind::kReduceScatter, CollectiveKind::kAllGather};
  for (std::uint32_t rank = 0; rank < 4; ++rank) {
    RankKpis r;
    r.rank = rank;
    r.node = "node-" + std::to_string(rank / 2);
    r.attempt = 2;
    r.step = 1234 - rank;
    r.epoch = 3;
    r.lossIsNan = rank == 3;
    for (Maybe* m : {&r.samplesPerSecond, &r.tokensPerSecond, &r.commOverhead, &r.meanDataUs, &r.meanComputeUs,
                     &r.meanExposedUs, &r.meanStepUs, &r.samplesPerStep, &r.algBandwidth, &r.busBandwidth, &r.loss,
                     &r.cpuPct, &r.rssBytes, &r.paramBytes, &r.gradBytes, &r.optimizerStateBytes, &r.stalenessMean,
                     &r.stalenessP99, &r.modelFlopsPerSecond, &r.peakFlops, &r.mfu}) {
      *m = v();
    }
    r.collectives = {{CollectiveKind::kReduceScatter, 1.0, v(), v(), v(), v()}};
    k.ranks.push_back(r);
  }
  for (std::uint32_t gpu = 0; gpu < 4; ++gpu) {
    k.gpus.push_back({"node-" + std::to_string(gpu / 2), gpu % 2, v(), v(), v(), v(), v(), v()});
  }
  k.nodeBlocks = {{"node-0", 1, 2, v(), v()}, {"node-1", 3, 0, std::nullopt, std::nullopt}};  // exact in float
  return k;
}

TEST(KpiFrame, EveryFigureComesBackAsItWent) {
  const JobKpis k = everyField();
  const auto back = decodeFrame(encodeFrame(k));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, k);

  JobKpis unknown;  // nothing known: unknown stays unknown, not 0
  unknown.jobId = "empty";
  const auto empty = decodeFrame(encodeFrame(unknown));
  ASSERT_TRUE(empty.ok()) << empty.error().message;
  EXPECT_EQ(*empty, unknown);
}

// withRanks as the agent calls it: the job's figures apart from its rows.
JobKpis withRanks(const JobKpis& k, std::uint32_t from, std::uint32_t count) {
  JobKpis head = k;
  head.ranks.clear();
  head.gpus.clear();
  return kpi::withRanks(head, k.ranks, k.gpus, from, count);
}

TEST(KpiFrame, OnlyTheRowsAskedForAndTheirNodesGpus) {
  const JobKpis k = everyField();
  const JobKpis rows = withRanks(k, 0, 1);
  ASSERT_EQ(rows.ranks.size(), 2u) << "rank 0 asked for, and rank 3, the slowest (9 has no row)";
  EXPECT_EQ(rows.ranks[0], k.ranks[0]);
  EXPECT_EQ(rows.ranks[1], k.ranks[3]);
  ASSERT_EQ(rows.gpus.size(), 4u) << "node-0's and node-1's two GPUs each";
  const JobKpis one = withRanks(k, 2, 2);
  ASSERT_EQ(one.ranks.size(), 2u) << "the slowest is among those asked for: once";
  EXPECT_EQ(one.gpus.size(), 2u);
  EXPECT_EQ(one.gpus[0].node, "node-1");
  EXPECT_EQ(rows.slowestRanks, k.slowestRanks) << "the job's figures stay whole";
  EXPECT_EQ(rows.samplesPerSecond, k.samplesPerSecond);
  EXPECT_EQ(withRanks(k, 4, 1024).ranks.size(), 1u) << "the slowest alone";
  const JobKpis toTheEnd = withRanks(k, 1, 0xFFFFFFFFu);
  ASSERT_EQ(toTheEnd.ranks.size(), 3u) << "from + count past 2^32 does not wrap";
  EXPECT_EQ(toTheEnd.ranks[2], k.ranks[3]);
  EXPECT_EQ(withRanks(k, 0, 4), k) << "every row: the job as it was";
}

// The most rows an agent sends: a full window, and the slowest ranks from outside it.
TEST(KpiFrame, AFullWindowAndTheSlowestRanksReadBack) {
  JobKpis k;
  k.jobId = "wide";
  for (std::uint32_t rank = 0; rank < 2048; ++rank) k.ranks.push_back({.rank = rank, .node = "n" + std::to_string(rank / 8)});
  for (std::uint32_t rank = 2043; rank < 2048; ++rank) k.slowestRanks.push_back({rank, "n255", 0.5, SlowCause::kCompute});
  for (std::uint32_t node = 0; node < 256; ++node) {
    for (std::uint32_t gpu = 0; gpu < 8; ++gpu) k.gpus.push_back({.node = "n" + std::to_string(node), .index = gpu});
  }
  const JobKpis rows = withRanks(k, 0, kMaxFrameRanks);
  ASSERT_EQ(rows.ranks.size(), kMaxFrameRanks + kSlowestRanks);
  const auto back = decodeFrame(encodeFrame(rows));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, rows);
}

// A fanned-in job's heatmap: its nodes in natural order, in at most kMaxNodeBlocks blocks, each with
// its devices' mean and least busy; the ranks' CPU % where no GPU has a reading. Its nodes are its
// current placement's, stepped or not (a node a restart left is not); without one, its rows'.
TEST(KpiFrame, TheJobsNodesComeInBlocksWithTheirLeastBusyDevice) {
  std::vector<RankKpis> ranks;
  for (const char* node : {"n10", "n2", "n1"}) {
    for (int i = 0; i < 2; ++i) {
      RankKpis r{.rank = static_cast<std::uint32_t>(ranks.size()), .node = node};
      r.cpuPct = 100.0 * static_cast<double>(ranks.size() + 1);
      ranks.push_back(r);
    }
  }
  const std::vector<GpuKpis> gpus = {{.node = "n10", .index = 0, .utilizationPct = 90.0},
                                     {.node = "n10", .index = 1, .utilizationPct = 30.0},
                                     {.node = "n2", .index = 0, .utilizationPct = 80.0},
                                     {.node = "n2", .index = 1},  // no reading yet
                                     {.node = "n1", .index = 0, .utilizationPct = 70.0},
                                     {.node = "n1", .index = 1, .utilizationPct = 70.0},
                                     {.node = "n20", .index = 0, .utilizationPct = 0.0},  // no step of its rank yet
                                     {.node = "n99", .index = 0, .utilizationPct = 5.0}};  // a restart left it
  std::vector<RankPlacement> placement;
  for (const char* node : {"n10", "n2", "n1", "n20", "n30"}) {  // n30: placed, nothing of it read
    placement.push_back({static_cast<std::uint32_t>(placement.size()), node, 0, 0});
  }
  const auto blocks = nodeBlocks(placement, ranks, gpus);
  ASSERT_EQ(blocks.size(), 5u);
  EXPECT_EQ(blocks[0], (NodeBlock{"n1", 1, 2, 70.0, 70.0}));
  EXPECT_EQ(blocks[1], (NodeBlock{"n2", 1, 1, 80.0, 80.0}));
  EXPECT_EQ(blocks[2], (NodeBlock{"n10", 1, 2, 60.0, 30.0})) << "the idle GPU shows, where the mean hides it";
  EXPECT_EQ(blocks[3], (NodeBlock{"n20", 1, 1, 0.0, 0.0}));
  EXPECT_EQ(blocks[4], (NodeBlock{"n30", 1, 0, std::nullopt, std::nullopt}));
  // A node whose agent did not answer the last read: a row still, without its stale readings.
  auto silentRanks = ranks;
  auto silentGpus = gpus;
  withoutReadings({"n10"}, silentRanks, silentGpus);
  const auto silent = nodeBlocks(placement, silentRanks, silentGpus);
  ASSERT_EQ(silent.size(), 5u);
  EXPECT_EQ(silent[2], (NodeBlock{"n10", 1, 0, std::nullopt, std::nullopt}));
  EXPECT_EQ(silent[1], blocks[1]);
  withoutReadings({"n2"}, silentRanks, silentGpus);
  EXPECT_EQ(nodeBlocks({}, silentRanks, {})[1], (NodeBlock{"n2", 1, 0, std::nullopt, std::nullopt}));
  const auto cpus = nodeBlocks({}, ranks, {});
  ASSERT_EQ(cpus.size(), 3u);
  EXPECT_EQ(cpus[2], (NodeBlock{"n10", 1, 2, 150.0, 100.0})) << "ranks 0 and 1: 100 and 200 % of a core";
  RankKpis unread{.rank = 7};  // no step read: no node of its own
  EXPECT_EQ(nodeBlocks({}, std::vector<RankKpis>{unread}, {}).size(), 0u);

  std::vector<RankKpis> wide;
  for (std::uint32_t n = 0; n < 4097; ++n) wide.push_back({.rank = n, .node = "n" + std::to_string(n)});
  const auto many = nodeBlocks({}, wide, {});
  ASSERT_EQ(many.size(), 1366u) << "4,097 nodes, 3 a block";
  EXPECT_EQ(many[1], (NodeBlock{"n3", 3, 0, std::nullopt, std::nullopt}));
  EXPECT_EQ(many.back(), (NodeBlock{"n4095", 2, 0, std::nullopt, std::nullopt}));
  EXPECT_EQ(nodeBlocks({}, std::vector<RankKpis>(wide.begin(), wide.begin() + 2048), {}).size(), 2048u) << "a node a block";
}

// A silent node's latest readings are not current: blank. What covers the job so far stays.
TEST(KpiFrame, ASilentNodesRowsLoseTheirLatestReadingsAndKeepTheJobsFigures) {
  std::vector<RankKpis> ranks = {{.rank = 0, .node = "n1", .step = 9, .samplesPerSecond = 50.0, .cpuPct = 99.0, .rssBytes = 1e9},
                                 {.rank = 1, .node = "n2", .step = 9, .samplesPerSecond = 50.0, .cpuPct = 98.0, .rssBytes = 2e9}};
  std::vector<GpuKpis> gpus = {{.node = "n1", .index = 0, .utilizationPct = 90.0, .meanUtilizationPct = 85.0,
                                .memoryUsedBytes = 8e9, .powerWatts = 600.0, .temperatureC = 70.0, .energyKwh = 1.5},
                               {.node = "n2", .index = 0, .utilizationPct = 80.0, .meanUtilizationPct = 75.0,
                                .memoryUsedBytes = 7e9, .powerWatts = 500.0, .temperatureC = 60.0, .energyKwh = 1.0}};
  const auto before = std::pair{ranks, gpus};
  withoutReadings({}, ranks, gpus);
  EXPECT_EQ(std::pair(ranks, gpus), before) << "every node answered";
  withoutReadings({"n2"}, ranks, gpus);
  EXPECT_EQ(ranks[0], before.first[0]);
  EXPECT_EQ(gpus[0], before.second[0]);
  EXPECT_EQ(gpus[1], (GpuKpis{.node = "n2", .index = 0, .meanUtilizationPct = 75.0, .energyKwh = 1.0}));
  RankKpis kept = before.first[1];
  kept.cpuPct.reset();
  kept.rssBytes.reset();
  EXPECT_EQ(ranks[1], kept);
  // Every GPU with a reading silent: the heatmap stays one of GPUs, never n1's ranks' CPU % instead.
  std::vector<RankKpis> cpuOnN3 = {{.rank = 0, .node = "n2", .cpuPct = 99.0}, {.rank = 1, .node = "n3", .cpuPct = 98.0}};
  withoutReadings({"n1", "n2"}, cpuOnN3, gpus);
  const auto blocks = nodeBlocks({}, cpuOnN3, gpus);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(blocks[1], (NodeBlock{"n2", 1, 0, std::nullopt, std::nullopt}));
  EXPECT_EQ(blocks[2], (NodeBlock{"n3", 1, 0, std::nullopt, std::nullopt})) << "a CPU reading on a GPU job's heatmap";
}

TEST(KpiFrame, AFrameTheAgentDidNotWriteIsRefusedSayingWhatWasWrong) {
  const auto refused = [](const v1::KpiFrame& m) {
    const auto k = decodeFrame(m.SerializeAsString());
    return k.ok() ? std::string("accepted") : k.error().message;
  };
  v1::KpiFrame good;
  good.set_job_id("frame-job");
  EXPECT_EQ(refused(good), "accepted");

  auto m = good;
  m.mutable_figures()->add_known(3);
  EXPECT_NE(refused(m).find("as many values as known figures"), std::string::npos) << refused(m);
  m = good;
  m.mutable_figures()->add_known(5);
  m.mutable_figures()->add_known(2);
  m.mutable_figures()->add_values(1);
  m.mutable_figures()->add_values(2);
  EXPECT_NE(refused(m).find("not ascending"), std::string::npos) << refused(m);
  m = good;
  m.mutable_figures()->add_known(100000);  // a newer agent's figure: left out
  m.mutable_figures()->add_values(1);
  EXPECT_EQ(refused(m), "accepted");
  m = good;
  m.add_collectives()->set_kind(99);
  EXPECT_NE(refused(m).find("collective kind is unknown (99)"), std::string::npos) << refused(m);
  m = good;
  m.add_collectives()->set_kind(1);
  m.add_collectives()->set_kind(1);
  EXPECT_NE(refused(m).find("a kind of collective listed twice"), std::string::npos) << refused(m);
  m = good;
  m.set_slowest_cause(7);
  EXPECT_NE(refused(m).find("slow cause is unknown"), std::string::npos) << refused(m);
  m = good;
  m.set_job_id("../etc");
  EXPECT_NE(refused(m), "accepted");
  m = good;
  for (std::uint32_t i = 0; i <= kMaxFrameRanks + kSlowestRanks; ++i) m.add_ranks()->set_rank(i);
  EXPECT_NE(refused(m).find("more rows of ranks than a frame holds"), std::string::npos) << refused(m);
  m = good;
  m.add_ranks()->set_node(std::string(5000, 'n'));
  EXPECT_NE(refused(m).find("a rank's node is longer than 4096 bytes"), std::string::npos) << refused(m);
  m = good;
  for (std::size_t i = 0; i < kMaxNodeBlocks; ++i) m.add_node_blocks()->set_nodes(1);
  EXPECT_EQ(refused(m), "accepted") << "2,048 blocks";
  m.add_node_blocks()->set_nodes(1);
  EXPECT_NE(refused(m).find("more than 2048 blocks of nodes"), std::string::npos) << refused(m);
  m = good;
  m.add_node_blocks()->set_first_node("n1");
  EXPECT_NE(refused(m).find("a block of no nodes"), std::string::npos) << refused(m);
  EXPECT_FALSE(decodeFrame("\xff\xff\xff garbage").ok());
}

}  // namespace
}  // namespace lockstep::kpi
