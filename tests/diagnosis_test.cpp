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

// ---- Issue 42: the kind of collective that carries the exposed time ----

// Two ranks' 1 s steps (ten of them) through the KPI engine, each with the collectives `kinds`
// (rank 1's exposed times scaled by `rank1Exposed`) and `spans` (starts from the step's start).
kpi::JobKpis stepsWith(const std::vector<CollectiveTimes>& kinds, const std::vector<CollectiveSpan>& spans,
                       double rank1Exposed = 1.0) {
  constexpr std::int64_t t0 = 1'700'000'000'000'000;
  kpi::JobTracker tracker(trainerSpec(), kpi::Settings{1e6});
  for (std::uint64_t step = 1; step <= 10; ++step) {
    const std::int64_t end = t0 + static_cast<std::int64_t>(step) * 1'000'000;
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
      StepReport r;
      r.jobId = "d";
      r.rank = rank;
      r.worldSize = 2;
      r.step = step;
      r.samples = 64;
      r.stepTimeUs = 1'000'000;
      r.timeUnixUs = end;
      r.collectives = kinds;
      std::int64_t exposed = 0;
      for (auto& c : r.collectives) {
        if (rank == 1) c.exposedUs = static_cast<std::int64_t>(static_cast<double>(c.exposedUs) * rank1Exposed);
        exposed += c.exposedUs;
      }
      r.dataTimeUs = 10'000;
      r.exposedCommTimeUs = exposed;
      r.computeTimeUs = r.stepTimeUs - exposed - *r.dataTimeUs;
      for (auto span : spans) {
        span.startUnixUs += end - r.stepTimeUs;
        r.collectiveSpans.push_back(span);
      }
      tracker.add(r, "n");
    }
  }
  return tracker.snapshot(t0 + 10'000'000);
}

// FSDP: 4 all-gathers of 8 MiB a step, 250 ms of them exposed, 200 ms of it the first, before the
// first layer's forward; 2 reduce-scatters, 50 ms exposed.
kpi::JobKpis fsdpSteps() {
  return stepsWith({{CollectiveKind::kReduceScatter, 2, 120'000, 50'000, 16u << 20},
                    {CollectiveKind::kAllGather, 4, 600'000, 250'000, 32u << 20}},
                   {{CollectiveKind::kAllGather, 0, 210'000, 200'000, 8u << 20},
                    {CollectiveKind::kAllGather, 300'000, 150'000, 20'000, 8u << 20},
                    {CollectiveKind::kAllGather, 500'000, 150'000, 20'000, 8u << 20},
                    {CollectiveKind::kReduceScatter, 700'000, 60'000, 20'000, 8u << 20},
                    {CollectiveKind::kAllGather, 800'000, 90'000, 10'000, 8u << 20},
                    {CollectiveKind::kReduceScatter, 920'000, 60'000, 30'000, 8u << 20}});
}

// Issue 45: the built-in trainer's own kinds get the trainer's advice, in English ("pushes").
TEST(Diagnosis, AParameterServersPushesAndPullsGetTheTrainersAdvice) {
  const kpi::JobKpis k = stepsWith({{CollectiveKind::kPush, 1, 200'000, 200'000, 8u << 20},
                                    {CollectiveKind::kPull, 1, 150'000, 150'000, 8u << 20}},
                                   {});
  JobSpec server = trainerSpec();
  server.sync = Sync::kParameterServer;
  const auto d = diagnoseCommunication(k, server, std::nullopt);
  ASSERT_TRUE(d);
  EXPECT_TRUE(has(d->advice, "a parameter server's pushes and pulls carry every rank's whole gradient")) << d->advice;
  EXPECT_TRUE(has(d->advice, "--sync allreduce")) << d->advice;
  EXPECT_FALSE(has(d->advice, "pushs")) << d->advice;
  JobSpec sharded = trainerSpec();
  sharded.shard = Shard::kOptimizer;
  const auto s = diagnoseCommunication(fsdpSteps(), sharded, std::nullopt);
  ASSERT_TRUE(s);
  EXPECT_TRUE(has(s->advice, "--shard none")) << s->advice;
  EXPECT_FALSE(has(s->advice, "forward_prefetch")) << "not FSDP's settings: the trainer has none of them";
  sharded.shard = Shard::kParameters;
  const auto p = diagnoseCommunication(fsdpSteps(), sharded, std::nullopt);
  ASSERT_TRUE(p);
  EXPECT_TRUE(has(p->advice, "sharded parameters (--shard parameters) reduce-scatter each bucket while backward goes "
                             "on and all-gather each layer just before")) << p->advice;
  EXPECT_TRUE(has(p->advice, "--shard optimizer keeps the gradients and parameters whole")) << p->advice;
}

TEST(Diagnosis, ExposedAllGathersBeforeTheFirstLayerAreShardedTrainings) {
  const kpi::JobKpis k = fsdpSteps();
  ASSERT_TRUE(k.commOverhead);
  EXPECT_NEAR(*k.commOverhead, 0.30, 1e-9);
  const auto d = diagnoseCommunication(k, ddpSpec(), std::nullopt);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->bound, CommBound::kUndetermined) << d->advice;
  EXPECT_TRUE(has(d->advice, "30% of step time (all-gather 25.0% · reduce-scatter 5.0%)")) << d->advice;
  EXPECT_TRUE(has(d->advice, "sharded training (FSDP, ZeRO)")) << d->advice;
  EXPECT_TRUE(has(d->advice, "forward_prefetch=True")) << d->advice;
  EXPECT_TRUE(has(d->advice, "limit_all_gathers")) << d->advice;
  EXPECT_TRUE(has(d->advice, "allgather_bucket_size")) << d->advice;
  EXPECT_TRUE(has(d->advice, "a larger per-rank batch")) << d->advice;
  // 200 of the 300 ms exposed a step are the first all-gather's: 67%.
  EXPECT_TRUE(has(d->advice, "67% of their exposed time is the step's first collective, the all-gather before "
                             "the first layer's forward")) << d->advice;
  // 8 MiB all-gathers at 32 MiB / 0.6 s x (2-1)/2: 28 MB/s bus.
  EXPECT_TRUE(has(d->advice, "all-gathers of 8.0 MiB")) << d->advice;
  EXPECT_TRUE(has(d->advice, "at an all-gather bus bandwidth of")) << d->advice;
  EXPECT_FALSE(has(d->advice, "bucket_cap_mb")) << "DDP's buckets are not what is exposed: " << d->advice;
}

TEST(Diagnosis, ExposedReduceScattersAfterBackwardAndZeroRedundancyBroadcasts) {
  // The reduce-scatter after backward carries 150 of the 200 ms exposed.
  const kpi::JobKpis rs = stepsWith({{CollectiveKind::kAllGather, 2, 100'000, 20'000, 16u << 20},
                                     {CollectiveKind::kReduceScatter, 2, 300'000, 180'000, 16u << 20}},
                                    {{CollectiveKind::kAllGather, 0, 50'000, 20'000, 8u << 20},
                                     {CollectiveKind::kReduceScatter, 600'000, 100'000, 30'000, 8u << 20},
                                     {CollectiveKind::kAllGather, 650'000, 50'000, 0, 8u << 20},
                                     {CollectiveKind::kReduceScatter, 800'000, 200'000, 150'000, 8u << 20}});
  const auto d = diagnoseCommunication(rs, ddpSpec(), std::nullopt);
  ASSERT_TRUE(d);
  EXPECT_TRUE(has(d->advice, "gradients' reduce-scatters")) << d->advice;
  EXPECT_TRUE(has(d->advice, "75% of their exposed time is the step's last collective, the reduce-scatter after "
                             "backward")) << d->advice;
  EXPECT_TRUE(has(d->advice, "reduce_bucket_size")) << d->advice;

  // ZeroRedundancyOptimizer: DDP's all-reduce is hidden; the broadcasts after the optimizer are not.
  const kpi::JobKpis zero = stepsWith({{CollectiveKind::kAllReduce, 3, 200'000, 10'000, 30u << 20},
                                       {CollectiveKind::kBroadcast, 20, 190'000, 190'000, 30u << 20}},
                                      {});
  const auto z = diagnoseCommunication(zero, ddpSpec(), std::nullopt);
  ASSERT_TRUE(z);
  EXPECT_TRUE(has(z->advice, "(broadcast 19.0% · all-reduce 1.0%)")) << z->advice;
  EXPECT_TRUE(has(z->advice, "ZeroRedundancyOptimizer's parameter broadcasts")) << z->advice;
  EXPECT_TRUE(has(z->advice, "overlap_with_ddp=True")) << z->advice;
  EXPECT_TRUE(has(z->advice, "broadcasts of 1.5 MiB")) << z->advice;
  EXPECT_EQ(z->bound, CommBound::kUndetermined) << "1.5 MiB is not small";
  // A program that counts its all-reduces: their mean size, not the whole step's bytes.
  EXPECT_NEAR(*meanReductionBytes(zero, ddpSpec()), 10.0 * 1024 * 1024, 1e-6);
}

TEST(Diagnosis, TheStragglerAndTheLinkAreToldApartForEveryKind) {
  // Rank 1 arrives last at the all-gathers: it waits 60 ms, rank 0 300 ms.
  const kpi::JobKpis late = stepsWith({{CollectiveKind::kAllGather, 4, 350'000, 300'000, 32u << 20}}, {}, 0.2);
  ASSERT_TRUE(late.stragglerWaitShare);
  const auto s = diagnoseCommunication(late, ddpSpec(), std::nullopt);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->bound, CommBound::kStraggler) << s->advice;
  EXPECT_TRUE(has(s->advice, "waiting in the all-gathers for the last one")) << s->advice;
  EXPECT_FALSE(has(s->advice, "all-reduce")) << s->advice;

  // Even ranks whose all-gathers run near the link: 32 MiB / 0.6 s x 1/2 = 28 MB/s against 35 MB/s.
  const kpi::JobKpis k = fsdpSteps();
  ASSERT_EQ(k.collectives.size(), 2u);
  const double bus = *k.collectives[1].busBandwidth;
  EXPECT_NEAR(bus, 32.0 * 1024 * 1024 / 0.6 / 2, 1e-3);
  const auto b = diagnoseCommunication(k, ddpSpec(), BandwidthReference{bus / 0.8, "the link"});
  ASSERT_TRUE(b);
  EXPECT_EQ(b->bound, CommBound::kBandwidth) << b->advice;
  EXPECT_TRUE(has(b->advice, "80% of the link")) << b->advice;
  EXPECT_TRUE(has(b->advice, "the link is the limit")) << b->advice;
  // Small all-gathers at a low bandwidth: latency.
  const kpi::JobKpis small = stepsWith({{CollectiveKind::kAllGather, 40, 400'000, 250'000, 10u << 20}}, {});
  const auto l = diagnoseCommunication(small, ddpSpec(), BandwidthReference{1e9, "the link"});
  ASSERT_TRUE(l);
  EXPECT_EQ(l->bound, CommBound::kLatency) << l->advice;
  EXPECT_TRUE(has(l->advice, "all-gathers of 256.0 KiB")) << l->advice;
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
// preemption on a busy 2-core machine puts between two even ranks (batches of 256, so that a step's
// compute, and the wait, are well above a scheduler's time slice: at 64 a CI run's even ranks once
// arrived 28 ms apart on average, half the slowed run's skew).
TEST(Diagnosis, ARankSlowedDownIsNamedAsTheStragglerTheOthersWaitFor) {
  test::TempDir dir;
  const std::vector<std::string> job = {test::trainerPath(), "--layers", "256,1024,512,10", "--dataset",
                                        "synthetic:n=8192,dim=256,seed=3", "--nproc", "2", "--batch-per-rank", "256",
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
