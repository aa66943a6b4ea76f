// The alert book (alerts/book.h) against synthetic KPIs at explicit times: Alertmanager's
// pending -> firing -> resolved, the KPIs each rule reads, event rules, the rate limit; and the
// alert's JSON and job event forms (alerts/alert.h).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "lockstep/alerts/alert.h"
#include "lockstep/alerts/book.h"

namespace lockstep::alerts {
namespace {

constexpr std::int64_t kSecondUs = 1'000'000;
constexpr std::int64_t kT0 = 1'796'506'200'000'000;  // 2026-12-05T21:30:00Z

std::vector<Rule> rulesOf(std::initializer_list<const char*> texts) {
  std::vector<Rule> rules;
  for (const char* text : texts) {
    auto rule = parseRule(text);
    EXPECT_TRUE(rule.ok()) << text;
    if (rule.ok()) rules.push_back(*rule);
  }
  return rules;
}

// Four ranks on two nodes; rank 1 is the straggler, held back by its data loading.
kpi::JobKpis commKpis(double overhead) {
  kpi::JobKpis k;
  k.jobId = "j1";
  for (std::uint32_t r = 0; r < 4; ++r) {
    kpi::RankKpis rank;
    rank.rank = r;
    rank.node = r < 2 ? "node-a" : "node-b";
    rank.commOverhead = overhead;
    k.ranks.push_back(rank);
  }
  k.commOverhead = overhead;
  k.slowestRank = 1;
  k.slowestCause = kpi::SlowCause::kDataWait;
  return k;
}

kpi::GpuKpis gpu(const std::string& node, std::uint32_t index, double util, double temperatureC = 60) {
  kpi::GpuKpis g;
  g.node = node;
  g.index = index;
  g.utilizationPct = util;
  g.temperatureC = temperatureC;
  return g;
}

kpi::JobKpis gpuKpis(std::vector<kpi::GpuKpis> gpus) {
  kpi::JobKpis k;
  k.gpus = std::move(gpus);
  return k;
}

TEST(AlertBook, PendingThenFiringOnceThenResolved) {
  AlertBook book("j1", rulesOf({"exposed_comm > 40% for 2m -> notify"}));
  auto changes = book.evaluate(commKpis(0.632), {}, kT0);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kPending);
  EXPECT_FALSE(changes[0].notify);
  EXPECT_EQ(changes[0].startedAtUs, kT0);
  ASSERT_TRUE(changes[0].value);
  EXPECT_NEAR(*changes[0].value, 63.2, 1e-9);

  EXPECT_TRUE(book.evaluate(commKpis(0.65), {}, kT0 + 60 * kSecondUs).empty());
  changes = book.evaluate(commKpis(0.632), {}, kT0 + 120 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  const Alert& firing = changes[0];
  EXPECT_EQ(firing.state, State::kFiring);
  EXPECT_TRUE(firing.notify);
  EXPECT_EQ(firing.startedAtUs, kT0);
  EXPECT_EQ(firing.timeUs, kT0 + 120 * kSecondUs);
  EXPECT_EQ(firing.jobId, "j1");
  EXPECT_EQ(firing.rule, "exposed_comm > 40% for 2m -> notify");
  EXPECT_EQ(firing.unit, "%");
  EXPECT_EQ(firing.text,
            "job j1: exposed_comm > 40% for 2m -> notify is firing: 63.2% (ranks 0-3); straggler rank 1 on node-a "
            "(data wait)");
  EXPECT_EQ(firing.ranks, std::vector<std::uint32_t>{1});
  EXPECT_EQ(firing.nodes, std::vector<std::string>{"node-a"});
  EXPECT_EQ(firing.cause, "data wait");
  ASSERT_EQ(firing.history.size(), 3u);
  EXPECT_EQ(firing.history[1].first, kT0 + 60 * kSecondUs);
  EXPECT_NEAR(firing.history[1].second, 65, 1e-9);

  // Firing is said once, however long it holds.
  EXPECT_TRUE(book.evaluate(commKpis(0.7), {}, kT0 + 180 * kSecondUs).empty());
  EXPECT_TRUE(book.evaluate(commKpis(0.7), {}, kT0 + 240 * kSecondUs).empty());
  ASSERT_EQ(book.active().size(), 1u);
  EXPECT_EQ(book.active()[0].state, State::kFiring);
  EXPECT_NEAR(*book.active()[0].value, 70, 1e-9);  // active() shows the latest reading

  changes = book.evaluate(commKpis(0.12), {}, kT0 + 300 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kResolved);
  EXPECT_TRUE(changes[0].notify);
  EXPECT_EQ(changes[0].startedAtUs, kT0);
  EXPECT_EQ(changes[0].text, "job j1: exposed_comm > 40% for 2m -> notify resolved: 12.0%");
  EXPECT_EQ(changes[0].ranks, std::vector<std::uint32_t>{1});  // what the firing was about
  EXPECT_TRUE(book.active().empty());
}

TEST(AlertBook, PendingThatStopsHoldingIsCancelledSilently) {
  AlertBook book("j1", rulesOf({"gpu_util < 30% for 10m"}));
  auto changes = book.evaluate(gpuKpis({gpu("node-a", 0, 10), gpu("node-b", 0, 20)}), {}, kT0);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kPending);
  EXPECT_NEAR(*changes[0].value, 15, 1e-9);  // the mean over the job's GPUs
  EXPECT_EQ(changes[0].nodes, (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(book.active().size(), 1u);

  EXPECT_TRUE(book.evaluate(gpuKpis({gpu("node-a", 0, 50), gpu("node-b", 0, 70)}), {}, kT0 + 300 * kSecondUs).empty());
  EXPECT_TRUE(book.active().empty());
  // Holding again starts a new wait: ten minutes from now, not from the first time.
  changes = book.evaluate(gpuKpis({gpu("node-a", 0, 5)}), {}, kT0 + 400 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].startedAtUs, kT0 + 400 * kSecondUs);
  EXPECT_TRUE(book.evaluate(gpuKpis({gpu("node-a", 0, 5)}), {}, kT0 + 900 * kSecondUs).empty());
  changes = book.evaluate(gpuKpis({gpu("node-a", 0, 5)}), {}, kT0 + 1000 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kFiring);
}

TEST(AlertBook, WithoutForFiresAtOnceNamingTheNodes) {
  AlertBook book("j1", rulesOf({"gpu_temperature > 85"}));
  const auto changes = book.evaluate(gpuKpis({gpu("node-a", 0, 90, 80), gpu("node-b", 1, 90, 91)}), {}, kT0);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kFiring);
  EXPECT_EQ(*changes[0].value, 91);
  EXPECT_EQ(changes[0].unit, "°C");
  EXPECT_EQ(changes[0].nodes, std::vector<std::string>{"node-b"});
  EXPECT_EQ(changes[0].text, "job j1: gpu_temperature > 85 is firing: 91°C on node-b");
}

TEST(AlertBook, UnknownValuesNeverHold) {
  AlertBook book("j1", rulesOf({"gpu_util < 30%", "loss < 1", "cost > 0", "disk_free < 10%", "gpu_memory > 1%"}));
  EXPECT_TRUE(book.evaluate(kpi::JobKpis{}, {}, kT0).empty());  // no GPUs, no loss, no cost, no disks
  EXPECT_TRUE(book.active().empty());

  AlertBook firing("j1", rulesOf({"gpu_util < 30%"}));
  ASSERT_EQ(firing.evaluate(gpuKpis({gpu("node-a", 0, 3)}), {}, kT0).size(), 1u);
  const auto changes = firing.evaluate(kpi::JobKpis{}, {}, kT0 + kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kResolved);
  EXPECT_FALSE(changes[0].value);
  EXPECT_EQ(changes[0].text, "job j1: gpu_util < 30% resolved: no longer measured");
}

TEST(AlertBook, NodeFactsGiveMemoryAndDisk) {
  AlertBook book("j1", rulesOf({"gpu_memory > 95%", "disk_free < 10%"}));
  auto k = gpuKpis({gpu("node-a", 0, 90), gpu("node-b", 0, 90)});
  k.gpus[0].memoryUsedBytes = 40e9;
  k.gpus[1].memoryUsedBytes = 78e9;
  NodeFacts facts;
  facts.gpuMemoryTotalBytes[{"node-a", 0}] = 80'000'000'000;
  facts.gpuMemoryTotalBytes[{"node-b", 0}] = 80'000'000'000;
  facts.diskFreePct = {{"node-a", 40}, {"node-b", 4}};
  const auto changes = book.evaluate(k, facts, kT0);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_NEAR(*changes[0].value, 97.5, 1e-9);
  EXPECT_EQ(changes[0].nodes, std::vector<std::string>{"node-b"});
  EXPECT_EQ(*changes[1].value, 4);
  EXPECT_EQ(changes[1].nodes, std::vector<std::string>{"node-b"});
}

TEST(AlertBook, StragglerWaitNamesRankNodeAndCause) {
  AlertBook book("j1", rulesOf({"straggler_wait > 30%"}));
  kpi::JobKpis k;
  k.commOverhead = 0.8;
  k.stragglerWaitShare = 0.5;
  k.slowestRank = 1;
  k.slowestCause = kpi::SlowCause::kDataWait;
  k.slowestRanks.push_back(kpi::SlowRank{1, "node-a", 0.2, kpi::SlowCause::kDataWait});
  const auto changes = book.evaluate(k, {}, kT0);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_NEAR(*changes[0].value, 40, 1e-9);
  EXPECT_EQ(changes[0].ranks, std::vector<std::uint32_t>{1});
  EXPECT_EQ(changes[0].nodes, std::vector<std::string>{"node-a"});
  EXPECT_EQ(changes[0].cause, "data wait");
  EXPECT_EQ(changes[0].text,
            "job j1: straggler_wait > 30% is firing: 40.0%: rank 1 on node-a is the straggler (data wait)");
}

// Issue 46: `mfu < 30%` reads the job's MFU (a fraction) as a percentage and names the ranks
// below it; a job whose FLOPs or peak are unknown has no MFU, and the rule never holds.
TEST(AlertBook, MfuIsAPercentageAndNamesTheRanksBelowIt) {
  AlertBook book("j1", rulesOf({"mfu < 30% for 5m"}));
  kpi::JobKpis k = commKpis(0.1);
  const double rankMfu[] = {0.45, 0.12, 0.40, 0.19};
  for (std::size_t i = 0; i < k.ranks.size(); ++i) k.ranks[i].mfu = rankMfu[i];
  k.mfu = 0.29;  // equal peaks: the ranks' mean
  auto changes = book.evaluate(k, {}, kT0);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kPending);
  ASSERT_TRUE(changes[0].value);
  EXPECT_NEAR(*changes[0].value, 29.0, 1e-9);
  changes = book.evaluate(k, {}, kT0 + 300 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kFiring);
  EXPECT_EQ(changes[0].unit, "%");
  EXPECT_EQ(changes[0].ranks, (std::vector<std::uint32_t>{1, 3}));
  EXPECT_EQ(changes[0].nodes, (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(changes[0].text, "job j1: mfu < 30% for 5m is firing: 29.0% (ranks 1, 3 on node-a, node-b)");

  AlertBook unknown("j1", rulesOf({"mfu < 30%"}));
  kpi::JobKpis noPeak = commKpis(0.1);
  noPeak.modelFlopsPerSecond = 3e15;  // FLOPs counted, no peak known: no MFU
  EXPECT_TRUE(unknown.evaluate(noPeak, {}, kT0).empty());
}

TEST(AlertBook, LossIsNanNamesTheRanks) {
  AlertBook book("j1", rulesOf({"loss is nan -> notify,stop", "loss > 5"}));
  kpi::JobKpis k;
  k.lastGlobalLoss = 0.7;
  for (std::uint32_t r = 0; r < 3; ++r) {
    kpi::RankKpis rank;
    rank.rank = r;
    rank.node = "node-a";
    // As the KPI engine gives it: a NaN loss is no figure, and said so.
    if (r == 2) rank.lossIsNan = true;
    else rank.loss = 0.7;
    k.ranks.push_back(rank);
  }
  const auto changes = book.evaluate(k, {}, kT0);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].kpi, "loss");
  EXPECT_TRUE(std::isnan(*changes[0].value));
  EXPECT_EQ(changes[0].ranks, std::vector<std::uint32_t>{2});
  EXPECT_EQ(changes[0].actions, (std::vector<Action>{Action::kNotify, Action::kStop}));
  EXPECT_EQ(changes[0].text, "job j1: loss is nan -> notify,stop is firing: nan on ranks 2");
}

JobEvent event(JobEventKind kind, std::int64_t timeUs, std::optional<std::uint32_t> rank, std::string message,
               std::string logTail = {}) {
  JobEvent e;
  e.jobId = "j1";
  e.kind = kind;
  e.timeUnixUs = timeUs;
  e.rank = rank;
  e.message = std::move(message);
  e.logTail = std::move(logTail);
  return e;
}

TEST(AlertBook, ThroughputDropAgainstTheMedianBaseline) {
  AlertBook::Options options;
  options.minBaselineReadings = 3;
  options.baselineUs = 60 * kSecondUs;
  AlertBook book("j1", rulesOf({"throughput_drop > 30%", "throughput_drop < 1%"}), options);
  kpi::JobKpis k;
  auto at = [&](double sps, std::int64_t seconds) {
    k.samplesPerSecond = sps;
    return book.evaluate(k, {}, kT0 + seconds * kSecondUs);
  };
  EXPECT_TRUE(at(100, 0).empty());  // unknown until three readings
  EXPECT_TRUE(at(100, 10).empty());
  auto changes = at(100, 20);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rule, "throughput_drop < 1%");
  EXPECT_EQ(*changes[0].value, 0);

  changes = at(50, 30);  // readings 100, 100, 100, 50: the median is 100
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].rule, "throughput_drop > 30%");
  EXPECT_EQ(changes[0].state, State::kFiring);
  EXPECT_NEAR(*changes[0].value, 50, 1e-9);
  EXPECT_EQ(changes[1].state, State::kResolved);
  // While the drop fires, the baseline stands still: a long drop does not become the pace it is
  // measured against (readings at 100 would have left the minute by 90 s).
  for (std::int64_t s = 40; s <= 120; s += 10) EXPECT_TRUE(at(50, s).empty()) << s << " s";
  changes = at(100, 130);  // the pace came back
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].rule, "throughput_drop > 30%");
  EXPECT_EQ(changes[0].state, State::kResolved);
  EXPECT_EQ(changes[1].rule, "throughput_drop < 1%");
  EXPECT_EQ(changes[1].state, State::kFiring);
}

TEST(AlertBook, AResolveIsNotNotifiedWhenItsFiringWasNot) {
  AlertBook::Options options;
  options.maxNotificationsPerMinute = 1;
  AlertBook book("j1", rulesOf({"exposed_comm > 40%", "exposed_comm > 50%"}), options);
  auto changes = book.evaluate(commKpis(0.6), {}, kT0);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_TRUE(changes[0].notify);
  EXPECT_FALSE(changes[1].notify) << "rate limited";
  changes = book.evaluate(commKpis(0.45), {}, kT0 + 120 * kSecondUs);  // the second resolves alone
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rule, "exposed_comm > 50%");
  EXPECT_EQ(changes[0].state, State::kResolved);
  EXPECT_FALSE(changes[0].notify) << "nobody heard it fire";
  EXPECT_NE(changes[0].notNotifiedWhy.find("its firing was not notified"), std::string::npos) << changes[0].notNotifiedWhy;
}

TEST(AlertBook, AStallSeenFirstFromANodeWithoutTheRankBehindNamesThatRankOnceItsNodeSaysSo) {
  AlertBook book("j1", defaultRules());
  const auto kpis = commKpis(0.1);  // ranks 0-1 on node-a, 2-3 on node-b
  book.evaluate(kpis, {}, kT0);
  // node-a's agent sees its ranks waiting; node-b's sees rank 2 behind, a moment later.
  book.onEvent(event(JobEventKind::kStalled, kT0 + kSecondUs, std::nullopt, "stalled: ranks 0, 1 wait in all-reduce"));
  book.onEvent(event(JobEventKind::kRankEvidence, kT0 + 1200000, 0, "waiting in all_reduce", "stack of rank 0"));
  book.onEvent(event(JobEventKind::kStalled, kT0 + 1300000, 2, "stalled: rank 2 did not reach all-reduce #15"));
  EXPECT_FALSE(book.evaluate(kpis, {}, kT0 + 1400000).empty());  // pending
  book.onEvent(event(JobEventKind::kRankEvidence, kT0 + 1500000, 2, "in the data loader", "Thread 1: read()"));
  const auto changes = book.evaluate(kpis, {}, kT0 + 1600000);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kFiring);
  EXPECT_EQ(changes[0].ranks, (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(changes[0].nodes, (std::vector<std::string>{"node-b"}));
  EXPECT_EQ(changes[0].evidence.rfind("rank 2 did not reach all-reduce #15\n\nrank 2: in the data loader", 0), 0u)
      << changes[0].evidence;
}


TEST(AlertBook, StallWaitsForTheStalledRanksStacks) {
  AlertBook book("j1", defaultRules());
  const auto kpis = commKpis(0.1);  // places ranks 0-1 on node-a, 2-3 on node-b
  EXPECT_TRUE(book.evaluate(kpis, {}, kT0).empty());
  book.onEvent(event(JobEventKind::kStalled, kT0 + kSecondUs, 2, "rank 2 stopped at step 41"));
  auto changes = book.evaluate(kpis, {}, kT0 + kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kPending);
  EXPECT_FALSE(changes[0].notify);

  book.onEvent(event(JobEventKind::kRankEvidence, kT0 + 1500000, 0, "waiting in all_reduce", "stack of rank 0"));
  EXPECT_TRUE(book.evaluate(kpis, {}, kT0 + 1600000).empty());
  book.onEvent(event(JobEventKind::kRankEvidence, kT0 + 2 * kSecondUs, 2, "in the data loader", "Thread 1: read()"));
  changes = book.evaluate(kpis, {}, kT0 + 2100000);
  ASSERT_EQ(changes.size(), 1u);
  const Alert& firing = changes[0];
  EXPECT_EQ(firing.state, State::kFiring);
  EXPECT_TRUE(firing.notify);
  EXPECT_EQ(firing.startedAtUs, kT0 + kSecondUs);
  EXPECT_EQ(firing.timeUs, kT0 + 2 * kSecondUs);
  // About the rank behind, not the one waiting for it; its stacks first, so clipping keeps them.
  EXPECT_EQ(firing.ranks, (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(firing.nodes, (std::vector<std::string>{"node-b"}));
  EXPECT_EQ(firing.evidence,
            "rank 2 stopped at step 41\n\nrank 2: in the data loader\nThread 1: read()\n\nrank 0: waiting in "
            "all_reduce\nstack of rank 0");
  EXPECT_EQ(firing.text, "job j1: stalled is firing: rank 2 is behind; rank 2 stopped at step 41");

  book.onEvent(event(JobEventKind::kStallEnded, kT0 + 10 * kSecondUs, std::nullopt, "moving"));
  changes = book.evaluate(kpis, {}, kT0 + 10 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kResolved);
  EXPECT_EQ(changes[0].timeUs, kT0 + 10 * kSecondUs);
  EXPECT_EQ(changes[0].text, "job j1: stalled resolved: progress moved again");
  EXPECT_TRUE(book.active().empty());
}

TEST(AlertBook, StallFiresWithWhatCameOnceTheWaitIsOver) {
  AlertBook book("j1", rulesOf({"stalled"}));
  book.onEvent(event(JobEventKind::kStalled, kT0, std::nullopt, "no rank moved for 60 s"));
  ASSERT_EQ(book.evaluate({}, {}, kT0 + 2'900'000).size(), 1u);  // pending
  auto changes = book.evaluate({}, {}, kT0 + 3 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kFiring);
  EXPECT_EQ(changes[0].timeUs, kT0 + 3 * kSecondUs);
  EXPECT_EQ(changes[0].evidence, "no rank moved for 60 s");
  EXPECT_EQ(changes[0].text, "job j1: stalled is firing: no rank moved for 60 s");
  EXPECT_TRUE(book.evaluate({}, {}, kT0 + 10 * kSecondUs).empty());  // once
}

TEST(AlertBook, StallThatEndsBeforeItsEvidenceIsNotNotified) {
  AlertBook book("j1", rulesOf({"stalled"}));
  book.onEvent(event(JobEventKind::kStalled, kT0, 1, "rank 1 is behind"));
  book.onEvent(event(JobEventKind::kStallEnded, kT0 + kSecondUs, std::nullopt, ""));
  const auto changes = book.evaluate({}, {}, kT0 + 5 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kPending);
  EXPECT_TRUE(book.active().empty());
}

TEST(AlertBook, FailedFinishedRestarted) {
  AlertBook book("j1", defaultRules());
  book.onRestarted("rank 3 lost its node", kT0);
  book.onRestarted("rank 1 exited", kT0 + kSecondUs);
  auto changes = book.evaluate({}, {}, kT0 + 2 * kSecondUs);
  ASSERT_EQ(changes.size(), 2u);  // each restart is an event of its own
  EXPECT_EQ(changes[0].text, "job j1 restarted: rank 3 lost its node");
  EXPECT_EQ(changes[1].kpi, "restarted");
  EXPECT_EQ(changes[1].timeUs, kT0 + kSecondUs);
  EXPECT_EQ(changes[1].state, State::kFiring);

  book.onEnded(JobState::kFailed, "rank 3 exited with code 1\nTraceback (most recent call last):", kT0 + 5 * kSecondUs);
  changes = book.evaluate({}, {}, kT0 + 6 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].kpi, "failed");
  EXPECT_EQ(changes[0].text, "job j1 failed: rank 3 exited with code 1");
  EXPECT_EQ(changes[0].evidence, "rank 3 exited with code 1\nTraceback (most recent call last):");
  EXPECT_TRUE(changes[0].notify);
  book.onEnded(JobState::kFailed, "again", kT0 + 7 * kSecondUs);  // the end is said once
  EXPECT_TRUE(book.evaluate({}, {}, kT0 + 8 * kSecondUs).empty());
}

TEST(AlertBook, TheEndResolvesWhatWasMeasured) {
  AlertBook book("j1", rulesOf({"gpu_temperature > 85", "finished"}));
  ASSERT_EQ(book.evaluate(gpuKpis({gpu("node-a", 0, 90, 95)}), {}, kT0).size(), 1u);
  book.onEnded(JobState::kFinished, "", kT0 + kSecondUs);
  const auto changes = book.evaluate(gpuKpis({gpu("node-a", 0, 90, 95)}), {}, kT0 + 2 * kSecondUs);
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0].state, State::kResolved);
  EXPECT_EQ(changes[0].text, "job j1: gpu_temperature > 85 resolved: the job ended");
  EXPECT_EQ(changes[1].text, "job j1 finished");
  // A stopped job fires nothing: `stopped` is no rule.
  AlertBook stopped("j1", defaultRules());
  stopped.onEnded(JobState::kStopped, "stopped by alice", kT0);
  EXPECT_TRUE(stopped.evaluate({}, {}, kT0 + kSecondUs).empty());
}

TEST(AlertBook, RateLimitsNotificationsPerMinute) {
  AlertBook book("j1", rulesOf({"gpu_temperature > 85"}));
  std::vector<Alert> all;
  for (int s = 0; s < 12; ++s) {  // firing, resolved, firing, ...: one change a second
    const auto changes = book.evaluate(gpuKpis({gpu("node-a", 0, 90, s % 2 == 0 ? 95 : 70)}), {}, kT0 + s * kSecondUs);
    ASSERT_EQ(changes.size(), 1u) << s;
    all.push_back(changes[0]);
  }
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(all[i].notify) << i;
  EXPECT_FALSE(all[10].notify);
  EXPECT_EQ(all[10].notNotifiedWhy, "more than 10 notifications for this job in a minute");
  EXPECT_EQ(all[10].state, State::kFiring);  // still returned, for the history
  EXPECT_FALSE(all[11].notify);
  // A minute after the first ones, there is room again.
  const auto later = book.evaluate(gpuKpis({gpu("node-a", 0, 90, 95)}), {}, kT0 + 61 * kSecondUs);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_TRUE(later[0].notify);
}

TEST(AlertBook, RuleWithoutNotifyIsReturnedUnnotified) {
  AlertBook book("j1", rulesOf({"gpu_util < 5% for 30m -> stop"}));
  const auto k = gpuKpis({gpu("node-a", 0, 2)});
  ASSERT_EQ(book.evaluate(k, {}, kT0).size(), 1u);
  const auto changes = book.evaluate(k, {}, kT0 + 1800 * kSecondUs);
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].state, State::kFiring);
  EXPECT_FALSE(changes[0].notify);
  EXPECT_EQ(changes[0].notNotifiedWhy, "the rule does not notify");
  EXPECT_EQ(changes[0].actions, std::vector<Action>{Action::kStop});
}

Alert sampleAlert() {
  Alert a;
  a.jobId = "j1";
  a.rule = "exposed_comm > 40% for 2m";
  a.kpi = "exposed_comm";
  a.state = State::kFiring;
  a.value = 63.25;
  a.unit = "%";
  a.startedAtUs = kT0 + 123'456;
  a.timeUs = kT0 + 120 * kSecondUs;
  a.ranks = {1, 7};
  a.nodes = {"node-a", "nöde-b"};
  a.cause = "data wait";
  a.history = {{kT0, 41.5}, {kT0 + 60 * kSecondUs, 63.25}};
  a.evidence = "line \"one\"\n\ttab \\ back";
  a.actions = {Action::kCheckpoint, Action::kStop};
  a.notify = false;
  a.notNotifiedWhy = "the rule does not notify";
  a.text = "job j1: exposed_comm > 40% for 2m is firing: 63.2%";
  return a;
}

TEST(AlertJson, RoundTrip) {
  const Alert a = sampleAlert();
  const std::string json = alertJson(a);
  EXPECT_NE(json.find("\"started_at\":\"2026-12-05T21:30:00.123Z\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"history\":[[1796506200000000,41.5],"), std::string::npos) << json;
  EXPECT_NE(json.find("\"actions\":[\"checkpoint\",\"stop\"]"), std::string::npos) << json;
  auto back = alertFromJson(json);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, a);
}

TEST(AlertJson, NanAndUnsetValues) {
  Alert a = sampleAlert();
  a.value = std::numeric_limits<double>::quiet_NaN();
  a.history.emplace_back(kT0 + 90 * kSecondUs, std::numeric_limits<double>::quiet_NaN());
  const std::string json = alertJson(a);
  EXPECT_NE(json.find("\"value\":\"nan\""), std::string::npos) << json;
  auto back = alertFromJson(json);
  ASSERT_TRUE(back.ok()) << back.error().message;
  ASSERT_TRUE(back->value);
  EXPECT_TRUE(std::isnan(*back->value));
  EXPECT_TRUE(std::isnan(back->history.back().second));
  // NaN is not equal to itself: compare the rest.
  back->value.reset();
  back->history.pop_back();
  a.value.reset();
  a.history.pop_back();
  EXPECT_EQ(*back, a);

  const std::string unset = alertJson(a);
  EXPECT_NE(unset.find("\"value\":null"), std::string::npos);
  EXPECT_FALSE(alertFromJson(unset)->value);
}

TEST(AlertJson, MalformedIsRefused) {
  for (const char* bad : {"", "not json", "[]", "{\"rule\":\"x\",\"state\":\"firing\",\"time_us\":1}",
                          "{\"job\":\"j\",\"rule\":\"x\",\"state\":\"boiling\",\"time_us\":1}",
                          "{\"job\":\"j\",\"rule\":\"x\",\"state\":\"firing\",\"time_us\":\"soon\"}",
                          "{\"job\":\"j\",\"rule\":\"x\",\"state\":\"firing\",\"time_us\":1,\"ranks\":[-1]}",
                          "{\"job\":\"j\",\"rule\":\"x\",\"state\":\"firing\",\"time_us\":1,\"value\":\"abc\"}",
                          "{\"job\":\"j\",\"rule\":\"x\",\"state\":\"firing\",\"time_us\":1,\"history\":[[1]]}",
                          "{\"job\":\"j\",\"rule\":\"x\",\"state\":\"firing\",\"time_us\":1,\"actions\":[\"page\"]}"}) {
    auto alert = alertFromJson(bad);
    ASSERT_FALSE(alert.ok()) << bad;
    EXPECT_EQ(alert.error().code, ErrorCode::kInvalidArgument) << bad;
  }
  auto minimal = alertFromJson("{\"job\":\"j\",\"rule\":\"failed\",\"state\":\"firing\",\"time_us\":5}");
  ASSERT_TRUE(minimal.ok());
  EXPECT_EQ(minimal->timeUs, 5);
}

TEST(AlertEvent, RoundTrip) {
  Alert a = sampleAlert();
  JobEvent e = alertEvent(a);
  EXPECT_EQ(e.jobId, "j1");
  EXPECT_EQ(e.kind, JobEventKind::kAlertFiring);
  EXPECT_EQ(e.timeUnixUs, a.timeUs);
  EXPECT_EQ(e.rank, std::optional<std::uint32_t>(1));
  EXPECT_EQ(e.message, a.text);
  EXPECT_EQ(alertOf(e), a);

  a.state = State::kResolved;
  e = alertEvent(a);
  EXPECT_EQ(e.kind, JobEventKind::kAlertResolved);
  EXPECT_EQ(alertOf(e), a);

  JobEvent note = e;
  note.kind = JobEventKind::kNote;
  EXPECT_FALSE(alertOf(note));
  JobEvent garbled = e;
  garbled.logTail = "{";
  EXPECT_FALSE(alertOf(garbled));
  JobEvent mismatched = e;
  mismatched.kind = JobEventKind::kAlertFiring;  // its JSON says resolved
  EXPECT_FALSE(alertOf(mismatched));
}

TEST(AlertEvent, HugeEvidenceIsClippedToTheEventLimit) {
  Alert a = sampleAlert();
  a.evidence = std::string(kMaxEvidenceBytes, '\x01');  // 6 bytes each once escaped in JSON
  a.text = std::string(10000, 'x');
  const JobEvent e = alertEvent(a);
  EXPECT_LT(e.logTail.size(), 64u * 1024);
  EXPECT_EQ(e.message.size(), 4096u);
  const auto back = alertOf(e);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rule, a.rule);
  EXPECT_LT(back->evidence.size(), a.evidence.size());
  EXPECT_EQ(back->history, a.history);
}

}  // namespace
}  // namespace lockstep::alerts
