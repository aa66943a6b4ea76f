#pragma once
// The KPI engine: the brief's KPIs of one job, computed incrementally from its stream (step
// reports, GPU and process samples, job events). No Qt; the app, lockstepctl and reports use it.
//
// Definitions (../shared/design/brief.md, docs/kpis.md):
// - throughput: samples/s over a sliding window of report time, per rank and summed;
// - communication overhead: exposed communication time / step time over the window, per rank and
//   job; split by kind of collective (all-reduce, all-gather, ...): each kind's count, time,
//   exposed time, bytes and bus bandwidth per step;
// - scaling efficiency: throughput / (N x single-rank throughput), the single-rank throughput from a
//   calibration run when one is given, else estimated from the ranks' compute-only time (data +
//   compute per step); the result says which;
// - GPU utilization: NVML utilization per GPU, the job's mean over its GPUs and time;
// - load imbalance: per global step, max / median of the ranks' compute time, averaged over the
//   window; the slowest rank and what makes it slow (data wait, compute, communication);
// - time to convergence: wall time from the job's start until the smoothed global loss (EMA 0.1,
//   as the trainer) first reaches the target loss;
// - energy: kWh from the NVML energy counter of the job's GPUs;
// - cost: GPU-hours and measured CPU core-hours times their prices, plus kWh times its price;
//   spent so far, and projected to the job's last step.
// A value that cannot be known (no GPU, no energy counter, no target) is empty, never 0.
// Not thread-safe: one owner at a time.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/common/natural.h"
#include "lockstep/protocol/stream.h"
#include "lockstep/protocol/types.h"

namespace lockstep::kpi {
namespace detail {
class CollectiveSums;  // src/collective_sums.h
class RankWindow;      // src/rank_window.h
}

using Maybe = std::optional<double>;

struct Settings {
  double windowSeconds = 10.0;
  double lossSmoothing = 0.1;
  // Samples/s of one rank alone (a calibration run); without it, scaling efficiency is estimated.
  Maybe calibratedSingleRankSamplesPerSecond;
  std::size_t seriesCapacity = 3600;  // points kept per chart series
};

enum class ScalingBasis { kUnknown, kCalibrated, kEstimatedFromCompute };

// What makes two jobs the same work at different rank counts, so that a 1-rank run calibrates the
// others' scaling efficiency: the model, data, per-rank batch, precision, optimizer and backend of
// the built-in trainer; the program, its arguments and working directory and the backend of a job
// that runs its own program.
std::string workloadKey(const JobSpec& spec);
enum class SlowCause { kUnknown, kDataWait, kCompute, kCommunication };

inline constexpr std::size_t kSlowestRanks = 5;
struct SlowRank {
  std::uint32_t rank = 0;
  std::string node;
  double excess = 0;  // its data + compute time over the median rank's, as a fraction (0.12: 12% more)
  SlowCause cause = SlowCause::kUnknown;  // data wait or compute: which of the two is further over the median
  bool operator==(const SlowRank&) const = default;
};
std::string_view scalingBasisName(ScalingBasis basis);
std::string_view slowCauseName(SlowCause cause);

// One kind of collective over the window (docs/kpis.md): a rank's, or the job's mean over its
// ranks. Only kinds that were seen are listed, in kCollectiveKindNames' order.
struct CollectiveKpis {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  double perStep = 0;    // collectives of this kind per step
  Maybe timeShare;       // their time, hidden or not, over step time
  Maybe exposedShare;    // their exposed time over step time: their part of commOverhead
  Maybe bytesPerStep;
  Maybe busBandwidth;    // bytes per second, nccl-tests' definition for the kind (collectives.h)
  bool operator==(const CollectiveKpis&) const = default;
};

// Where a step's exposed communication sits (docs/kpis.md), from the collectives the ranks reported
// one by one (StepReport::collectiveSpans) over the window: the share of the step's exposed
// collective time that its first collective took, and its last one (from steps whose spans hold
// every collective they had), with the kind that mostly was first, and last. Unknown without spans.
struct ExposedEnds {
  Maybe firstShare, lastShare;
  CollectiveKind firstKind = CollectiveKind::kAllReduce;
  CollectiveKind lastKind = CollectiveKind::kAllReduce;
  bool operator==(const ExposedEnds&) const = default;
};

struct RankKpis {
  std::uint32_t rank = 0;
  std::string node;
  std::uint32_t attempt = 0;
  std::uint64_t step = 0;
  std::uint32_t epoch = 0;
  Maybe samplesPerSecond;
  Maybe tokensPerSecond;  // when its reports count tokens
  Maybe commOverhead;  // fraction of step time
  Maybe meanDataUs, meanComputeUs, meanExposedUs, meanStepUs;
  Maybe samplesPerStep;  // its share of the global batch (uneven with --balance dynamic)
  // All-reduce bandwidth over the window (docs/kpis.md): bytes all-reduced over the time its
  // reductions took (algorithm bandwidth), and that times 2(n-1)/n (bus bandwidth, as nccl-tests
  // reports it; the all-reduce of `collectives`); bytes per second. Unknown without timed
  // reductions, or alone (n = 1).
  Maybe algBandwidth;
  Maybe busBandwidth;
  Maybe loss;
  bool lossIsNan = false;  // its newest loss was NaN (`loss` then stays unknown; alerts' `loss is nan`)
  Maybe cpuPct;
  Maybe rssBytes;
  // What it holds of the model's state (its newest report's), and how stale its gradients were
  // over the window (asynchronous training only; docs/kpis.md).
  Maybe paramBytes, gradBytes, optimizerStateBytes;
  Maybe stalenessMean, stalenessP99;
  // Model FLOPs utilization (docs/kpis.md): the model FLOPs its reports counted over the window per
  // second, its newest report's peak (the agent's: GPU datasheet or measured sgemm), and the one over
  // the other. Unknown where either is.
  Maybe modelFlopsPerSecond, peakFlops, mfu;
  std::vector<CollectiveKpis> collectives;
  bool operator==(const RankKpis&) const = default;
};

struct GpuKpis {
  std::string node;
  std::uint32_t index = 0;
  Maybe utilizationPct;      // latest
  Maybe meanUtilizationPct;  // over the job
  Maybe memoryUsedBytes;
  Maybe powerWatts;
  Maybe temperatureC;
  Maybe energyKwh;
  bool operator==(const GpuKpis&) const = default;
};

// A row of a fanned-in job's heatmap (frame.h): a block of the job's nodes in natural order, from
// `firstNode`, and their devices' utilization: the GPUs' latest, or each rank's CPU % on a job
// without GPUs. The least busy device shows an idle GPU among busy ones, which the mean hides.
struct NodeBlock {
  std::string firstNode;
  std::uint32_t nodes = 0;
  std::uint32_t devices = 0;  // with a reading
  Maybe meanPct;
  Maybe leastPct;
  bool operator==(const NodeBlock&) const = default;
};

struct JobKpis {
  std::string jobId;
  std::uint32_t worldSize = 0;
  std::uint32_t attempts = 0;    // restarts seen (attempt numbers, or the step counter going back)
  std::uint64_t step = 0;        // the newest step any rank completed
  std::uint64_t totalSteps = 0;  // 0 when not known (epochs over an unknown data set size)
  double elapsedSeconds = 0;
  Maybe samplesPerSecond;      // over the window
  Maybe tokensPerSecond;       // over the window, when the reports count tokens
  Maybe meanSamplesPerSecond;  // every sample reported / elapsed time (start-up included)
  std::uint64_t totalSamples = 0;
  std::optional<std::uint64_t> totalTokens;
  Maybe commOverhead;
  Maybe algBandwidth;  // the mean over the ranks that measured it
  Maybe busBandwidth;
  Maybe bytesReducedPerStep;  // a rank's, the mean over the window's reports that counted them
  // The most any rank holds of the model's state (a sharded job's ranks hold parts; a parameter
  // server's rank 0 holds the master too), and the staleness of an asynchronous job's gradients
  // over the window, every rank's together.
  Maybe paramBytesPerRank, gradBytesPerRank, optimizerStateBytesPerRank;
  Maybe stalenessMean, stalenessP99;
  // Model FLOPs utilization over the window (docs/kpis.md): every rank's model FLOP/s, the sum of
  // the peaks of the ranks that have one, and the FLOP/s of those ranks over that sum. flopsBasis:
  // how the FLOPs were known ("declared by the program", ...; "mixed" when ranks differ);
  // peakBasis: what the peaks were, as the agents said (their `peak` events, "; " between).
  Maybe modelFlopsPerSecond, peakFlops, mfu;
  std::string flopsBasis, peakBasis;
  // A rank's step over the window, the mean over the ranks that timed theirs: its samples, data +
  // compute time ("busy"), exposed communication and whole step (what a projection starts from).
  Maybe samplesPerRankStep, meanBusyUs, meanExposedUs, meanStepUs;
  // Waiting for the last rank to arrive (docs/kpis.md): in a step every rank reported with its
  // times, a rank's exposed communication beyond the least any rank had is time it spent in the
  // collective before the last one arrived. Over the window: that wait as a share of all exposed
  // communication, and the mean arrival skew (the most exposed time less the least). Unknown
  // alone or untimed.
  Maybe stragglerWaitShare;
  Maybe arrivalSkewUs;
  Maybe scalingEfficiency;
  ScalingBasis scalingBasis = ScalingBasis::kUnknown;
  Maybe gpuUtilizationPct;
  Maybe loadImbalance;         // max / median compute time, 1 = balanced
  Maybe initialLoadImbalance;  // the same over the job's first steps (before a dynamic split acts)
  std::optional<std::uint32_t> slowestRank;
  SlowCause slowestCause = SlowCause::kUnknown;
  // The ranks that take longest to load and compute a step, slowest first (at most kSlowestRanks):
  // at 1024 ranks, who the stragglers are, where, and why.
  std::vector<SlowRank> slowestRanks;
  Maybe lastGlobalLoss;
  Maybe smoothedLoss;
  Maybe timeToConvergenceSeconds;
  Maybe etaSeconds;
  Maybe energyKwh;
  Maybe gpuHours;
  Maybe coreHours;  // measured CPU time of the ranks
  Maybe costSoFar;      // the known parts of the cost
  Maybe costProjected;  // costSoFar scaled to the last step
  // The cost of waiting, over the whole job: the share of the ranks' step time spent in exposed
  // communication, and the part of that spent waiting for the last rank; the same shares of the
  // cost so far and (with GPUs) of the GPU-hours.
  Maybe waitingShare, stragglerShare;
  Maybe waitingCost, stragglerCost;
  Maybe waitingGpuHours, stragglerGpuHours;
  bool costComplete = true;
  std::vector<std::string> missing;  // what could not be measured, in words (for reports and tiles)
  // Why the KPIs that need step reports are unknown, for a program that sends none (or sends
  // steps without timings); empty otherwise. Also in `missing`.
  std::string noStepsReason;
  std::string noTimingsReason;
  std::vector<CollectiveKpis> collectives;  // the mean over the ranks that reported each kind
  ExposedEnds exposedEnds;                   // over all ranks' spans in the window
  std::vector<RankKpis> ranks;
  std::vector<GpuKpis> gpus;
  std::vector<NodeBlock> nodeBlocks;  // a frame's, where the client asked for them (frame.h); else none
  bool operator==(const JobKpis&) const = default;
};

struct Point {
  double x = 0;
  double y = 0;
};

// A GPU by (node, index), ordered as people read nodes: node2's GPUs before node10's.
using NodeGpu = std::pair<std::string, std::uint32_t>;
struct NodeGpuLess {
  bool operator()(const NodeGpu& a, const NodeGpu& b) const {
    if (a.first != b.first) return naturalLess(a.first, b.first);
    return a.second < b.second;
  }
};

// One global step's mean split of the step time across ranks, for the step-time chart.
struct StepSplit {
  std::uint64_t step = 0;
  double dataMs = 0, computeMs = 0, exposedMs = 0;
};

// Means of data / compute / exposed time over groups of consecutive steps (at most `maxGroups`
// groups, each at its last step): one step alone is noisy. The dashboard's and the report's
// step-time charts both show these.
template <class Splits>
std::vector<StepSplit> groupedSplits(const Splits& splits, std::size_t maxGroups) {
  const std::size_t group = std::max<std::size_t>(1, (splits.size() + maxGroups - 1) / maxGroups);
  std::vector<StepSplit> out;
  for (std::size_t start = 0; start < splits.size(); start += group) {
    const std::size_t end = std::min(splits.size(), start + group);
    StepSplit mean{splits[end - 1].step, 0, 0, 0};
    for (std::size_t i = start; i < end; ++i) {
      mean.dataMs += splits[i].dataMs;
      mean.computeMs += splits[i].computeMs;
      mean.exposedMs += splits[i].exposedMs;
    }
    const auto n = static_cast<double>(end - start);
    mean.dataMs /= n;
    mean.computeMs /= n;
    mean.exposedMs /= n;
    out.push_back(mean);
  }
  return out;
}

// One job's records (protocol/stream.h) in, its KPIs and chart series out. Records of other jobs
// are ignored.
class JobTracker : public RecordSink {
 public:
  JobTracker(JobSpec spec, Settings settings = {});
  ~JobTracker() override;
  JobTracker(JobTracker&&) noexcept;
  JobTracker& operator=(JobTracker&&) noexcept;

  void add(const StepReport& report, const std::string& node);
  void add(const GpuSample& sample);
  void add(const ProcessSample& sample);
  void add(const JobEvent& event, const std::string& node = {});
  void add(const StreamMessage& message);  // a job's record, through protocol's read()

  void onEvent(const std::string& node, const JobEvent& event) override { add(event, node); }
  void onStep(const std::string& node, const StepReport& report) override { add(report, node); }
  void onProcess(const std::string&, const ProcessSample& sample) override { add(sample); }
  void onGpu(const std::string&, const GpuSample& sample) override { add(sample); }

  // The KPIs as of `nowUnixUs` (for a running job, the wall clock; for a finished one, its end).
  JobKpis snapshot(std::int64_t nowUnixUs) const;
  std::int64_t lastReportUnixUs() const { return lastReportUs_; }
  bool ended() const { return ended_; }
  const JobSpec& spec() const { return spec_; }

  // Chart series (x: seconds since the job started, unless said otherwise).
  const std::deque<Point>& throughputSeries() const { return throughput_; }  // samples/s per second
  const std::deque<Point>& lossSeries() const { return loss_; }              // x: step
  const std::deque<StepSplit>& stepSplits() const { return splits_; }
  const std::map<NodeGpu, std::deque<Point>, NodeGpuLess>& gpuUtilizationSeries() const {
    return gpuSeries_;
  }
  const std::map<std::uint32_t, std::deque<Point>>& cpuPercentSeries() const { return cpuSeries_; }  // per rank

 private:
  struct RankState {
    std::string node;
    std::uint32_t attempt = 0;
    std::uint64_t step = 0;
    std::uint32_t epoch = 0;
    float loss = 0;
    std::unique_ptr<detail::RankWindow> window;  // its reports within the window, from its first report on
    std::int64_t firstStepStartUs = 0;  // when its first step began
    Maybe cpuPct;
    Maybe rssBytes;
    double cpuSeconds = 0;  // integrated from process samples
    std::int64_t lastProcessUs = 0;
  };
  struct GpuState {
    Maybe util;
    double utilSum = 0;
    std::uint64_t utilCount = 0;
    Maybe memory, power, temperature;
    double energyMillijoules = 0;  // summed over counter segments
    std::optional<std::uint64_t> lastEnergy;
  };
  struct StepAcc {
    std::uint32_t ranks = 0;
    std::uint32_t timed = 0;  // ranks whose report carried data, compute and exposed times
    std::uint32_t worldSize = 1;
    double dataUs = 0, computeUs = 0, exposedUs = 0;
    double leastExposedUs = 0, mostExposedUs = 0;  // over the timed ranks so far
    double waitUs = -1;  // a complete step's exposed time beyond the least, summed over ranks; -1: unknown
    std::vector<double> computes;  // while ranks report; freed once the step is complete
    double imbalance = 0;          // a complete step's slowest compute time over its median; 0: unknown
    double lossSum = 0;  // sum of loss x samples over the ranks with a finite loss
    std::uint64_t lossSamples = 0;
    bool reportedGlobalLoss = false;
    std::int64_t timeUs = 0;
  };

  // The moment the rates are read at, and the window before it (src/snapshot.cpp).
  struct Window {
    std::int64_t now = 0, windowUs = 0;
    double span = 0;  // seconds: the window, or less at the job's start
    bool holds(std::int64_t timeUs) const { return timeUs > now - windowUs && timeUs <= now; }
  };
  struct RankTotals;

  double secondsSinceStart(std::int64_t unixUs) const;
  void noteGlobalLoss(std::uint64_t step, double loss, std::int64_t timeUnixUs);
  void trimWindow(RankState& rank, std::int64_t nowUs) const;
  // The parts of snapshot(), in its order.
  Window window(JobKpis& k, std::int64_t nowUnixUs) const;
  RankKpis rankKpis(std::uint32_t id, const RankState& r, const Window& w, RankTotals& t) const;
  void allReduceBandwidth(RankKpis& rk, const detail::CollectiveSums& sums, RankTotals& t) const;
  void jobRates(JobKpis& k, const RankTotals& t) const;
  void peakBasis(JobKpis& k) const;
  void completeSteps(JobKpis& k, const Window& w) const;
  void slowestRank(JobKpis& k, const RankTotals& t) const;
  void eta(JobKpis& k, const Window& w) const;
  std::size_t gpuFigures(JobKpis& k) const;
  void missingReasons(JobKpis& k, std::size_t gpuCount) const;
  void costs(JobKpis& k, std::size_t gpuCount) const;
  void waitingCosts(JobKpis& k, bool gpus) const;  // after the cost so far
  template <class T>
  void push(std::deque<T>& series, T value) const;

  JobSpec spec_;
  Settings settings_;
  std::int64_t startUs_ = 0;
  std::int64_t lastReportUs_ = 0;
  std::int64_t endUs_ = 0;
  bool ended_ = false;
  std::uint32_t attempts_ = 1;
  std::uint32_t latestAttempt_ = 0;
  std::uint32_t worldSize_ = 0;  // of the latest attempt's reports
  std::map<std::uint32_t, RankState> ranks_;
  std::map<NodeGpu, GpuState, NodeGpuLess> gpus_;
  std::map<std::pair<std::uint32_t, std::uint64_t>, StepAcc> steps_;  // (attempt, step): for imbalance, splits
  std::uint64_t totalSamples_ = 0;
  std::optional<std::uint64_t> totalTokens_;
  bool timedReports_ = false;  // a report carried a compute time
  // Over the job: timed reports' step and exposed time, and complete steps' wait for the last rank.
  double timedStepUs_ = 0, timedExposedUs_ = 0, waitedUs_ = 0;
  Maybe smoothedLoss_;
  Maybe lastGlobalLoss_;
  static constexpr std::size_t kMaxPeakBases = 8;     // named in peakBasis; the rest counted
  std::map<std::string, std::string> peakBases_;     // by node: its newest `peak` event's message
  std::uint64_t lossStep_ = 0;
  Maybe convergedAtSeconds_;
  std::deque<Point> throughput_;
  std::deque<Point> loss_;
  std::deque<StepSplit> splits_;
  std::map<NodeGpu, std::deque<Point>, NodeGpuLess> gpuSeries_;
  std::map<std::uint32_t, std::deque<Point>> cpuSeries_;
  std::map<std::int64_t, double> samplesPerSecondBucket_;
  static constexpr int kInitialSteps = 10;
  int initialSteps_ = 0;
  double initialImbalanceSum_ = 0;
};

}  // namespace lockstep::kpi
