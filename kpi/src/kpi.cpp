#include "lockstep/kpi/kpi.h"

#include <algorithm>
#include <cmath>

#include "lockstep/protocol/names.h"

namespace lockstep::kpi {
namespace {

constexpr std::size_t kStepsKept = 2000;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

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

double JobTracker::secondsSinceStart(std::int64_t unixUs) const {
  return startUs_ == 0 ? 0.0 : static_cast<double>(unixUs - startUs_) / 1e6;
}

template <class T>
void JobTracker::push(std::deque<T>& series, T value) const {
  series.push_back(value);
  while (series.size() > settings_.seriesCapacity) series.pop_front();
}

void JobTracker::trimWindow(RankState& rank, std::int64_t nowUs) const {
  const auto windowUs = static_cast<std::int64_t>(settings_.windowSeconds * 1e6);
  while (!rank.window.empty() && rank.window.front().timeUnixUs <= nowUs - windowUs) rank.window.pop_front();
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
  if (restarted) {
    rank.window.clear();
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
  rank.window.push_back(r);
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

void JobTracker::add(const JobEvent& e) {
  if (e.jobId != spec_.jobId) return;
  if (e.kind == JobEventKind::kStarted && (startUs_ == 0 || e.timeUnixUs < startUs_)) startUs_ = e.timeUnixUs;
  if (e.kind == JobEventKind::kFinished || e.kind == JobEventKind::kFailed || e.kind == JobEventKind::kStopped) {
    ended_ = true;
    endUs_ = std::max(endUs_, e.timeUnixUs);
  }
}

namespace {

// The ranks with the most data + compute time per step (busy), slowest first, against the median.
std::vector<SlowRank> slowest(const std::vector<double>& busy, const std::vector<double>& data,
                              const std::vector<double>& compute, const std::vector<std::uint32_t>& rankIds,
                              const std::vector<RankKpis>& ranks) {
  std::vector<std::size_t> order(busy.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const std::size_t n = std::min(kSlowestRanks, order.size());
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                    [&](std::size_t a, std::size_t b) { return busy[a] > busy[b] || (busy[a] == busy[b] && rankIds[a] < rankIds[b]); });
  const double medBusy = median(busy), medData = median(data), medCompute = median(compute);
  std::vector<SlowRank> out;
  for (std::size_t j = 0; j < n; ++j) {
    const std::size_t i = order[j];
    SlowRank s{rankIds[i], {}, medBusy > 0 ? busy[i] / medBusy - 1 : 0,
               data[i] - medData > compute[i] - medCompute ? SlowCause::kDataWait : SlowCause::kCompute};
    for (const auto& r : ranks) {
      if (r.rank == s.rank) s.node = r.node;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The mean rank's step, over the ranks whose window has its split.
void meanRankStep(JobKpis& k) {
  double samples = 0, busy = 0, exposed = 0, step = 0;
  int n = 0;
  for (const auto& r : k.ranks) {
    if (!r.meanDataUs || !r.meanComputeUs || !r.meanExposedUs || !r.meanStepUs || !r.samplesPerStep) continue;
    samples += *r.samplesPerStep;
    busy += *r.meanDataUs + *r.meanComputeUs;
    exposed += *r.meanExposedUs;
    step += *r.meanStepUs;
    ++n;
  }
  if (n == 0) return;
  k.samplesPerRankStep = samples / n;
  k.meanBusyUs = busy / n;
  k.meanExposedUs = exposed / n;
  k.meanStepUs = step / n;
}

}  // namespace

JobKpis JobTracker::snapshot(std::int64_t nowUnixUs) const {
  JobKpis k;
  k.jobId = spec_.jobId;
  k.worldSize = worldSize_ > 0 ? worldSize_ : spec_.worldSize;
  k.attempts = attempts_;
  const std::int64_t end = ended_ && endUs_ > 0 ? std::min(nowUnixUs, std::max(endUs_, lastReportUs_)) : nowUnixUs;
  k.elapsedSeconds = startUs_ == 0 ? 0 : std::max(0.0, secondsSinceStart(end));
  // An ended job's rates are those of its last steps: what its ranks did after their last report
  // (an evaluation, leaving the process group) is in its elapsed time and cost, not its pace.
  const std::int64_t now = ended_ && lastReportUs_ > 0 ? std::min(end, lastReportUs_) : end;
  if (spec_.steps > 0) {
    k.totalSteps = spec_.steps;
  } else if (spec_.isCommand()) {
    // Only the program knows how long it runs.
  } else if (const auto* syn = std::get_if<SyntheticDataset>(&spec_.dataset); syn && spec_.globalBatch() > 0) {
    k.totalSteps = std::uint64_t{spec_.epochs} * ((syn->samples + spec_.globalBatch() - 1) / spec_.globalBatch());
  }
  const auto windowUs = static_cast<std::int64_t>(settings_.windowSeconds * 1e6);
  const double span = std::min(settings_.windowSeconds, startUs_ == 0 ? 0.0 : std::max(0.0, secondsSinceStart(now)));

  double totalRate = 0, exposedSum = 0, stepSum = 0, singleRateSum = 0;
  Maybe totalTokenRate;
  int ratesKnown = 0, singleKnown = 0;
  std::vector<double> busy, data, compute;
  std::vector<std::uint32_t> rankIds;
  double algSum = 0, busSum = 0, reducedSum = 0;
  int bandwidthKnown = 0, reducedKnown = 0;
  for (const auto& [id, r] : ranks_) {
    if (r.attempt < latestAttempt_) continue;  // a rank of an attempt before the last restart
    RankKpis rk;
    rk.rank = id;
    rk.node = r.node;
    rk.attempt = r.attempt;
    rk.step = r.step;
    rk.epoch = r.epoch;
    if (std::isfinite(r.loss)) rk.loss = r.loss;
    rk.cpuPct = r.cpuPct;
    rk.rssBytes = r.rssBytes;
    // Samples and step times are in every report; the split only where the sender measured it.
    double samples = 0, tokens = 0, st = 0, d = 0, c = 0, e = 0, timedSamples = 0, timedSt = 0;
    double reducedBytes = 0, reduceUs = 0;
    int reducedReports = 0;
    std::uint32_t world = 1;
    int n = 0, timed = 0;
    bool tokensKnown = false;
    for (const auto& rep : r.window) {
      if (rep.timeUnixUs <= now - windowUs || rep.timeUnixUs > now) continue;
      samples += rep.samples;
      st += static_cast<double>(rep.stepTimeUs);
      ++n;
      if (rep.tokens) {
        tokens += static_cast<double>(*rep.tokens);
        tokensKnown = true;
      }
      if (rep.bytesReduced && rep.allreduceTimeUs && *rep.allreduceTimeUs > 0) {
        reducedBytes += static_cast<double>(*rep.bytesReduced);
        reduceUs += static_cast<double>(*rep.allreduceTimeUs);
        ++reducedReports;
        world = rep.worldSize;
      }
      if (rep.dataTimeUs && rep.computeTimeUs && rep.exposedCommTimeUs) {
        d += static_cast<double>(*rep.dataTimeUs);
        c += static_cast<double>(*rep.computeTimeUs);
        e += static_cast<double>(*rep.exposedCommTimeUs);
        timedSamples += rep.samples;
        timedSt += static_cast<double>(rep.stepTimeUs);
        ++timed;
      }
    }
    k.step = std::max(k.step, r.step);
    // Over the window, or since the rank's first step began when that is later: a program's
    // start-up (imports, rendezvous) is not part of its training rate; a gap later on, or a
    // restart, is.
    const double rankSpan = std::clamp(static_cast<double>(now - r.firstStepStartUs) / 1e6, 1e-6, std::max(span, 1e-6));
    if (n > 0 && span > 0) {
      rk.samplesPerSecond = samples / rankSpan;
      if (tokensKnown) rk.tokensPerSecond = tokens / rankSpan;
      rk.meanStepUs = st / n;
      rk.samplesPerStep = samples / n;
      totalRate += *rk.samplesPerSecond;
      if (rk.tokensPerSecond) totalTokenRate = totalTokenRate.value_or(0) + *rk.tokensPerSecond;
      ++ratesKnown;
    }
    if (timed > 0 && span > 0) {
      rk.meanDataUs = d / timed;
      rk.meanComputeUs = c / timed;
      rk.meanExposedUs = e / timed;
      if (timedSt > 0) rk.commOverhead = e / timedSt;
      exposedSum += e;
      stepSum += timedSt;
      if (d + c > 0) {
        singleRateSum += timedSamples / ((d + c) / 1e6);
        ++singleKnown;
      }
      busy.push_back((d + c) / timed);
      data.push_back(d / timed);
      compute.push_back(c / timed);
      rankIds.push_back(id);
    }
    if (reducedReports > 0) {
      reducedSum += reducedBytes / reducedReports;
      ++reducedKnown;
    }
    if (reduceUs > 0 && world > 1) {
      rk.algBandwidth = reducedBytes / (reduceUs / 1e6);
      rk.busBandwidth = *rk.algBandwidth * busBandwidthFactor(world);
      algSum += *rk.algBandwidth;
      busSum += *rk.busBandwidth;
      ++bandwidthKnown;
    }
    k.ranks.push_back(rk);
  }
  if (reducedKnown > 0) k.bytesReducedPerStep = reducedSum / reducedKnown;
  meanRankStep(k);
  if (bandwidthKnown > 0) {
    k.algBandwidth = algSum / bandwidthKnown;
    k.busBandwidth = busSum / bandwidthKnown;
  }
  if (ratesKnown > 0) k.samplesPerSecond = totalRate;
  k.tokensPerSecond = totalTokenRate;
  k.totalSamples = totalSamples_;
  k.totalTokens = totalTokens_;
  if (lastReportUs_ != 0 && k.elapsedSeconds > 0) k.meanSamplesPerSecond = static_cast<double>(totalSamples_) / k.elapsedSeconds;
  if (stepSum > 0) k.commOverhead = exposedSum / stepSum;
  if (k.samplesPerSecond) {
    if (settings_.calibratedSingleRankSamplesPerSecond && *settings_.calibratedSingleRankSamplesPerSecond > 0) {
      k.scalingEfficiency = *k.samplesPerSecond / (ratesKnown * *settings_.calibratedSingleRankSamplesPerSecond);
      k.scalingBasis = ScalingBasis::kCalibrated;
    } else if (singleKnown > 0) {
      // One rank alone would run at its compute-only pace: samples / (data + compute) time.
      const double single = singleRateSum / singleKnown;
      k.scalingEfficiency = *k.samplesPerSecond / (ratesKnown * single);
      k.scalingBasis = ScalingBasis::kEstimatedFromCompute;
    }
  }

  // Load imbalance and the wait for the last rank: complete steps in the window.
  double ratioSum = 0, waitSum = 0, waitExposedSum = 0, skewSum = 0;
  int ratioCount = 0, waitCount = 0;
  for (const auto& [key, acc] : steps_) {
    if (acc.timeUs <= now - windowUs || acc.timeUs > now) continue;
    if (acc.imbalance > 0) {
      ratioSum += acc.imbalance;
      ++ratioCount;
    }
    if (acc.waitUs >= 0) {
      waitSum += acc.waitUs;
      waitExposedSum += acc.exposedUs;
      skewSum += acc.mostExposedUs - acc.leastExposedUs;
      ++waitCount;
    }
  }
  if (ratioCount > 0) k.loadImbalance = ratioSum / ratioCount;
  if (waitCount > 0) {
    k.arrivalSkewUs = skewSum / waitCount;
    if (waitExposedSum > 0) k.stragglerWaitShare = waitSum / waitExposedSum;
  }
  if (initialSteps_ > 0) k.initialLoadImbalance = initialImbalanceSum_ / initialSteps_;
  if (!busy.empty()) {
    k.slowestRanks = slowest(busy, data, compute, rankIds, k.ranks);
    const std::size_t slow = static_cast<std::size_t>(std::max_element(busy.begin(), busy.end()) - busy.begin());
    k.slowestRank = rankIds[slow];
    const double excessData = data[slow] - median(data);
    const double excessCompute = compute[slow] - median(compute);
    double medianStep = 0;
    {
      std::vector<double> steps;
      for (const auto& rk : k.ranks) {
        if (rk.meanStepUs) steps.push_back(*rk.meanStepUs);
      }
      medianStep = median(steps);
    }
    if (std::max(excessData, excessCompute) > 0.05 * medianStep) {
      k.slowestCause = excessData > excessCompute ? SlowCause::kDataWait : SlowCause::kCompute;
    } else {
      // Balanced ranks: what holds the step back is communication when it dominates, else compute.
      k.slowestCause = k.commOverhead && *k.commOverhead > 0.25 ? SlowCause::kCommunication : SlowCause::kCompute;
    }
  }

  k.lastGlobalLoss = lastGlobalLoss_;
  k.smoothedLoss = smoothedLoss_;
  k.timeToConvergenceSeconds = convergedAtSeconds_;

  // ETA from the newest rank's pace over the window.
  if (k.totalSteps > 0 && k.step < k.totalSteps) {
    for (const auto& [id, r] : ranks_) {
      std::vector<const StepReport*> in;
      for (const auto& rep : r.window) {
        if (rep.timeUnixUs > now - windowUs && rep.timeUnixUs <= now) in.push_back(&rep);
      }
      if (in.size() >= 2 && r.step == k.step) {
        const double seconds = static_cast<double>(in.back()->timeUnixUs - in.front()->timeUnixUs) / 1e6;
        const double steps = static_cast<double>(in.back()->step - in.front()->step);
        if (seconds > 0 && steps > 0) k.etaSeconds = static_cast<double>(k.totalSteps - k.step) * seconds / steps;
        break;
      }
    }
  } else if (k.totalSteps > 0) {
    k.etaSeconds = 0.0;
  }

  // GPUs, energy, cost.
  double utilMeanSum = 0, energyMj = 0;
  int utilKnown = 0;
  bool energyKnown = false;
  for (const auto& [key, g] : gpus_) {
    GpuKpis gk{key.first, key.second, g.util, {}, g.memory, g.power, g.temperature, {}};
    if (g.utilCount > 0) {
      gk.meanUtilizationPct = g.utilSum / static_cast<double>(g.utilCount);
      utilMeanSum += *gk.meanUtilizationPct;
      ++utilKnown;
    }
    if (g.lastEnergy) {
      gk.energyKwh = g.energyMillijoules / 3.6e9;
      energyMj += g.energyMillijoules;
      energyKnown = true;
    }
    k.gpus.push_back(gk);
  }
  if (utilKnown > 0) k.gpuUtilizationPct = utilMeanSum / utilKnown;
  if (energyKnown) k.energyKwh = energyMj / 3.6e9;
  std::size_t gpuCount = 0;
  for (const auto& p : spec_.ranks) gpuCount += p.gpuIndex.has_value();
  gpuCount = std::max({gpuCount, gpus_.size(), std::size_t{spec_.allocatedGpus}});
  k.gpuHours = static_cast<double>(gpuCount) * k.elapsedSeconds / 3600.0;
  bool cpuKnown = false;
  double cpuSeconds = 0;
  for (const auto& [id, r] : ranks_) {
    if (r.lastProcessUs != 0) {
      cpuKnown = true;
      cpuSeconds += r.cpuSeconds;
    }
  }
  if (cpuKnown) k.coreHours = cpuSeconds / 3600.0;
  if (spec_.isCommand() && lastReportUs_ == 0) {
    k.noStepsReason = "this program reports no steps: add lockstep.step(...) (docs/own-program.md)";
    k.missing.push_back("throughput, communication, load imbalance, loss and scaling efficiency (" + k.noStepsReason + ")");
  } else if (lastReportUs_ != 0 && !timedReports_) {
    k.noTimingsReason = "its steps carry no data, compute or communication times: add lockstep.watch(model)";
    k.missing.push_back("communication overhead and load imbalance (" + k.noTimingsReason + ")");
  }
  if (!k.gpuUtilizationPct && gpuCount > 0) k.missing.push_back("GPU utilization (no NVML samples for the job's GPUs)");
  if (!k.energyKwh) k.missing.push_back("energy (no NVML energy counter readings)");
  if (!k.coreHours) k.missing.push_back("CPU time (no process samples)");
  if (spec_.targetLoss && !k.timeToConvergenceSeconds) {
    k.missing.push_back("time to convergence (the smoothed loss has not reached the target yet)");
  }
  // The cost counts what was measured; a priced quantity that was not is named, not guessed.
  const Prices& p = spec_.prices;
  double cost = *k.gpuHours * p.gpuHour;
  if (k.coreHours) {
    cost += *k.coreHours * p.coreHour;
  } else if (p.coreHour > 0) {
    k.costComplete = false;
  }
  if (k.energyKwh) {
    cost += *k.energyKwh * p.kwh;
  } else if (p.kwh > 0) {
    k.costComplete = false;
  }
  k.costSoFar = cost;
  waitingCosts(k, gpuCount > 0);
  if (k.totalSteps > 0 && k.step > 0) k.costProjected = cost * static_cast<double>(k.totalSteps) / static_cast<double>(k.step);
  return k;
}

void JobTracker::waitingCosts(JobKpis& k, bool gpus) const {
  if (timedStepUs_ <= 0) return;
  k.waitingShare = timedExposedUs_ / timedStepUs_;
  k.stragglerShare = waitedUs_ / timedStepUs_;
  k.waitingCost = *k.costSoFar * *k.waitingShare;
  k.stragglerCost = *k.costSoFar * *k.stragglerShare;
  if (gpus) {
    k.waitingGpuHours = *k.gpuHours * *k.waitingShare;
    k.stragglerGpuHours = *k.gpuHours * *k.stragglerShare;
  }
}

}  // namespace lockstep::kpi
