#include "lockstep/kpi/kpi.h"

#include <algorithm>
#include <cmath>

#include "lockstep/protocol/names.h"
#include "lockstep/kpi/median.h"
#include "rank_window.h"

namespace lockstep::kpi {
namespace {

constexpr std::size_t kStepsKept = 2000;

}  // namespace

std::string workloadKey(const JobSpec& spec) {
  std::string key(nameOf(spec.backend));
  if (spec.command) {
    key += " program";
    for (const auto& word : spec.command->argv) key += " [" + word + "]";
    return key + " in " + spec.command->workingDir;
  }
  std::string layers;
  for (const auto size : spec.layers) layers += (layers.empty() ? "" : ", ") + std::to_string(size);
  key += " layers " + layers;
  key += " " + std::string(nameOf(spec.activation)) + " " + std::string(nameOf(spec.precision));
  if (const auto* s = std::get_if<SyntheticDataset>(&spec.dataset)) {
    key += " synthetic n=" + std::to_string(s->samples) + " dim=" + std::to_string(s->dim) +
           " classes=" + std::to_string(s->classes);
  } else {
    const auto& npy = std::get<NpyDataset>(spec.dataset);
    key += " npy " + npy.featuresPath + " " + npy.labelsPath;
  }
  key += " batch " + std::to_string(spec.batchPerRank) + "x" + std::to_string(spec.accumSteps);
  // The optimizer's kind sets the work per step; its learning rate does not.
  key += " " + std::string(nameOf(spec.optimizer.kind));
  return key;
}

std::string_view scalingBasisName(ScalingBasis basis) {
  switch (basis) {
    case ScalingBasis::kCalibrated: return "calibrated";
    case ScalingBasis::kEstimatedFromCompute: return "estimated from compute time";
    case ScalingBasis::kUnknown: break;
  }
  return "unknown";
}

std::string_view slowCauseName(SlowCause cause) {
  switch (cause) {
    case SlowCause::kDataWait: return "data wait";
    case SlowCause::kCompute: return "compute";
    case SlowCause::kCommunication: return "communication";
    case SlowCause::kUnknown: break;
  }
  return "unknown";
}

JobTracker::JobTracker(JobSpec spec, Settings settings) : spec_(std::move(spec)), settings_(settings) {}
JobTracker::~JobTracker() = default;
JobTracker::JobTracker(JobTracker&&) noexcept = default;
JobTracker& JobTracker::operator=(JobTracker&&) noexcept = default;

double JobTracker::secondsSinceStart(std::int64_t unixUs) const {
  return startUs_ == 0 ? 0.0 : static_cast<double>(unixUs - startUs_) / 1e6;
}

template <class T>
void JobTracker::push(std::deque<T>& series, T value) const {
  series.push_back(value);
  while (series.size() > settings_.seriesCapacity) series.pop_front();
}

void JobTracker::trimWindow(RankState& rank, std::int64_t nowUs) const {
  rank.window->trim(nowUs - static_cast<std::int64_t>(settings_.windowSeconds * 1e6));
}

void JobTracker::add(const StreamMessage& message) { visitRecord(message, *this); }

void JobTracker::add(const StepReport& r, const std::string& node) {
  if (r.jobId != spec_.jobId) return;
  const std::int64_t stepStart = r.timeUnixUs - r.stepTimeUs;
  if (startUs_ == 0 || stepStart < startUs_) startUs_ = stepStart;
  RankState& rank = ranks_[r.rank];
  // A new attempt, or the step counter going back, is a restart: measurements start afresh.
  const bool restarted = r.attempt > rank.attempt || (r.attempt == rank.attempt && rank.step > 0 && r.step <= rank.step);
  if (rank.firstStepStartUs == 0) rank.firstStepStartUs = stepStart;
  if (!rank.window) rank.window = std::make_unique<detail::RankWindow>();
  if (restarted) {
    rank.window->clear();
    attempts_ = std::max(attempts_, r.attempt > rank.attempt ? r.attempt + 1 : attempts_ + 1);
    if (r.step <= lossStep_) lossStep_ = r.step - 1;
  }
  if (r.attempt >= latestAttempt_) {
    latestAttempt_ = r.attempt;
    worldSize_ = r.worldSize;
  }
  rank.node = node;
  rank.attempt = r.attempt;
  rank.step = r.step;
  rank.epoch = r.epoch;
  rank.loss = r.loss;
  rank.window->push(r);
  trimWindow(rank, r.timeUnixUs);
  lastReportUs_ = std::max(lastReportUs_, r.timeUnixUs);

  // Throughput per second of job time, finalized when a later second begins (gaps count as 0).
  const auto second = static_cast<std::int64_t>(std::floor(secondsSinceStart(r.timeUnixUs)));
  samplesPerSecondBucket_[second] += r.samples;
  while (samplesPerSecondBucket_.size() > 1 && samplesPerSecondBucket_.begin()->first < second) {
    const auto [s, samples] = *samplesPerSecondBucket_.begin();
    samplesPerSecondBucket_.erase(samplesPerSecondBucket_.begin());
    const std::int64_t first = throughput_.empty() ? s : static_cast<std::int64_t>(throughput_.back().x) + 1;
    for (std::int64_t gap = first; gap < s; ++gap) push(throughput_, Point{static_cast<double>(gap), 0.0});
    push(throughput_, Point{static_cast<double>(s), samples});
  }

  totalSamples_ += r.samples;
  if (r.tokens) totalTokens_ = totalTokens_.value_or(0) + *r.tokens;
  if (r.computeTimeUs) timedReports_ = true;
  if (r.globalLoss && std::isfinite(*r.globalLoss)) noteGlobalLoss(r.step, *r.globalLoss, r.timeUnixUs);

  // Keyed by attempt too: a restarted job repeats step numbers, with another world size.
  StepAcc& acc = steps_[{r.attempt, r.step}];
  acc.worldSize = std::max<std::uint32_t>(r.worldSize, 1);
  ++acc.ranks;
  const bool timed = r.dataTimeUs && r.computeTimeUs && r.exposedCommTimeUs;
  acc.timed += timed;
  acc.dataUs += static_cast<double>(r.dataTimeUs.value_or(0));
  acc.computeUs += static_cast<double>(r.computeTimeUs.value_or(0));
  acc.exposedUs += static_cast<double>(r.exposedCommTimeUs.value_or(0));
  if (timed) {
    const auto exposed = static_cast<double>(*r.exposedCommTimeUs);
    acc.leastExposedUs = acc.timed == 1 ? exposed : std::min(acc.leastExposedUs, exposed);
    acc.mostExposedUs = std::max(acc.mostExposedUs, exposed);
    timedStepUs_ += static_cast<double>(r.stepTimeUs);
    timedExposedUs_ += exposed;
  }
  if (r.computeTimeUs && acc.ranks <= acc.worldSize) acc.computes.push_back(static_cast<double>(*r.computeTimeUs));
  if (std::isfinite(r.loss) && r.samples > 0) {
    acc.lossSum += static_cast<double>(r.loss) * r.samples;
    acc.lossSamples += r.samples;
  }
  acc.reportedGlobalLoss = acc.reportedGlobalLoss || r.globalLoss.has_value();
  acc.timeUs = std::max(acc.timeUs, r.timeUnixUs);
  if (acc.ranks == acc.worldSize) {
    // A program that does not all-reduce its loss: the global loss is the samples' mean over ranks.
    if (!acc.reportedGlobalLoss && acc.lossSamples > 0) {
      noteGlobalLoss(r.step, acc.lossSum / static_cast<double>(acc.lossSamples), acc.timeUs);
    }
    if (acc.timed == acc.ranks) {
      const double n = acc.ranks * 1e3;
      push(splits_, StepSplit{r.step, acc.dataUs / n, acc.computeUs / n, acc.exposedUs / n});
    }
    // Worked out once, when the step is complete: a snapshot then sums ratios, not sorts of every
    // rank's times, and the step keeps no per-rank state.
    const double med = median(acc.computes);
    if (med > 0 && acc.computes.size() == acc.ranks) {
      acc.imbalance = *std::max_element(acc.computes.begin(), acc.computes.end()) / med;
    }
    std::vector<double>().swap(acc.computes);
    // The last rank to arrive waited least in the collective; every other rank's exposed time
    // beyond that is waiting for it.
    if (acc.timed == acc.ranks && acc.ranks > 1) {
      acc.waitUs = acc.exposedUs - acc.ranks * acc.leastExposedUs;
      waitedUs_ += acc.waitUs;
    }
    // The imbalance the job started with (steps 2 to 11; the first one warms up), which a dynamic
    // split then works off.
    if (r.step >= 2 && initialSteps_ < kInitialSteps && acc.imbalance > 0) {
      initialImbalanceSum_ += acc.imbalance;
      ++initialSteps_;
    }
  }
  while (steps_.size() > kStepsKept) steps_.erase(steps_.begin());
}

void JobTracker::noteGlobalLoss(std::uint64_t step, double loss, std::int64_t timeUnixUs) {
  if (step <= lossStep_) return;
  lossStep_ = step;
  lastGlobalLoss_ = loss;
  smoothedLoss_ = smoothedLoss_ ? (1 - settings_.lossSmoothing) * *smoothedLoss_ + settings_.lossSmoothing * loss : loss;
  push(loss_, Point{static_cast<double>(step), loss});
  if (spec_.targetLoss && !convergedAtSeconds_ && *smoothedLoss_ <= *spec_.targetLoss) {
    convergedAtSeconds_ = secondsSinceStart(timeUnixUs);
  }
}

void JobTracker::add(const GpuSample& s) {
  if (s.jobId != spec_.jobId) return;
  GpuState& gpu = gpus_[{s.node, s.gpuIndex}];
  if (s.utilizationPct) {
    gpu.util = *s.utilizationPct;
    gpu.utilSum += *s.utilizationPct;
    ++gpu.utilCount;
    push(gpuSeries_[{s.node, s.gpuIndex}], Point{secondsSinceStart(s.timeUnixUs), *s.utilizationPct});
  }
  if (s.memoryUsedBytes) gpu.memory = static_cast<double>(*s.memoryUsedBytes);
  if (s.powerMilliwatts) gpu.power = *s.powerMilliwatts / 1000.0;
  if (s.temperatureC) gpu.temperature = *s.temperatureC;
  if (s.energyMillijoules) {
    // The counter only grows; a smaller value means it was reset: start a new segment.
    if (gpu.lastEnergy && *s.energyMillijoules >= *gpu.lastEnergy) {
      gpu.energyMillijoules += static_cast<double>(*s.energyMillijoules - *gpu.lastEnergy);
    }
    gpu.lastEnergy = *s.energyMillijoules;
  }
}

void JobTracker::add(const ProcessSample& s) {
  if (s.jobId != spec_.jobId) return;
  RankState& rank = ranks_[s.rank];
  if (s.cpuPct) {
    if (rank.lastProcessUs != 0 && s.timeUnixUs > rank.lastProcessUs) {
      rank.cpuSeconds += *s.cpuPct / 100.0 * static_cast<double>(s.timeUnixUs - rank.lastProcessUs) / 1e6;
    }
    rank.cpuPct = *s.cpuPct;
    push(cpuSeries_[s.rank], Point{secondsSinceStart(s.timeUnixUs), *s.cpuPct});
  }
  rank.lastProcessUs = s.timeUnixUs;
  if (s.rssBytes) rank.rssBytes = static_cast<double>(*s.rssBytes);
}

void JobTracker::add(const JobEvent& e, const std::string& node) {
  if (e.jobId != spec_.jobId) return;
  if (e.kind == JobEventKind::kStarted && (startUs_ == 0 || e.timeUnixUs < startUs_)) startUs_ = e.timeUnixUs;
  if (e.kind == JobEventKind::kFinished || e.kind == JobEventKind::kFailed || e.kind == JobEventKind::kStopped) {
    ended_ = true;
    endUs_ = std::max(endUs_, e.timeUnixUs);
  }
  // What each node's agent took its ranks' MFU against, as it last said (agent/src/stream/peaks.h).
  if (e.kind == JobEventKind::kPeak) peakBases_[node] = e.message;
}


}  // namespace lockstep::kpi
