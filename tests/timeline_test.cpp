// Issue 35: a step as boxes on one clock, the slowest minute, and a clock offset from one exchange.

#include <gtest/gtest.h>

#include <algorithm>

#include "lockstep/kpi/timeline.h"

namespace lockstep::kpi {
namespace {

StepReport stepOf(std::uint32_t rank, std::uint64_t step, std::int64_t endUs, std::int64_t data, std::int64_t compute,
                  std::int64_t comm, std::uint32_t samples = 64) {
  StepReport r;
  r.jobId = "j";
  r.rank = rank;
  r.step = step;
  r.samples = samples;
  r.timeUnixUs = endUs;
  r.stepTimeUs = data + compute + comm;
  r.dataTimeUs = data;
  r.computeTimeUs = compute;
  r.exposedCommTimeUs = comm;
  return r;
}

TEST(Timeline, AStepsBoxesLieEndToEndAndEndWhenItsReportSays) {
  const auto boxes = boxesOf(TimelineStep::of(stepOf(0, 1, 10'000, 1'000, 6'000, 3'000)), 500);
  ASSERT_EQ(boxes.size(), 3u);
  EXPECT_EQ(boxes[0].phase, Phase::kData);
  EXPECT_EQ(boxes[0].startUs, 0 - 500);
  EXPECT_EQ(boxes[1].phase, Phase::kCompute);
  EXPECT_EQ(boxes[1].startUs, 1'000 - 500);
  EXPECT_EQ(boxes[2].phase, Phase::kCommunication);
  EXPECT_EQ(boxes[2].startUs + boxes[2].durationUs, 10'000 - 500);
  // No data time: no data box. No split at all: one box for the step.
  EXPECT_EQ(boxesOf(TimelineStep::of(stepOf(0, 1, 10'000, 0, 6'000, 4'000))).size(), 2u);
  StepReport unsplit = stepOf(0, 1, 10'000, 0, 0, 0);
  unsplit.stepTimeUs = 7'000;
  unsplit.dataTimeUs.reset();
  const auto one = boxesOf(TimelineStep::of(unsplit));
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].phase, Phase::kStep);
  EXPECT_EQ(one[0].startUs, 3'000);
}

TEST(Timeline, TheOptimizerIsCutFromTheEndOfComputeAndComesAfterTheAllReduce) {
  StepReport r = stepOf(0, 1, 10'000, 1'000, 6'000, 3'000);
  r.optimizerTimeUs = 2'000;
  const auto boxes = boxesOf(TimelineStep::of(r));
  ASSERT_EQ(boxes.size(), 4u);
  EXPECT_EQ(boxes[1].phase, Phase::kCompute);
  EXPECT_EQ(boxes[1].durationUs, 4'000) << "forward and backward: compute without the optimizer";
  EXPECT_EQ(boxes[2].phase, Phase::kCommunication);
  EXPECT_EQ(boxes[2].startUs, 5'000);
  EXPECT_EQ(boxes[3].phase, Phase::kOptimizer);
  EXPECT_EQ(boxes[3].startUs, 8'000);
  EXPECT_EQ(boxes[3].startUs + boxes[3].durationUs, 10'000) << "the step still ends when its report says";
  r.optimizerTimeUs = 9'000;  // more than its compute (a sender's mistake): no more than the compute
  const auto clamped = boxesOf(TimelineStep::of(r));
  ASSERT_EQ(clamped.size(), 3u);
  EXPECT_EQ(clamped[1].phase, Phase::kCommunication);
  EXPECT_EQ(clamped[2].phase, Phase::kOptimizer);
  EXPECT_EQ(clamped[2].durationUs, 6'000);
}

TEST(Timeline, ANamedPhaseIsABoxOfItsOwnOnItsRanksLaneAndItsNodesClock) {
  Timeline t(2);
  t.add(stepOf(1, 10, 5'000'000, 1'000, 1'000, 0), "node2");
  PhaseReport checkpoint{"j", 1, 2, 0, "checkpoint", 5'400'000, 300'000, 10};
  t.add(checkpoint, "node2");
  t.add(stepOf(1, 11, 5'500'000, 400'000, 100'000, 0), "node2");
  ASSERT_EQ(t.laneCount(), 1u) << "the rank's one lane";
  const auto* lane = t.lanes()[0];
  ASSERT_EQ(lane->phases.size(), 1u);
  EXPECT_EQ(lane->phases[0].name, "checkpoint");
  EXPECT_EQ(lane->phases[0].step, 10u);
  t.setClock("node2", ClockOffset{1'000'000, 100, 0});
  const Box box = boxOf(lane->phases[0], t.offsetOf("node2"));
  EXPECT_EQ(box.phase, Phase::kNamed);
  EXPECT_EQ(box.startUs, 5'100'000 - 1'000'000) << "it ended at 5.4 s after 0.3 s, on a clock 1 s ahead";
  EXPECT_EQ(box.durationUs, 300'000);
  // A phase at the end (after the last step) widens the span; the newest N phases are kept.
  t.add(PhaseReport{"j", 1, 2, 0, "eval", 6'000'000, 200'000, 11}, "node2");
  t.add(PhaseReport{"j", 1, 2, 0, "checkpoint", 7'000'000, 500'000, 11}, "node2");
  EXPECT_EQ(t.span().second, 6'000'000);
  ASSERT_EQ(t.lanes()[0]->phases.size(), 2u);
  EXPECT_EQ(t.lanes()[0]->phases.front().name, "eval");
}

TEST(Timeline, APhaseBeforeTheFirstStepOrAfterTheLastIsNotTheSlowestMinute) {
  Timeline t;
  // Two minutes of steady steps (one a second), then a 10-second final eval.
  for (std::int64_t s = 1; s <= 120; ++s) t.add(stepOf(0, static_cast<std::uint64_t>(s), s * 1'000'000, 0, 1'000'000, 0), "n");
  // A 30 s checkpoint load before the first step.
  t.add(PhaseReport{"j", 0, 1, 0, "load", 0, 30'000'000, 0}, "n");
  t.add(PhaseReport{"j", 0, 1, 0, "eval", 130'000'000, 10'000'000, 120}, "n");
  EXPECT_EQ(t.span(), (std::pair<std::int64_t, std::int64_t>{-30'000'000, 130'000'000}));
  const auto [from, to] = t.slowestMinute();
  EXPECT_GE(from, 0) << "not over the load";
  EXPECT_LE(to, 120'000'000) << "not over the eval";
  EXPECT_EQ(to - from, 60'000'000);
}

TEST(Timeline, LanesGoByNodeInNaturalOrderAndClocksMoveTheirNodesSteps) {
  Timeline t(2);
  t.add(stepOf(2, 1, 5'000'000, 0, 1'000, 0), "node10");
  t.add(stepOf(0, 1, 2'000'000, 0, 1'000, 0), "node2");
  t.add(stepOf(1, 1, 2'000'000, 0, 1'000, 0), "node2");
  for (std::uint64_t s = 2; s <= 4; ++s) t.add(stepOf(1, s, 2'000'000 + s, 0, 1'000, 0), "node2");
  const auto lanes = t.lanes();
  ASSERT_EQ(lanes.size(), 3u);
  EXPECT_EQ(lanes[0]->rank, 0u);
  EXPECT_EQ(lanes[1]->rank, 1u);
  EXPECT_EQ(lanes[2]->node, "node10");
  EXPECT_EQ(lanes[1]->steps.size(), 2u) << "the newest 2 of rank 1's 4";
  EXPECT_EQ(lanes[1]->steps.front().step, 3u);
  EXPECT_EQ(t.span().second, 5'000'000);
  t.setClock("node10", ClockOffset{3'000'000, 100, 0});  // node10 stamps 3 s late
  EXPECT_EQ(t.span().second, 2'000'004);
}

TEST(Timeline, TheSlowestMinuteIsTheOneWithFewestSamples) {
  Timeline t;
  // 5 minutes of a step a second; from 130 s to 190 s, a step every 3 s.
  for (std::int64_t s = 1; s <= 300; ++s) {
    if (s > 130 && s <= 190 && s % 3 != 0) continue;
    t.add(stepOf(0, static_cast<std::uint64_t>(s), s * 1'000'000, 0, 500'000, 0), "n");
  }
  const auto [from, to] = t.slowestMinute();
  EXPECT_EQ(to - from, 60'000'000);
  EXPECT_GE(from, 120'000'000);
  EXPECT_LE(from, 135'000'000);
  // One stray stamp decades back (a node whose clock was unset): the search stays as cheap (its
  // windows are sparse), and the stray's own minute, with one step, is the one with fewest samples.
  Timeline stray;
  constexpr std::int64_t kNow = 1'800'000'000'000'000;  // 2027
  for (std::int64_t s = 1; s <= 300; ++s) stray.add(stepOf(0, static_cast<std::uint64_t>(s), kNow + s * 1'000'000, 0, 500'000, 0), "n");
  stray.add(stepOf(1, 1, 1'000, 0, 500, 0), "n");
  const auto [strayFrom, strayTo] = stray.slowestMinute();
  EXPECT_EQ(strayTo - strayFrom, 60'000'000);
  EXPECT_EQ(strayFrom, 500);
  Timeline shortJob;
  shortJob.add(stepOf(0, 1, 2'000'000, 0, 1'000'000, 0), "n");
  EXPECT_EQ(shortJob.slowestMinute(), shortJob.span());
}

// Issue 42: every collective the program ran, at the time it ran, whatever its kind.
StepReport fsdpStep(std::uint32_t rank, std::uint64_t step, std::int64_t endUs, int layers) {
  StepReport r = stepOf(rank, step, endUs, 1'000, 8'000, 1'000);
  for (int i = 0; i < layers; ++i) {
    const std::int64_t at = endUs - 9'000 + i * 2'000;
    r.collectiveSpans.push_back({CollectiveKind::kAllGather, at, 1'500, 0, 8u << 20});
    r.collectiveSpans.push_back({CollectiveKind::kReduceScatter, at + 1'000, 1'500, 500, 16u << 20});
  }
  return r;
}

TEST(Timeline, AStepsCollectivesAreBoxesWhenTheyRanOnTheirNodesClock) {
  StepReport r = fsdpStep(0, 1, 10'000'000, 2);
  r.collectiveSpans.push_back({CollectiveKind::kBarrier, 9'999'000, -5, 7, 0});  // a sender's mistake
  r.collectiveSpans.push_back({CollectiveKind::kAllReduce, 9'999'000, 400, 900, 4});  // more exposed than it took
  const auto boxes = collectiveBoxesOf(TimelineStep::of(r), 1'000);
  ASSERT_EQ(boxes.size(), 6u);
  EXPECT_EQ(boxes[0].box.phase, Phase::kCollective);
  EXPECT_EQ(boxes[0].kind, CollectiveKind::kAllGather);
  EXPECT_EQ(boxes[0].box.startUs, 10'000'000 - 9'000 - 1'000) << "when it ran, on a clock 1 ms ahead";
  EXPECT_EQ(boxes[0].box.durationUs, 1'500);
  EXPECT_EQ(boxes[0].bytes, 8u << 20);
  EXPECT_EQ(boxes[1].kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(boxes[1].exposedUs, 500);
  EXPECT_EQ(boxes[1].exposed().startUs + boxes[1].exposed().durationUs, boxes[1].box.startUs + boxes[1].box.durationUs)
      << "the rank waited at its end";
  EXPECT_EQ(boxes[1].exposed().durationUs, 500);
  EXPECT_EQ(boxes[4].box.durationUs, 0);
  EXPECT_EQ(boxes[4].exposedUs, 0);
  EXPECT_EQ(boxes[5].exposedUs, 400);
  EXPECT_EQ(boxesOf(TimelineStep::of(r)).size(), 3u) << "the step's own boxes stay as they are";
  // A label ends where the next collective, overlapping its own, starts.
  const auto ends = labelEnds({boxes[0], boxes[1], boxes[2]});
  EXPECT_EQ(ends, (std::vector<std::int64_t>{boxes[1].box.startUs, boxes[2].box.startUs, boxes[2].box.startUs + 1'500}));
  EXPECT_EQ(phaseName(Phase::kCollective), "collective");
  EXPECT_NE(std::find(std::begin(kEveryPhase), std::end(kEveryPhase), Phase::kCollective), std::end(kEveryPhase))
      << "the legend lists it";
}

TEST(Timeline, ALaneKeepsTheCollectivesOfItsNewestStepsOnly) {
  Timeline t(4, 10);  // 4 steps a lane, 10 spans: 4 a step, so the newest 2 steps' and a half
  for (std::uint64_t s = 1; s <= 6; ++s) t.add(fsdpStep(0, s, static_cast<std::int64_t>(s) * 10'000'000, 2), "n");
  const auto* lane = t.lanes()[0];
  ASSERT_EQ(lane->steps.size(), 4u);
  std::size_t held = 0;
  for (const auto& s : lane->steps) held += s.collectives.size();
  EXPECT_EQ(held, lane->collectives);
  EXPECT_LE(held, 10u);
  EXPECT_EQ(lane->steps[3].collectives.size(), 4u) << "the newest step keeps its own";
  EXPECT_EQ(lane->steps[2].collectives.size(), 4u);
  EXPECT_TRUE(lane->steps[0].collectives.empty()) << "the oldest step's went first";
  EXPECT_TRUE(lane->steps[1].collectives.empty());
  Timeline all(2);  // no bound on spans: every step it keeps holds its own
  for (std::uint64_t s = 1; s <= 3; ++s) all.add(fsdpStep(0, s, static_cast<std::int64_t>(s) * 10'000'000, 3), "n");
  EXPECT_EQ(all.lanes()[0]->collectives, 12u);
  EXPECT_EQ(all.lanes()[0]->steps.front().collectives.size(), 6u);
}

TEST(Timeline, BoxesAPixelApartMergeIntoOneRun) {
  const std::vector<Box> boxes = {{Phase::kCollective, 50, 10}, {Phase::kCollective, 0, 10}, {Phase::kCollective, 12, 30},
                                  {Phase::kCollective, 20, 5}, {Phase::kCollective, 100, 1}};
  const auto runs = mergedBoxes(boxes, 5);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].startUs, 0);
  EXPECT_EQ(runs[0].durationUs, 42) << "0-10, 12-42 and 20-25 (inside) in one";
  EXPECT_EQ(runs[1].startUs, 50) << "8 apart: a run of its own";
  EXPECT_EQ(runs[2].startUs, 100);
  EXPECT_EQ(mergedBoxes(boxes, 100).size(), 1u);
}

TEST(Timeline, CoverageSaysHowMuchOfEachColumnBoxesHold) {
  // Columns of 10 µs from 100: one box over the second half of the first column and all of the
  // second; two thin ones in the fourth; one before the range, one past it.
  const std::vector<Box> boxes = {{Phase::kCollective, 105, 15}, {Phase::kCollective, 131, 2}, {Phase::kCollective, 135, 1},
                                  {Phase::kCollective, 0, 50},   {Phase::kCollective, 150, 20}, {Phase::kCollective, 120, 10},
                                  {Phase::kCollective, 120, 10}};
  const auto c = coverage(boxes, 100, 140, 4);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_DOUBLE_EQ(c[0], 0.5);
  EXPECT_DOUBLE_EQ(c[1], 1.0);
  EXPECT_DOUBLE_EQ(c[2], 1.0) << "two boxes over the same time: no more than all of it";
  EXPECT_DOUBLE_EQ(c[3], 0.3);
}

TEST(ClockOffsetTest, OneExchangeBoundsTheOffsetByHalfItsRoundTrip) {
  // Sent at 1000, answered with 5600 (the other clock), received at 1400: the other read its clock
  // somewhere in [1000, 1400] here, so it is 4400 ± 200 ahead.
  const ClockOffset c = ClockOffset::of(1'000, 5'600, 1'400);
  EXPECT_EQ(c.offsetUs, 4'400);
  EXPECT_EQ(c.uncertaintyUs, 200);
  EXPECT_EQ(c.toLocal(5'600), 1'200);
}

}  // namespace
}  // namespace lockstep::kpi
