// JobTracker::snapshot: the KPIs as of a moment, from what the tracker gathered (kpi.cpp). One
// function per part: the job's span, each rank's window, scaling, the complete steps (imbalance,
// the wait for the last rank), the slowest rank, the ETA, the GPUs and the cost.

#include <algorithm>
#include <cmath>

#include "collective_sums.h"
#include "flops.h"
#include "model_state.h"
#include "rank_window.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/median.h"

namespace lockstep::kpi {


// The ranks' window, summed over the ranks of the latest attempt.
struct JobTracker::RankTotals {
  double rate = 0, exposed = 0, step = 0, singleRate = 0;
  Maybe tokenRate;
  int ratesKnown = 0, singleKnown = 0;
  std::vector<double> busy, data, compute;  // per timed rank, its mean per step
  std::vector<std::uint32_t> rankIds;       // of those ranks
  double alg = 0, bus = 0, reduced = 0;
  int bandwidthKnown = 0, reducedKnown = 0;
  detail::ExposedEndsSums ends;  // every rank's spans
  std::vector<double> staleness;  // every rank's gradients' in the window
  detail::FlopsTotals flops;
};

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
  const Window w = window(k, nowUnixUs);
  RankTotals t;
  k.ranks.reserve(ranks_.size());
  for (const auto& [id, r] : ranks_) {
    if (r.attempt < latestAttempt_) continue;  // a rank of an attempt before the last restart
    k.step = std::max(k.step, r.step);
    k.ranks.push_back(rankKpis(id, r, w, t));
  }
  jobRates(k, t);
  completeSteps(k, w);
  if (initialSteps_ > 0) k.initialLoadImbalance = initialImbalanceSum_ / initialSteps_;
  slowestRank(k, t);
  k.lastGlobalLoss = lastGlobalLoss_;
  k.smoothedLoss = smoothedLoss_;
  k.timeToConvergenceSeconds = convergedAtSeconds_;
  eta(k, w);
  const std::size_t gpuCount = gpuFigures(k);
  missingReasons(k, gpuCount);
  costs(k, gpuCount);
  return k;
}

// The job's identity and span: elapsed to its end, and the window its rates are read over (an
// ended job's rates are those of its last steps: what its ranks did after their last report, an
// evaluation or leaving the process group, is in its elapsed time and cost, not its pace).
JobTracker::Window JobTracker::window(JobKpis& k, std::int64_t nowUnixUs) const {
  k.jobId = spec_.jobId;
  k.worldSize = worldSize_ > 0 ? worldSize_ : spec_.worldSize;
  k.attempts = attempts_;
  const std::int64_t end = ended_ && endUs_ > 0 ? std::min(nowUnixUs, std::max(endUs_, lastReportUs_)) : nowUnixUs;
  k.elapsedSeconds = startUs_ == 0 ? 0 : std::max(0.0, secondsSinceStart(end));
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
  return Window{now, windowUs, span};
}

// One rank over the window: samples and step times are in every report; the split only where
// the sender measured it. Adds the rank to the job's totals.
RankKpis JobTracker::rankKpis(std::uint32_t id, const RankState& r, const Window& w, RankTotals& t) const {
  RankKpis rk;
  rk.rank = id;
  rk.node = r.node;
  rk.attempt = r.attempt;
  rk.step = r.step;
  rk.epoch = r.epoch;
  if (std::isfinite(r.loss)) rk.loss = r.loss;
  rk.lossIsNan = std::isnan(r.loss);
  rk.cpuPct = r.cpuPct;
  rk.rssBytes = r.rssBytes;
  const detail::HeldReports held = r.window ? r.window->held(w.now - w.windowUs, w.now) : detail::HeldReports{};
  const detail::WindowSums& sums = held.sums;
  const double samples = sums.samples, st = sums.stepUs, d = sums.dataUs, c = sums.computeUs, e = sums.exposedUs;
  const double timedSamples = sums.timedSamples, timedSt = sums.timedStepUs;
  const int n = sums.reports, timed = sums.timed;
  const detail::CollectiveSums& collectives = sums.collectives;
  detail::ModelState state(held);
  const detail::RankFlops flops(held);
  t.ends.merge(sums.ends);
  // Over the window, or since the rank's first step began when that is later: a program's
  // start-up (imports, rendezvous) is not part of its training rate; a gap later on, or a
  // restart, is.
  const double rankSpan = std::clamp(static_cast<double>(w.now - r.firstStepStartUs) / 1e6, 1e-6, std::max(w.span, 1e-6));
  if (n > 0 && w.span > 0) {
    rk.samplesPerSecond = samples / rankSpan;
    if (sums.withTokens > 0) rk.tokensPerSecond = static_cast<double>(sums.tokens) / rankSpan;
    rk.meanStepUs = st / n;
    rk.samplesPerStep = samples / n;
    t.rate += *rk.samplesPerSecond;
    if (rk.tokensPerSecond) t.tokenRate = t.tokenRate.value_or(0) + *rk.tokensPerSecond;
    ++t.ratesKnown;
  }
  if (timed > 0 && w.span > 0) {
    rk.meanDataUs = d / timed;
    rk.meanComputeUs = c / timed;
    rk.meanExposedUs = e / timed;
    if (timedSt > 0) rk.commOverhead = e / timedSt;
    t.exposed += e;
    t.step += timedSt;
    if (d + c > 0) {
      t.singleRate += timedSamples / ((d + c) / 1e6);
      ++t.singleKnown;
    }
    t.busy.push_back((d + c) / timed);
    t.data.push_back(d / timed);
    t.compute.push_back(c / timed);
    t.rankIds.push_back(id);
  }
  if (sums.countedReports > 0) {
    t.reduced += static_cast<double>(sums.countedBytes) / sums.countedReports;
    ++t.reducedKnown;
  }
  rk.collectives = collectives.kpis(n, st);
  allReduceBandwidth(rk, collectives, t);
  state.finish(rk, t.staleness);
  if (n > 0 && w.span > 0) flops.finish(rk, rankSpan, t.flops);
  return rk;
}

// A rank's all-reduce bandwidth, the same rule as every kind's (lockstep/protocol/collectives.h).
void JobTracker::allReduceBandwidth(RankKpis& rk, const detail::CollectiveSums& sums, RankTotals& t) const {
  rk.algBandwidth = sums.algBandwidth(CollectiveKind::kAllReduce);
  for (const auto& c : rk.collectives) {
    if (c.kind == CollectiveKind::kAllReduce) rk.busBandwidth = c.busBandwidth;
  }
  if (!rk.algBandwidth || !rk.busBandwidth) return;
  t.alg += *rk.algBandwidth;
  t.bus += *rk.busBandwidth;
  ++t.bandwidthKnown;
}

// The job's rates from its ranks': throughput, communication, bandwidth and scaling efficiency.
void JobTracker::jobRates(JobKpis& k, const RankTotals& t) const {
  if (t.reducedKnown > 0) k.bytesReducedPerStep = t.reduced / t.reducedKnown;
  meanRankStep(k);
  if (t.bandwidthKnown > 0) {
    k.algBandwidth = t.alg / t.bandwidthKnown;
    k.busBandwidth = t.bus / t.bandwidthKnown;
  }
  k.collectives = detail::meanOverRanks(k.ranks);
  detail::jobModelState(k, t.staleness);
  detail::jobFlops(k, t.flops);
  peakBasis(k);
  k.exposedEnds = t.ends.ends();
  if (t.ratesKnown > 0) k.samplesPerSecond = t.rate;
  k.tokensPerSecond = t.tokenRate;
  k.totalSamples = totalSamples_;
  k.totalTokens = totalTokens_;
  if (lastReportUs_ != 0 && k.elapsedSeconds > 0) k.meanSamplesPerSecond = static_cast<double>(totalSamples_) / k.elapsedSeconds;
  if (t.step > 0) k.commOverhead = t.exposed / t.step;
  if (!k.samplesPerSecond) return;
  if (settings_.calibratedSingleRankSamplesPerSecond && *settings_.calibratedSingleRankSamplesPerSecond > 0) {
    k.scalingEfficiency = *k.samplesPerSecond / (t.ratesKnown * *settings_.calibratedSingleRankSamplesPerSecond);
    k.scalingBasis = ScalingBasis::kCalibrated;
  } else if (t.singleKnown > 0) {
    // One rank alone would run at its compute-only pace: samples / (data + compute) time.
    const double single = t.singleRate / t.singleKnown;
    k.scalingEfficiency = *k.samplesPerSecond / (t.ratesKnown * single);
    k.scalingBasis = ScalingBasis::kEstimatedFromCompute;
  }
}

// The nodes' peaks in words: each different one once, the first kMaxPeakBases of them, then a count.
void JobTracker::peakBasis(JobKpis& k) const {
  std::vector<std::string> said;
  for (const auto& [node, message] : peakBases_) {
    if (std::find(said.begin(), said.end(), message) == said.end()) said.push_back(message);
  }
  for (std::size_t i = 0; i < std::min(said.size(), kMaxPeakBases); ++i) {
    k.peakBasis += (i == 0 ? "" : "; ") + said[i];
  }
  if (said.size() > kMaxPeakBases) k.peakBasis += "; and " + std::to_string(said.size() - kMaxPeakBases) + " more";
}

// Load imbalance and the wait for the last rank, over the window's complete steps.
void JobTracker::completeSteps(JobKpis& k, const Window& w) const {
  double ratioSum = 0, waitSum = 0, waitExposedSum = 0, skewSum = 0;
  int ratioCount = 0, waitCount = 0;
  for (const auto& [key, acc] : steps_) {
    if (!w.holds(acc.timeUs)) continue;
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
}

// The slowest ranks, and what makes the slowest one slow.
void JobTracker::slowestRank(JobKpis& k, const RankTotals& t) const {
  if (t.busy.empty()) return;
  k.slowestRanks = slowest(t.busy, t.data, t.compute, t.rankIds, k.ranks);
  const std::size_t slow = static_cast<std::size_t>(std::max_element(t.busy.begin(), t.busy.end()) - t.busy.begin());
  k.slowestRank = t.rankIds[slow];
  const double excessData = t.data[slow] - median(t.data);
  const double excessCompute = t.compute[slow] - median(t.compute);
  std::vector<double> steps;
  for (const auto& rk : k.ranks) {
    if (rk.meanStepUs) steps.push_back(*rk.meanStepUs);
  }
  if (std::max(excessData, excessCompute) > 0.05 * median(steps)) {
    k.slowestCause = excessData > excessCompute ? SlowCause::kDataWait : SlowCause::kCompute;
  } else {
    // Balanced ranks: what holds the step back is communication when it dominates, else compute.
    k.slowestCause = k.commOverhead && *k.commOverhead > 0.25 ? SlowCause::kCommunication : SlowCause::kCompute;
  }
}

// The time left, from the newest rank's pace over the window.
void JobTracker::eta(JobKpis& k, const Window& w) const {
  if (k.totalSteps == 0) return;
  if (k.step >= k.totalSteps) {
    k.etaSeconds = 0.0;
    return;
  }
  for (const auto& [id, r] : ranks_) {
    if (r.step != k.step || !r.window) continue;
    const detail::HeldReports in = r.window->held(w.now - w.windowUs, w.now);
    if (in.sums.reports >= 2) {
      const double seconds = static_cast<double>(in.newest->timeUnixUs - in.oldest->timeUnixUs) / 1e6;
      const double steps = static_cast<double>(in.newest->step - in.oldest->step);
      if (seconds > 0 && steps > 0) k.etaSeconds = static_cast<double>(k.totalSteps - k.step) * seconds / steps;
      return;
    }
  }
}

// Each GPU's figures, the job's utilization, energy and GPU-hours, and its ranks' CPU time.
// Returns how many GPUs the job holds (its placements, the GPUs that reported, its allocation).
std::size_t JobTracker::gpuFigures(JobKpis& k) const {
  double utilMeanSum = 0, energyMj = 0;
  int utilKnown = 0;
  bool energyKnown = false;
  k.gpus.reserve(gpus_.size());
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
  return gpuCount;
}

// What could not be measured, in words.
void JobTracker::missingReasons(JobKpis& k, std::size_t gpuCount) const {
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
}

// The cost counts what was measured; a priced quantity that was not is named, not guessed.
void JobTracker::costs(JobKpis& k, std::size_t gpuCount) const {
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
