// Issue 5: comparing jobs (scaling curves), report formats, and load()/write() over a real SQLite
// history. The renderers and recommendations are in report_test.cpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/history/history.h"
#include "lockstep/present/present.h"
#include "lockstep/report/report.h"
#include "lockstep/report/trace.h"
#include "report_fixtures.h"
#include "support/test_support.h"

namespace lockstep::report {
namespace {

using namespace fixtures;
using test::TempDir;

// ---- comparing jobs ----

history::JobRecord finished(const std::string& id, std::uint32_t ranks, double samplesPerSecond) {
  history::JobRecord j;
  j.spec = spec(id, ranks);
  j.state = JobState::kFinished;
  j.startedUnixUs = kT0;
  j.endedUnixUs = kT0 + 10 * kSecond;
  kpi::JobKpis k;
  k.worldSize = ranks;
  k.elapsedSeconds = 10;
  // step x global batch = every sample reported; / elapsed = samplesPerSecond, the job's mean
  k.step = static_cast<std::uint64_t>(samplesPerSecond * 10 / static_cast<double>(j.spec.globalBatch()));
  k.totalSamples = k.step * j.spec.globalBatch();
  k.meanSamplesPerSecond = static_cast<double>(k.totalSamples) / k.elapsedSeconds;
  k.samplesPerSecond = samplesPerSecond * 1.1;  // the last window: not what a scaling curve uses
  k.commOverhead = 0.2;
  j.finalKpis = k;
  return j;
}

TEST(ReportCompare, ScalingAgainstTheSingleRankJob) {
  std::vector<history::JobRecord> jobs = {finished("one", 1, 1280), finished("four", 4, 4096),
                                          finished("two", 2, 2304)};
  history::JobRecord other = finished("other", 8, 8000);
  other.spec.batchPerRank = 128;  // another workload
  other.finalKpis->step = 8000 * 10 / other.spec.globalBatch();
  other.finalKpis->totalSamples = 8000 * 10;
  other.finalKpis->meanSamplesPerSecond = 8000;
  jobs.push_back(other);

  const Comparison c = compare(jobs);
  EXPECT_EQ(c.kpis.header, (std::vector<std::string>{"", "one", "four", "two", "other"}));
  bool sawThroughput = false;
  for (const auto& row : c.kpis.rows) {
    ASSERT_EQ(row.size(), 5u);
    if (row[0].starts_with("Throughput")) {
      sawThroughput = true;
      EXPECT_EQ(row[1], "1,280");
      EXPECT_EQ(row[2], "4,096");
    }
    if (row[0] == "Ranks") {
      EXPECT_EQ(row[4], "8");
    }
    if (row[0] == "Energy") {
      EXPECT_EQ(row[1], "–");
    }
  }
  EXPECT_TRUE(sawThroughput);
  ASSERT_TRUE(c.throughput && c.efficiency);
  ASSERT_EQ(c.efficiency->series.size(), 1u);
  const auto& eff = c.efficiency->series[0].points;
  ASSERT_EQ(eff.size(), 3u);  // 1, 2, 4 ranks; the 8-rank job is another workload
  EXPECT_DOUBLE_EQ(eff[0].x, 1);
  EXPECT_DOUBLE_EQ(eff[0].y, 100);
  EXPECT_DOUBLE_EQ(eff[1].x, 2);
  EXPECT_DOUBLE_EQ(eff[1].y, 90);  // (2304 / 2) / 1280
  EXPECT_DOUBLE_EQ(eff[2].x, 4);
  EXPECT_DOUBLE_EQ(eff[2].y, 80);  // (4096 / 4) / 1280
  EXPECT_DOUBLE_EQ(c.throughput->series[0].points[2].y, 4096);
  EXPECT_DOUBLE_EQ(c.throughput->series[1].points[2].y, 4 * 1280);  // ideal
  EXPECT_NE(c.scalingNote.find("1-rank job one"), std::string::npos) << c.scalingNote;
}

// Issue 19: the projected line: the 1-rank job's step (74 ms) at 1 rank; the 4-rank job's step
// (80 ms busy, 5 ms more) and all-reduce (1e8 bytes at 2 GB/s bus: 75 ms at 4 ranks, 15 ms
// exposed, so 60 ms hidden) beyond. At 8 ranks: 1e8 x 1.75 / 2e9 = 87.5 ms, 27.5 ms exposed; a
// step of 112.5 ms, 8 x 64 / 0.1125 samples/s.
TEST(ReportCompare, TheProjectionTakesTheOneRankStepAndTheLargestJobsAllReduce) {
  std::vector<history::JobRecord> jobs = {finished("one", 1, 1280), finished("two", 2, 2304), finished("four", 4, 4096)};
  const auto step = [](kpi::JobKpis& k, double busy, double exposed, double stepUs) {
    k.samplesPerRankStep = 64;
    k.meanBusyUs = busy;
    k.meanExposedUs = exposed;
    k.meanStepUs = stepUs;
  };
  step(*jobs[0].finalKpis, 70'000, 0, 74'000);
  step(*jobs[2].finalKpis, 80'000, 15'000, 100'000);
  jobs[2].finalKpis->bytesReducedPerStep = 1e8;
  jobs[2].finalKpis->busBandwidth = 2e9;
  const Comparison c = compare(jobs);
  ASSERT_TRUE(c.throughput);
  ASSERT_EQ(c.throughput->series.size(), 3u);
  const Series& projected = c.throughput->series[2];
  EXPECT_EQ(projected.name, "projected (docs/kpis.md)");
  ASSERT_EQ(projected.points.size(), 5u);  // 1, 2, 4, 8 and 16 ranks
  EXPECT_DOUBLE_EQ(projected.points[0].x, 1);
  EXPECT_NEAR(projected.points[0].y, 64 / 0.074, 1e-6);
  EXPECT_DOUBLE_EQ(projected.points[3].x, 8);
  EXPECT_NEAR(projected.points[3].y, 8 * 64 / 0.1125, 1e-6);
  EXPECT_NE(c.scalingNote.find("projected line"), std::string::npos) << c.scalingNote;
  // Without a timed all-reduce there is nothing to project: no line.
  jobs[2].finalKpis->busBandwidth.reset();
  EXPECT_EQ(compare(jobs).throughput->series.size(), 2u);
}

TEST(ReportCompare, ScalingRelativeToTheSmallestRankCountWithoutASingleRankJob) {
  const std::vector<history::JobRecord> jobs = {finished("two", 2, 2048), finished("four", 4, 3276.8)};
  const Comparison c = compare(jobs);
  ASSERT_TRUE(c.efficiency);
  const auto& eff = c.efficiency->series[0].points;
  ASSERT_EQ(eff.size(), 2u);
  EXPECT_DOUBLE_EQ(eff[0].y, 100);
  EXPECT_DOUBLE_EQ(eff[1].y, 80);  // (3276.8 / 4) / (2048 / 2)
  EXPECT_NE(c.scalingNote.find("No 1-rank job"), std::string::npos) << c.scalingNote;
  EXPECT_NE(c.scalingNote.find("2 ranks"), std::string::npos) << c.scalingNote;
}

TEST(ReportCompare, NoScalingChartWithoutTwoRankCountsOfOneWorkload) {
  std::vector<history::JobRecord> jobs = {finished("a", 2, 2000), finished("b", 2, 2100)};
  EXPECT_FALSE(compare(jobs).throughput);
  jobs[1] = finished("b", 4, 3000);
  jobs[1].spec.layers = {784, 512, 10};  // another model
  EXPECT_FALSE(compare(jobs).efficiency);
  jobs[1] = finished("b", 4, 3000);
  jobs[1].finalKpis.reset();  // still running: no throughput to compare
  const Comparison c = compare(jobs);
  EXPECT_FALSE(c.throughput);
  EXPECT_FALSE(c.scalingNote.empty());
}

TEST(ReportCompare, WorkloadIgnoresRankCountAndLearningRate) {
  JobSpec a = spec("a", 2), b = spec("b", 8);
  b.optimizer.lr = 0.08;
  b.ranks[0].node = "node-z";
  EXPECT_EQ(workloadKey(a), workloadKey(b));
  b.precision = Precision::kBf16;
  EXPECT_NE(workloadKey(a), workloadKey(b));
  b = spec("b", 8);
  b.optimizer.kind = OptimizerKind::kAdamW;
  EXPECT_NE(workloadKey(a), workloadKey(b));
}

// Issue 45: one workload under three kinds of data parallelism, rank 3 20% slower. Which fits it,
// and what the others traded, in words with the figures.
TEST(ReportCompare, WhichKindOfDataParallelismFitsTheWorkloadAndWhy) {
  auto run = [](const std::string& id, double toTarget, double optimizerState, double stepUs) {
    history::JobRecord j = finished(id, 4, 4096);
    j.spec.backend = Backend::kCpu;
    j.finalKpis->timeToConvergenceSeconds = toTarget;
    j.finalKpis->optimizerStateBytesPerRank = optimizerState;
    j.finalKpis->meanStepUs = stepUs;
    j.finalKpis->smoothedLoss = 0.50;
    return j;
  };
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  std::vector<history::JobRecord> jobs = {run("plain", 100, 2.4 * kGiB, 100'000), run("zero", 103, 0.6 * kGiB, 103'000),
                                          run("async", 86, 2.4 * kGiB, 90'000)};
  jobs[0].finalKpis->loadImbalance = 1.2;
  jobs[0].finalKpis->slowestRank = 3;
  jobs[1].spec.shard = Shard::kOptimizer;
  jobs[2].spec.sync = Sync::kParameterServer;
  jobs[2].spec.staleness = 3;
  jobs[2].finalKpis->stalenessMean = 2.1;
  jobs[2].finalKpis->stalenessP99 = 3;
  jobs[2].finalKpis->smoothedLoss = 0.52;

  const Comparison c = compare(jobs);
  EXPECT_EQ(c.advice,
            (std::vector<std::string>{
                "Recommended: parameter server, asynchronous (staleness \u2264 3) (async): with rank 3 20% slower, it "
                "reached the target loss 14% sooner than all-reduce (plain).",
                "all-reduce, sharded: optimizer state (ZeRO 1) (zero) keeps 1.8 GiB less optimizer state per rank "
                "(2.4 GiB \u2192 614.4 MiB) at 3% more step time.",
                "all-reduce, sharded: optimizer state (ZeRO 1) (zero): all-reduce (plain) reached the target loss 3% "
                "sooner than it.",
                "parameter server, asynchronous (staleness \u2264 3) (async)'s gradients were 2.1 updates old on "
                "average (p99 3); its final loss was 0.5200 against 0.5000."}));
  const auto kindRow = std::find_if(c.kpis.rows.begin(), c.kpis.rows.end(), [](const auto& r) { return r[0] == "Data parallelism"; });
  ASSERT_NE(kindRow, c.kpis.rows.end());
  EXPECT_EQ((*kindRow)[2], "all-reduce, sharded: optimizer state (ZeRO 1)");
  EXPECT_TRUE(c.advice.size() == 4 && !c.throughput) << "one rank count: no scaling curve";

  // One kind only: nothing to choose between.
  EXPECT_TRUE(compare(std::vector<history::JobRecord>{run("a", 100, 1, 1), run("b", 90, 1, 1)}).advice.empty());
}

// ---- formats ----

TEST(ReportFormats, NamesAndExtensions) {
  EXPECT_EQ(*parseFormat("csv"), Format::kCsv);
  EXPECT_EQ(*parseFormat("HTML"), Format::kHtml);
  const auto bad = parseFormat("docx");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message.find("csv, json, html or pdf"), std::string::npos);
  EXPECT_EQ(formatOfPath("out/report.json"), Format::kJson);
  EXPECT_EQ(formatOfPath("report.HTM"), Format::kHtml);
  EXPECT_EQ(formatOfPath("a.pdf"), Format::kPdf);
  EXPECT_EQ(formatOfPath("dir.v2/report"), std::nullopt);
  EXPECT_EQ(formatOfPath("report.txt"), std::nullopt);
  EXPECT_EQ(formatName(Format::kCsv), "csv");
  EXPECT_EQ(gpuCsvPath("report.csv"), "report-gpus.csv");
  EXPECT_EQ(gpuCsvPath("dir.v2/report"), "dir.v2/report-gpus.csv");
  EXPECT_EQ(gpuCsvPath("/tmp/job.7.csv"), "/tmp/job.7-gpus.csv");
}

// ---- over a real history ----

constexpr std::uint64_t kSteps = 30;
const std::string kNode = "gpu-node,\"a\"";  // needs quoting in CSV

std::vector<StreamMessage> stream(const JobSpec& s, std::int64_t allreduceUs = 30'000,
                                  const std::function<void(StepReport&)>& shape = {}) {
  std::vector<StreamMessage> out;
  out.push_back({0, kNode, event(s.jobId, JobEventKind::kStarted, kT0)});
  for (std::uint64_t step = 1; step <= kSteps; ++step) {
    const std::int64_t t = kT0 + static_cast<std::int64_t>(step) * 100'000;
    for (const auto& p : s.ranks) {
      StepReport r;
      r.jobId = s.jobId;
      r.rank = p.rank;
      r.worldSize = s.worldSize;
      r.step = step;
      r.samples = s.batchPerRank;
      r.loss = 2.0f / static_cast<float>(step);
      r.globalLoss = r.loss;
      r.dataTimeUs = 5'000;
      r.computeTimeUs = 60'000 + 20'000 * p.rank;  // rank 1 is slower
      r.exposedCommTimeUs = 20'000;
      r.allreduceTimeUs = allreduceUs;
      r.bytesReduced = 1 << 20;
      r.stepTimeUs = 100'000;
      r.timeUnixUs = t;
      r.lr = 0.01;
      if (shape) shape(r);
      out.push_back({0, kNode, r});
      out.push_back({0, kNode, ProcessSample{s.jobId, p.rank, 1000 + p.rank, t, 95.0f, 1u << 28}});
      GpuSample g;
      g.node = kNode;
      g.gpuIndex = p.rank;
      g.jobId = s.jobId;
      g.timeUnixUs = t;
      g.utilizationPct = 60.0f + 10.0f * static_cast<float>(p.rank);
      g.memoryUsedBytes = 4ull << 30;
      g.powerMilliwatts = 300'000;
      g.energyMillijoules = 30'000 * step;
      g.temperatureC = 55;
      // no SM clock: an unknown metric
      out.push_back({0, kNode, g});
    }
  }
  out.push_back(
      {0, kNode, event(s.jobId, JobEventKind::kFinished, kT0 + static_cast<std::int64_t>(kSteps + 1) * 100'000)});
  return out;
}

class ReportOverHistory : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = history::History::open(dir_.file("history.db"));
    ASSERT_TRUE(opened) << opened.error().message;
    history_.emplace(std::move(*opened));
    spec_ = spec("job-7", 2);
    spec_.steps = kSteps;
    spec_.targetLoss.reset();
    for (auto& p : spec_.ranks) p.node = kNode;
    NodeHello hello;
    hello.nodeName = kNode;
    hello.host = "a.example";
    hello.cpuCores = 64;
    hello.memoryTotalBytes = 512ull << 30;
    hello.gpus = {{0, "NVIDIA H200", "GPU-0", 141ull << 30}, {1, "NVIDIA H200", "GPU-1", 141ull << 30}};
    ASSERT_TRUE(history_->recordNode(hello));
    record(spec_, stream(spec_));
  }

  // A job that ran on kNode from kT0 and finished after its last step.
  void record(const JobSpec& s, const std::vector<StreamMessage>& messages) {
    JobStatus status;
    status.spec = s;
    status.state = JobState::kRunning;
    status.startedUnixUs = kT0;
    ASSERT_TRUE(history_->recordJob(kNode, status));
    ASSERT_TRUE(history_->recordMessages(messages));
    status.state = JobState::kFinished;
    status.endedUnixUs = kT0 + static_cast<std::int64_t>(kSteps + 1) * 100'000;
    ASSERT_TRUE(history_->recordJob(kNode, status));
  }

  std::vector<std::string> lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      out.push_back(line);
    }
    return out;
  }

  TempDir dir_;
  std::optional<history::History> history_;
  JobSpec spec_;
  const std::int64_t now_ = kT0 + 3600 * kSecond;
};

TEST_F(ReportOverHistory, LoadsTheJobAtItsEnd) {
  const auto loaded = load(*history_, "job-7", now_);
  ASSERT_TRUE(loaded) << loaded.error().message;
  const ReportData& d = *loaded;
  EXPECT_EQ(d.job.spec.jobId, "job-7");
  EXPECT_EQ(d.job.state, JobState::kFinished);
  EXPECT_EQ(d.kpis.step, kSteps);
  ASSERT_EQ(d.kpis.ranks.size(), 2u);
  ASSERT_EQ(d.kpis.gpus.size(), 2u);
  // Elapsed is the first step's start to the end, not to `now_`: 0 .. 3.1 s.
  EXPECT_NEAR(d.kpis.elapsedSeconds, 3.1, 1e-6);
  ASSERT_TRUE(d.meanSamplesPerSecond);
  EXPECT_NEAR(*d.meanSamplesPerSecond, 30.0 * 128 / 3.1, 1e-6);
  EXPECT_TRUE(d.utilizationIsGpu);
  ASSERT_EQ(d.utilization.size(), 2u);
  EXPECT_EQ(d.utilization[0].name, kNode + ":0");
  EXPECT_EQ(d.loss.size(), kSteps);
  EXPECT_EQ(d.stepSplits.size(), kSteps);
  EXPECT_EQ(d.events.size(), 2u);
  ASSERT_TRUE(d.kpis.slowestRank);
  EXPECT_EQ(*d.kpis.slowestRank, 1u);
  EXPECT_EQ(d.generatedUnixUs, now_);
  // Measured: GPU utilization 65% < 70 is advised on; no target loss is said to be missing.
  EXPECT_FALSE(d.recommendations.empty());
  EXPECT_NE(std::find_if(d.recommendations.begin(), d.recommendations.end(),
                         [](const std::string& r) { return r.find("GPU utilization is 65%") != std::string::npos; }),
            d.recommendations.end());
  EXPECT_NE(std::find_if(d.missing.begin(), d.missing.end(),
                         [](const std::string& m) { return m.starts_with("time to convergence"); }),
            d.missing.end());

  const auto unknown = load(*history_, "nope", now_);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, ErrorCode::kNotFound);
}

// Issue 19: exposed communication (20% here) is held against the best bus bandwidth another job
// reached on the same nodes. job-7 moves 1 MiB in 30 ms (35 MB/s); a job on the same node that
// moved it in 20 ms reached 52 MB/s, so job-7 ran at 67% of the node's peak: bandwidth-bound.
TEST_F(ReportOverHistory, ExposedCommunicationIsHeldAgainstThePeakOfTheSameNodes) {
  const auto alone = load(*history_, "job-7", now_);
  ASSERT_TRUE(alone) << alone.error().message;
  EXPECT_FALSE(alone->bandwidthReference) << "no other job: nothing to compare with";
  JobSpec faster = spec_;
  faster.jobId = "job-8";
  JobStatus status;
  status.spec = faster;
  status.state = JobState::kRunning;
  status.startedUnixUs = kT0;
  ASSERT_TRUE(history_->recordJob(kNode, status));
  ASSERT_TRUE(history_->recordMessages(stream(faster, 20'000)));
  status.state = JobState::kFinished;
  status.endedUnixUs = kT0 + static_cast<std::int64_t>(kSteps + 1) * 100'000;
  ASSERT_TRUE(history_->recordJob(kNode, status));
  ASSERT_TRUE(history_->refreshFinalKpis());

  const auto peak = history_->peakBusBandwidth({kNode}, "job-7");
  ASSERT_TRUE(peak && *peak);
  EXPECT_EQ((*peak)->jobId, "job-8");
  EXPECT_NEAR((*peak)->bytesPerSecond, (1 << 20) / 0.020, 1e-3);
  const auto elsewhere = history_->peakBusBandwidth({"another-node"}, "job-7");
  ASSERT_TRUE(elsewhere);
  EXPECT_FALSE(*elsewhere) << "another node's jobs are not this cluster's peak";

  const auto loaded = load(*history_, "job-7", now_);
  ASSERT_TRUE(loaded) << loaded.error().message;
  ASSERT_TRUE(loaded->bandwidthReference);
  const auto advice = std::find_if(loaded->recommendations.begin(), loaded->recommendations.end(),
                                   [](const std::string& r) { return r.starts_with("Exposed communication is 20%"); });
  ASSERT_NE(advice, loaded->recommendations.end());
  EXPECT_NE(advice->find("67% of the peak job job-8 reached on these nodes"), std::string::npos) << *advice;
  EXPECT_NE(advice->find("the link is the limit"), std::string::npos) << *advice;

  // The projection section, from job-7's own step at 2 ranks.
  const Document doc = document(*loaded);
  const auto section = std::find_if(doc.sections.begin(), doc.sections.end(),
                                    [](const Section& s) { return s.heading == "What more ranks would buy"; });
  ASSERT_NE(section, doc.sections.end());
  ASSERT_EQ(section->tables.size(), 1u);
  ASSERT_EQ(section->tables[0].rows.size(), 5u);  // 1, 2, 4, 8, 16 ranks
  EXPECT_EQ(section->tables[0].rows[1][0], "2 (measured)");
  ASSERT_EQ(section->charts.size(), 1u);
  EXPECT_EQ(section->charts[0].id, "projection");
}

// Issue 42: a sharded job's collectives by kind go through the history (its steps' collectives
// column) and the replay into the report: its KPIs, its JSON, its key figures and its advice.
// A step of 100 ms: 4 all-gathers of 2 MiB each, 30 ms of them exposed, 25 ms of it the first;
// 2 reduce-scatters, 5 ms exposed.
TEST_F(ReportOverHistory, CollectivesByKindGoThroughTheHistoryIntoTheReport) {
  JobSpec fsdp = spec_;
  fsdp.jobId = "job-fsdp";
  JobStatus status;
  status.spec = fsdp;
  status.state = JobState::kRunning;
  status.startedUnixUs = kT0;
  ASSERT_TRUE(history_->recordJob(kNode, status));
  ASSERT_TRUE(history_->recordMessages(stream(fsdp, 30'000, [](StepReport& r) {
    r.allreduceTimeUs.reset();
    r.bytesReduced.reset();
    r.exposedCommTimeUs = 35'000;
    r.collectives = {{CollectiveKind::kReduceScatter, 2, 10'000, 5'000, 4u << 20},
                     {CollectiveKind::kAllGather, 4, 40'000, 30'000, 8u << 20}};
    const std::int64_t start = r.timeUnixUs - r.stepTimeUs;
    r.collectiveSpans = {{CollectiveKind::kAllGather, start + 1'000, 26'000, 25'000, 2u << 20},
                         {CollectiveKind::kAllGather, start + 30'000, 5'000, 2'000, 2u << 20},
                         {CollectiveKind::kAllGather, start + 40'000, 5'000, 2'000, 2u << 20},
                         {CollectiveKind::kAllGather, start + 50'000, 4'000, 1'000, 2u << 20},
                         {CollectiveKind::kReduceScatter, start + 80'000, 5'000, 2'000, 2u << 20},
                         {CollectiveKind::kReduceScatter, start + 90'000, 5'000, 3'000, 2u << 20}};
  })));
  status.state = JobState::kFinished;
  status.endedUnixUs = kT0 + static_cast<std::int64_t>(kSteps + 1) * 100'000;
  ASSERT_TRUE(history_->recordJob(kNode, status));

  const auto loaded = load(*history_, "job-fsdp", now_);
  ASSERT_TRUE(loaded) << loaded.error().message;
  const kpi::JobKpis& k = loaded->kpis;
  ASSERT_EQ(k.collectives.size(), 2u);
  EXPECT_EQ(k.collectives[0].kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(k.collectives[1].kind, CollectiveKind::kAllGather);
  EXPECT_DOUBLE_EQ(k.collectives[1].perStep, 4);
  EXPECT_NEAR(*k.collectives[1].exposedShare, 0.30, 1e-12);
  EXPECT_NEAR(*k.collectives[1].bytesPerStep, 8.0 * 1024 * 1024, 1e-6);
  EXPECT_NEAR(*k.collectives[1].busBandwidth, 8.0 * 1024 * 1024 / 0.040 / 2, 1e-3);  // x (2-1)/2
  EXPECT_FALSE(k.busBandwidth) << "no all-reduce";
  ASSERT_TRUE(k.exposedEnds.firstShare);
  EXPECT_NEAR(*k.exposedEnds.firstShare, 25.0 / 35, 1e-12);
  const auto advice = std::find_if(loaded->recommendations.begin(), loaded->recommendations.end(),
                                   [](const std::string& r) { return r.starts_with("Exposed communication is 35%"); });
  ASSERT_NE(advice, loaded->recommendations.end());
  EXPECT_NE(advice->find("all-gather 30.0% · reduce-scatter 5.0%"), std::string::npos) << *advice;
  EXPECT_NE(advice->find("sharded training (FSDP, ZeRO)"), std::string::npos) << *advice;
  EXPECT_NE(advice->find("71% of their exposed time is the step's first collective"), std::string::npos) << *advice;

  const std::string jsonPath = dir_.file("fsdp.json");
  ASSERT_TRUE(write(*history_, "job-fsdp", Format::kJson, jsonPath, now_));
  const std::string jsonText = test::readText(jsonPath);
  const auto j = nlohmann::json::parse(jsonText);
  const auto& kinds = j["kpis"]["collectives"];
  ASSERT_EQ(kinds.size(), 2u) << j["kpis"].dump();
  EXPECT_EQ(kinds[1]["kind"], "all_gather");
  EXPECT_DOUBLE_EQ(kinds[1]["per_step"].get<double>(), 4);
  EXPECT_NEAR(kinds[1]["exposed_share"].get<double>(), 0.3, 1e-12);
  EXPECT_NEAR(kinds[1]["time_share"].get<double>(), 0.4, 1e-12);
  EXPECT_NEAR(kinds[1]["bytes_per_step"].get<double>(), 8.0 * 1024 * 1024, 1e-6);
  EXPECT_TRUE(kinds[1]["bus_bandwidth_bytes_per_second"].is_number());
  EXPECT_EQ(j["kpis"]["exposed_ends"]["first_kind"], "all_gather");
  EXPECT_EQ(j["ranks"][0]["collectives"].size(), 2u);
  expectMatchesSchema(jsonText);

  // The key figures: a row per kind under the communication overhead.
  const Document doc = document(*loaded);
  const auto& figures = doc.sections[0].tables[0].rows;
  const auto row = std::find_if(figures.begin(), figures.end(), [](const auto& r) { return r[0] == "  all-gather"; });
  ASSERT_NE(row, figures.end());
  EXPECT_EQ((*row)[1], "30.0% exposed of 40.0%");
  EXPECT_TRUE((*row)[2].starts_with("4 per step · 8.0 MiB · ")) << (*row)[2];
  EXPECT_NE((*row)[2].find(" bus"), std::string::npos) << (*row)[2];
  // The job's own all-reduce job-7, from the trainer: one all-reduce a step.
  const auto trainer = load(*history_, "job-7", now_);
  ASSERT_TRUE(trainer);
  ASSERT_EQ(trainer->kpis.collectives.size(), 1u);
  EXPECT_EQ(trainer->kpis.collectives[0].kind, CollectiveKind::kAllReduce);
}

// Issue 46: model FLOPs utilization from the step reports' FLOPs and their agent's peak, with the
// peak named: rank 0 counts 2e12 FLOPs a step, rank 1 3e12, 30 steps over the 3.0 s from the first
// step's start to the last report, each against 100 TFLOP/s. Rank 0: 6e13 / 3.0 / 1e14 = 20%;
// rank 1: 30%; the job: 1.5e14 / 3.0 = 50 TFLOP/s of 200 TFLOP/s, 25%.
TEST_F(ReportOverHistory, MfuFromTheReportsFlopsAndTheAgentsPeakWhichTheReportNames) {
  const std::string basis = "gpu-node: NVIDIA H200 datasheet, 100.0 TFLOP/s BF16 dense";
  const auto flops = [](std::optional<double> peak) {
    return [peak](StepReport& r) {
      r.flops = r.rank == 0 ? 2e12 : 3e12;
      r.flopsBasis = FlopsBasis::kDeclared;
      r.peakFlops = peak;
    };
  };
  JobSpec s = spec_;
  s.jobId = "job-mfu";
  auto messages = stream(s, 30'000, flops(1e14));
  JobEvent peak = event(s.jobId, JobEventKind::kPeak, kT0 + 1);
  peak.message = basis;
  messages.insert(messages.begin() + 1, StreamMessage{0, kNode, peak});
  record(s, messages);
  JobSpec noPeak = spec_;
  noPeak.jobId = "job-no-peak";
  record(noPeak, stream(noPeak, 30'000, flops(std::nullopt)));

  const auto loaded = load(*history_, "job-mfu", now_);
  ASSERT_TRUE(loaded) << loaded.error().message;
  const double jobMfu = (2e12 + 3e12) * 30 / 3.0 / 2e14;
  ASSERT_TRUE(loaded->kpis.mfu);
  EXPECT_NEAR(*loaded->kpis.mfu, jobMfu, 1e-9);
  const std::string jsonPath = dir_.file("mfu.json");
  ASSERT_TRUE(write(*history_, "job-mfu", Format::kJson, jsonPath, now_));
  const std::string jsonText = test::readText(jsonPath);
  const auto j = nlohmann::json::parse(jsonText);
  EXPECT_NEAR(j["kpis"]["model_flops_utilization"].get<double>(), jobMfu, 1e-9);
  EXPECT_NEAR(j["kpis"]["model_flops_per_second"].get<double>(), 1.5e14 / 3.0, 1e-2);
  EXPECT_DOUBLE_EQ(j["kpis"]["peak_flops"].get<double>(), 2e14);
  EXPECT_EQ(j["kpis"]["flops_basis"], "declared by the program");
  EXPECT_EQ(j["kpis"]["peak_basis"], basis);
  EXPECT_NEAR(j["ranks"][0]["model_flops_utilization"].get<double>(), 6e13 / 3.0 / 1e14, 1e-9);
  EXPECT_NEAR(j["ranks"][1]["model_flops_utilization"].get<double>(), 9e13 / 3.0 / 1e14, 1e-9);
  EXPECT_DOUBLE_EQ(j["ranks"][1]["peak_flops"].get<double>(), 1e14);
  expectMatchesSchema(jsonText);

  // The key figures say it and which peak it used; so do the HTML page and the comparison.
  const auto mfuRow = [](const Document& doc) {
    const auto& rows = doc.sections[0].tables[0].rows;
    const auto row = std::find_if(rows.begin(), rows.end(), [](const auto& r) { return r[0] == "MFU"; });
    return row == rows.end() ? std::vector<std::string>{} : *row;
  };
  const auto row = mfuRow(document(*loaded));
  ASSERT_EQ(row.size(), 3u);
  EXPECT_EQ(row[1], "25.0% of peak (50.0 TFLOP/s of 200.0 TFLOP/s)");
  EXPECT_NE(row[2].find("FLOPs: declared by the program; peak: " + basis), std::string::npos) << row[2];
  const std::string htmlPath = dir_.file("mfu.html");
  ASSERT_TRUE(write(*history_, "job-mfu", Format::kHtml, htmlPath, now_));
  const std::string page = test::readText(htmlPath);
  EXPECT_NE(page.find("25.0% of peak"), std::string::npos);
  EXPECT_NE(page.find("peak: " + basis), std::string::npos);
  ASSERT_TRUE(history_->refreshFinalKpis());
  const std::vector<history::JobRecord> jobs = {*history_->job("job-mfu"), *history_->job("job-no-peak")};
  const Comparison c = compare(jobs);
  const auto compared = std::find_if(c.kpis.rows.begin(), c.kpis.rows.end(), [](const auto& r) { return r[0] == "MFU"; });
  ASSERT_NE(compared, c.kpis.rows.end());
  EXPECT_EQ(*compared, (std::vector<std::string>{"MFU", "25.0%", "–"}));

  // FLOPs without a peak: the FLOP/s, and an MFU that is unknown, not 0.
  const auto unknown = load(*history_, "job-no-peak", now_);
  ASSERT_TRUE(unknown);
  EXPECT_FALSE(unknown->kpis.mfu);
  EXPECT_EQ(mfuRow(document(*unknown))[1], "– (50.0 TFLOP/s; no peak known)");
  ASSERT_TRUE(write(*history_, "job-no-peak", Format::kJson, jsonPath, now_));
  const auto n = nlohmann::json::parse(test::readText(jsonPath));
  EXPECT_TRUE(n["kpis"]["model_flops_utilization"].is_null());
  EXPECT_TRUE(n["kpis"]["peak_flops"].is_null());
  EXPECT_TRUE(n["kpis"]["peak_basis"].is_null());
  EXPECT_TRUE(n["kpis"]["model_flops_per_second"].is_number());
  EXPECT_TRUE(n["ranks"][0]["model_flops_utilization"].is_null());
}

TEST_F(ReportOverHistory, WritesCsvWithAGpuFileAndQuoting) {
  const std::string path = dir_.file("report.csv");
  const auto written = write(*history_, "job-7", Format::kCsv, path, now_);
  ASSERT_TRUE(written) << written.error().message;
  const auto steps = lines(path);
  ASSERT_EQ(steps.size(), 1 + 2 * kSteps);
  EXPECT_EQ(steps[0],
            "job_id,node,rank,attempt,step,epoch,world_size,samples,loss,global_loss,lr,data_us,compute_us,"
            "exposed_comm_us,allreduce_us,bytes_reduced,step_us,time_unix_us,tokens,optimizer_us");
  // The job's reports count no tokens and did not time the optimizer: the last fields are empty, not 0.
  EXPECT_EQ(steps[1], "job-7,\"gpu-node,\"\"a\"\"\",0,0,1,0,2,64,2,2,0.01,5000,60000,20000,30000,1048576,100000," +
                          std::to_string(kT0 + 100'000) + ",,");
  EXPECT_TRUE(steps[2].starts_with("job-7,\"gpu-node,\"\"a\"\"\",1,0,1,"));

  const auto gpus = lines(dir_.file("report-gpus.csv"));
  ASSERT_EQ(gpus.size(), 1 + 2 * kSteps);
  EXPECT_EQ(gpus[0],
            "job_id,node,gpu,time_unix_us,span_us,utilization_pct,memory_used_bytes,power_mw,energy_mj,temperature_c,"
            "sm_clock_mhz");
  EXPECT_EQ(gpus[1], "job-7,\"gpu-node,\"\"a\"\"\",0," + std::to_string(kT0 + 100'000) +
                         ",0,60,4294967296,300000,30000,55,");  // no SM clock: an empty cell
}

TEST_F(ReportOverHistory, WritesJsonAndHtml) {
  const std::string jsonPath = dir_.file("report.json");
  ASSERT_TRUE(write(*history_, "job-7", Format::kJson, jsonPath, now_));
  const std::string jsonText = test::readText(jsonPath);
  const auto j = nlohmann::json::parse(jsonText);
  EXPECT_EQ(j["job"]["id"], "job-7");
  EXPECT_EQ(j["kpis"]["step"], kSteps);
  EXPECT_TRUE(j["kpis"]["time_to_convergence_seconds"].is_null());
  EXPECT_NEAR(j["kpis"]["gpu_utilization_pct"].get<double>(), 65, 1e-3);
  EXPECT_EQ(j["job"]["nodes"][0]["node"], kNode);
  EXPECT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["series"]["utilization_source"], "gpu");
  EXPECT_EQ(j["events"].size(), 2u);
  // What more ranks would buy: half, 1x, 2x, 4x and 8x job-7's 2 ranks, the 2 measured.
  ASSERT_EQ(j["projection"].size(), 5u) << j["projection"].dump();
  EXPECT_EQ(j["projection"][1]["ranks"], 2);
  EXPECT_EQ(j["projection"][1]["measured"], true);
  EXPECT_GT(j["projection"][0]["samples_per_second"].get<double>(), 0);
  // The measured row gives back the ranks' mean step; priced, so each row has a cost per job.
  double meanStepUs = 0;
  for (const auto& r : j["ranks"]) meanStepUs += r["mean_step_us"].get<double>() / j["ranks"].size();
  EXPECT_NEAR(j["projection"][1]["step_ms"].get<double>(), meanStepUs / 1e3, 1e-9);
  for (const auto& row : j["projection"]) {
    EXPECT_LE(row["scaling_efficiency"].get<double>(), 1.0) << row.dump();
    EXPECT_TRUE(row["cost_per_job"].is_number()) << row.dump();
  }
  expectMatchesSchema(jsonText);

  const std::string htmlPath = dir_.file("report.html");
  ASSERT_TRUE(write(*history_, "job-7", Format::kHtml, htmlPath, now_));
  const std::string page = test::readText(htmlPath);
  EXPECT_NE(page.find("<title>Job job-7 — mnist-mlp</title>"), std::string::npos);
  EXPECT_EQ(count(page, "<svg "), 7u);  // the report's 5 charts, its timeline and the projection's
  // The timeline of the slowest minute: a lane per rank, boxes coloured by phase.
  const auto timeline = page.find("id=\"chart-timeline\"");
  ASSERT_NE(timeline, std::string::npos);
  const std::string figure = page.substr(timeline, page.find("</figure>", timeline) - timeline);
  EXPECT_NE(figure.find("The slowest minute"), std::string::npos);
  EXPECT_NE(figure.find(">rank 0 ("), std::string::npos) << figure.substr(0, 2000);
  EXPECT_NE(figure.find(std::string("fill=\"") + std::string(present::phaseColor(kpi::Phase::kCompute))), std::string::npos);
  EXPECT_NE(page.find("gpu-node,&quot;a&quot;"), std::string::npos);
}

// Issue 35: a program's named phases in the trace (nested ones on one track, one that overlaps
// without nesting, another thread's, on the next) and over their steps in the report's figure.
TEST_F(ReportOverHistory, NamedPhasesGetTracksOfTheirOwnAndAreDrawnOverTheirSteps) {
  const auto phase = [&](const std::string& name, std::int64_t endUs, std::int64_t durationUs) {
    return StreamMessage{0, kNode, PhaseReport{"job-7", 0, 2, 0, name, kT0 + endUs, durationUs, 10}};
  };
  ASSERT_TRUE(history_->recordMessages(std::vector<StreamMessage>{
      phase("checkpoint", 1'450'000, 400'000), phase("checkpoint/upload", 1'400'000, 200'000),
      phase("prefetch", 1'600'000, 300'000)}));
  const std::string path = dir_.file("phases.json");
  ASSERT_TRUE(writeTrace(*history_, "job-7", {}, path));
  const auto trace = nlohmann::json::parse(test::readText(path));
  std::map<std::string, int> trackOf;
  std::map<int, std::string> threadName;
  for (const auto& e : trace["traceEvents"]) {
    if (e["pid"] != 1) continue;  // rank 0's process
    if (e["ph"] == "M" && e["name"] == "thread_name") threadName[e["tid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X" && e["cat"] == "phase") {
      trackOf[e["name"]] = e["tid"];
      EXPECT_EQ(e["args"]["after_step"], 10);
    }
  }
  EXPECT_EQ(trackOf, (std::map<std::string, int>{{"checkpoint", 2}, {"checkpoint/upload", 2}, {"prefetch", 3}}));
  EXPECT_EQ(threadName, (std::map<int, std::string>{{1, "steps"}, {2, "phases"}, {3, "phases 2"}}));

  const std::string htmlPath = dir_.file("phases.html");
  ASSERT_TRUE(write(*history_, "job-7", Format::kHtml, htmlPath, now_));
  const std::string page = test::readText(htmlPath);
  const auto at = page.find("id=\"chart-timeline\"");
  ASSERT_NE(at, std::string::npos);
  const std::string figure = page.substr(at, page.find("</figure>", at) - at);
  EXPECT_NE(figure.find(std::string("fill=\"") + std::string(present::phaseColor(kpi::Phase::kNamed))), std::string::npos);
  EXPECT_NE(figure.find(">named phase<"), std::string::npos) << "in the legend";
}

TEST_F(ReportOverHistory, WriteFailsCleanly) {
  const std::string missingDir = dir_.file("no/such/dir");
  for (const Format format : {Format::kCsv, Format::kJson, Format::kHtml}) {
    const std::string path = missingDir + "/report." + std::string(formatName(format));
    const auto written = write(*history_, "job-7", format, path, now_);
    ASSERT_FALSE(written) << formatName(format);
    EXPECT_NE(written.error().message.find("no/such/dir"), std::string::npos) << written.error().message;
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.file("no")));

  // The directory exists but the main CSV cannot be written: the GPU file is not left alone.
  std::filesystem::create_directories(dir_.file("out/report.csv"));  // a directory where the file should go
  const auto blocked = write(*history_, "job-7", Format::kCsv, dir_.file("out/report.csv"), now_);
  ASSERT_FALSE(blocked);
  EXPECT_FALSE(std::filesystem::exists(dir_.file("out/report-gpus.csv")));

  const auto pdf = write(*history_, "job-7", Format::kPdf, dir_.file("report.pdf"), now_);
  ASSERT_FALSE(pdf);
  EXPECT_EQ(pdf.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(pdf.error().message.find("Qt"), std::string::npos);

  const auto unknown = write(*history_, "nope", Format::kCsv, dir_.file("nope.csv"), now_);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.error().code, ErrorCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir_.file("nope-gpus.csv")));
}

}  // namespace
}  // namespace lockstep::report
