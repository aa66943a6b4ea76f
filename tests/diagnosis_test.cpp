// Issue 19: why exposed communication is high, said from the figures (report/diagnosis.h): the
// rules on hand-made KPIs, and the straggler on a real 2-rank trainer with one rank slowed down.

#include <gtest/gtest.h>


#include "lockstep/report/diagnosis.h"
#include "metrics.h"
#include "support/test_support.h"

namespace lockstep::report {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

JobSpec trainerSpec() {
  JobSpec spec;
  spec.jobId = "d";
  spec.worldSize = 2;
  spec.batchPerRank = 64;
  spec.bucketMb = 25;
  return spec;
}

kpi::JobKpis highComm() {
  kpi::JobKpis k;
  k.commOverhead = 0.30;
  k.stragglerWaitShare = 0.10;
  k.busBandwidth = 2.5e9;
  k.bytesReducedPerStep = 100e6;
  return k;
}

TEST(Diagnosis, NothingToExplainBelowTheThresholdOrUnknown) {
  kpi::JobKpis k = highComm();
  k.commOverhead = 0.12;
  EXPECT_FALSE(diagnoseCommunication(k, trainerSpec(), std::nullopt));
  k.commOverhead.reset();
  EXPECT_FALSE(diagnoseCommunication(k, trainerSpec(), std::nullopt));
}

TEST(Diagnosis, RanksWaitingForTheLastOneAreAStraggler) {
  kpi::JobKpis k = highComm();
  k.stragglerWaitShare = 0.62;
  k.arrivalSkewUs = 41'300;
  k.slowestRank = 3;
  k.slowestCause = kpi::SlowCause::kCompute;
  k.slowestRanks = {{3, "node-b", 0.4, kpi::SlowCause::kCompute}};
  // The straggler comes first even where the link is near its capacity: its wait is not the link's.
  const auto d = diagnoseCommunication(k, trainerSpec(), BandwidthReference{2.6e9, "the link"});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->bound, CommBound::kStraggler);
  EXPECT_TRUE(has(d->advice, "30% of step time")) << d->advice;
  EXPECT_TRUE(has(d->advice, "62% of it")) << d->advice;
  EXPECT_TRUE(has(d->advice, "arrival skew 41.3 ms")) << d->advice;
  EXPECT_TRUE(has(d->advice, "rank 3 on node-b (compute)")) << d->advice;
}

TEST(Diagnosis, BusBandwidthNearTheReferenceIsTheLink) {
  // 2.5 GB/s on a 25 Gb/s (3.125 GB/s) link: 80%.
  const auto d = diagnoseCommunication(highComm(), trainerSpec(), BandwidthReference{3.125e9, "the 25 Gb/s link of node-b"});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->bound, CommBound::kBandwidth);
  EXPECT_TRUE(has(d->advice, "80% of the 25 Gb/s link of node-b")) << d->advice;
  EXPECT_TRUE(has(d->advice, "now 64")) << d->advice;
}

TEST(Diagnosis, SmallAllReducesAtLowBandwidthAreLatency) {
  kpi::JobKpis k = highComm();
  k.busBandwidth = 0.2e9;
  k.bytesReducedPerStep = 4.0 * 1024 * 1024;
  JobSpec spec = trainerSpec();
  spec.bucketMb = 0.5;  // 4 MiB in buckets of 0.5 MiB: 8 all-reduces of 512 KiB
  EXPECT_NEAR(*meanReductionBytes(k, spec), 512.0 * 1024, 1e-9);
  const auto d = diagnoseCommunication(k, spec, BandwidthReference{3.125e9, "the link"});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->bound, CommBound::kLatency);
  EXPECT_TRUE(has(d->advice, "all-reduces of 512")) << d->advice;
  EXPECT_TRUE(has(d->advice, "6% of the link")) << d->advice;
  EXPECT_TRUE(has(d->advice, "--bucket-mb")) << d->advice;
  // The same step in 25 MiB buckets is one 4 MiB all-reduce: not small, and far from the link.
  spec.bucketMb = 25;
  const auto big = diagnoseCommunication(k, spec, BandwidthReference{3.125e9, "the link"});
  ASSERT_TRUE(big);
  EXPECT_EQ(big->bound, CommBound::kUndetermined);
  EXPECT_TRUE(has(big->advice, "6% of the link")) << big->advice;
}

TEST(Diagnosis, TheTrainersOwnChoiceOfBucketsIsNotSecondGuessed) {
  // Issue 34: without --bucket-mb the trainer chose its buckets from measurements; the advice
  // points at that plan rather than at a size the job never gave.
  JobSpec spec = trainerSpec();
  spec.bucketMb = 0;
  kpi::JobKpis k = highComm();
  k.bytesReducedPerStep = 4.0 * 1024 * 1024;
  EXPECT_FALSE(meanReductionBytes(k, spec)) << "the sizes are the trainer's, not known here";
  const auto d = diagnoseCommunication(k, spec, std::nullopt);
  ASSERT_TRUE(d);
  EXPECT_TRUE(has(d->advice, "chose its buckets from measurements")) << d->advice;
  EXPECT_FALSE(has(d->advice, "--bucket-mb")) << d->advice;
}

// A DDP program (the reference MLP's 7.45 MB of gradients) whose step is 9 ms of compute and 3 ms
// waiting after backward: in DDP's default buckets (1 MB, then the rest) nearly all of it is reduced
// after backward. The step model suggests smaller buckets and says what it expects.
kpi::JobKpis ddpStep(double exposedUs) {
  kpi::JobKpis k;
  k.commOverhead = exposedUs / (9000 + exposedUs);
  k.bytesReducedPerStep = 7.45 * 1024 * 1024;
  k.meanBusyUs = 9000;
  k.meanExposedUs = exposedUs;
  k.stragglerWaitShare = 0;
  k.gpuUtilizationPct = 80;  // a GPU job: on CPUs the model is no guide to DDP
  return k;
}

JobSpec ddpSpec() {
  JobSpec spec = trainerSpec();
  spec.command = CommandSpec{{"/usr/bin/python3", "train.py"}, {}};
  return spec;
}

TEST(Diagnosis, ADdpProgramIsToldWhichBucketCapToTryAndWhatToExpect) {
  const auto advice = ddpBucketAdvice(ddpStep(3000));
  ASSERT_TRUE(advice);
  EXPECT_LT(advice->capMb, 25);
  EXPECT_GE(advice->capMb, 0.25);
  EXPECT_NEAR(advice->currentExposedUs, 3000, 1e-6);
  EXPECT_LT(advice->expectedExposedUs, 0.8 * 3000);
  const auto d = diagnoseCommunication(ddpStep(3000), ddpSpec(), std::nullopt);
  ASSERT_TRUE(d);
  EXPECT_TRUE(has(d->advice, "DDP(bucket_cap_mb=")) << d->advice;
  EXPECT_TRUE(has(d->advice, "instead of 3.00 ms")) << d->advice;
  // Waiting for a late rank is not the buckets' to change.
  kpi::JobKpis late = ddpStep(3000);
  late.stragglerWaitShare = 0.4;
  EXPECT_NEAR(ddpBucketAdvice(late)->currentExposedUs, 1800, 1e-6);
  // Nothing worth a change to suggest when backward already hides nearly all of it.
  EXPECT_FALSE(ddpBucketAdvice(ddpStep(100)));
  kpi::JobKpis slow = ddpStep(3e6);  // 12.6 s of compute and 3 s exposed: an answer, and at once
  slow.meanBusyUs = 12.6e6;
  EXPECT_TRUE(ddpBucketAdvice(slow));
  kpi::JobKpis cpu = ddpStep(3000);
  cpu.gpuUtilizationPct.reset();
  EXPECT_FALSE(ddpBucketAdvice(cpu));
  kpi::JobKpis unknown = ddpStep(3000);
  unknown.bytesReducedPerStep.reset();
  EXPECT_FALSE(ddpBucketAdvice(unknown));
}

TEST(Diagnosis, WithoutAReferenceItSaysWhatIsMissing) {
  const auto d = diagnoseCommunication(highComm(), trainerSpec(), std::nullopt);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->bound, CommBound::kUndetermined);
  EXPECT_TRUE(has(d->advice, "no link speed or earlier peak")) << d->advice;
  kpi::JobKpis untimed = highComm();
  untimed.busBandwidth.reset();
  untimed.bytesReducedPerStep.reset();
  const auto u = diagnoseCommunication(untimed, trainerSpec(), std::nullopt);
  ASSERT_TRUE(u);
  EXPECT_TRUE(has(u->advice, "no timed reductions")) << u->advice;
}

// The trainer's step reports (--metrics-out) into the KPI engine, as an agent would stream them.
kpi::JobKpis kpisOf(const std::string& metricsPath) {
  const auto reports = trainer::readStepReports(metricsPath);
  EXPECT_TRUE(reports && !reports->empty()) << (reports ? "no step reports" : reports.error().message);
  if (!reports || reports->empty()) return {};
  JobSpec spec = trainerSpec();
  spec.jobId = reports->front().jobId;
  kpi::JobTracker tracker(spec, kpi::Settings{1e6});  // the whole run is the window
  std::int64_t last = 0;
  for (const auto& r : *reports) {
    tracker.add(r, "n");
    last = std::max(last, r.timeUnixUs);
  }
  return tracker.snapshot(last);
}

// Rank 1 computes 8x slower: its peers wait 7x their compute for it each step, far beyond what
// preemption on a busy 2-core machine puts between two even ranks.
TEST(Diagnosis, ARankSlowedDownIsNamedAsTheStragglerTheOthersWaitFor) {
  test::TempDir dir;
  const std::vector<std::string> job = {test::trainerPath(), "--layers", "256,1024,512,10", "--dataset",
                                        "synthetic:n=8192,dim=256,seed=3", "--nproc", "2", "--batch-per-rank", "64",
                                        "--steps", "40", "--quiet", "--metrics-out"};
  auto args = job;
  args.push_back(dir.file("slow.jsonl"));
  const auto slow = test::runProcess(args, {{"LOCKSTEP_TEST_SLOWDOWN", "1:8"}}, dir);
  ASSERT_TRUE(slow.status.success()) << slow.err;
  args.back() = dir.file("even.jsonl");
  const auto even = test::runProcess(args, {}, dir);
  ASSERT_TRUE(even.status.success()) << even.err;

  const kpi::JobKpis k = kpisOf(dir.file("slow.jsonl"));
  ASSERT_TRUE(k.stragglerWaitShare && k.arrivalSkewUs);
  const auto d = diagnoseCommunication(k, trainerSpec(), std::nullopt);
  ASSERT_TRUE(d) << "rank 0 waits seven times its own compute for rank 1";
  EXPECT_EQ(d->bound, CommBound::kStraggler) << d->advice;
  EXPECT_TRUE(has(d->advice, "rank 1")) << d->advice;
  EXPECT_GT(*k.stragglerWaitShare, kStragglerWaitShare);
  const kpi::JobKpis e = kpisOf(dir.file("even.jsonl"));
  ASSERT_TRUE(e.stragglerWaitShare);
  EXPECT_LT(*e.arrivalSkewUs, *k.arrivalSkewUs / 2)
      << "an even run's ranks arrive closer together: " << *e.arrivalSkewUs << " us against " << *k.arrivalSkewUs;
}

}  // namespace
}  // namespace lockstep::report
