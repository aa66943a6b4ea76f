#include "lockstep/kpi/projection.h"

#include <algorithm>

#include "lockstep/protocol/collectives.h"

namespace lockstep::kpi {
namespace {

// The cores a rank can use at m ranks on a shared node: its threads, at most its share of the
// cores (with the trainer's default of cores / ranks threads, always that share).
double coresPerRank(const ScalingInputs& in, std::uint32_t m) {
  const double share = (in.nodeCores > 0 ? in.nodeCores : 1.0) / m;
  return in.nodeCores > 0 && in.threadsPerRank > 0 ? std::min<double>(in.threadsPerRank, share) : share;
}

// What a rank has of a shared node at m ranks against the measured n; its compute, its all-reduce
// and their overlap all take the inverse of that the time. All of its own: 1.
double shareAt(const ScalingInputs& in, std::uint32_t m) {
  return in.sharedNode ? coresPerRank(in, m) / coresPerRank(in, in.ranks) : 1.0;
}

// A ring all-reduce's time among m ranks: bytes x 2(m-1)/m / bus bandwidth. On a shared node
// every link of the ring is the node's own cores and memory, so its bandwidth is shared too.
double allreduceUs(const ScalingInputs& in, std::uint32_t m) {
  return *in.bytesPerStep * busFactor(CollectiveKind::kAllReduce, m) / (*in.busBandwidth * shareAt(in, m)) * 1e6;
}

// A rank's step beside its exposed communication at m ranks: its own where it has its own device;
// on a shared node the node's compute is split m ways instead of the measured n.
double workAt(const ScalingInputs& in, std::uint32_t m) { return (in.busyUs + in.otherUs) / shareAt(in, m); }

double aloneAt(const ScalingInputs& in) { return in.aloneUs ? *in.aloneUs : workAt(in, 1); }

}  // namespace

bool sharesOneNode(const JobSpec& spec) {
  if (spec.backend != Backend::kCpu || spec.ranks.empty()) return false;
  return std::all_of(spec.ranks.begin(), spec.ranks.end(), [&](const RankPlacement& r) { return r.node == spec.ranks.front().node; });
}

std::optional<ScalingInputs> scalingInputs(const JobKpis& k, const JobSpec& spec, std::uint32_t nodeCores) {
  if (!k.samplesPerRankStep || !k.meanBusyUs || !k.meanExposedUs || !k.meanStepUs || *k.samplesPerRankStep <= 0) {
    return std::nullopt;
  }
  ScalingInputs in;
  in.ranks = std::max<std::uint32_t>(k.worldSize, 1);
  in.samplesPerRankStep = *k.samplesPerRankStep;
  in.busyUs = *k.meanBusyUs;
  in.exposedUs = *k.meanExposedUs;
  in.otherUs = std::max(0.0, *k.meanStepUs - *k.meanBusyUs - *k.meanExposedUs);
  in.bytesPerStep = k.bytesReducedPerStep;
  in.busBandwidth = k.busBandwidth;
  in.sharedNode = sharesOneNode(spec);
  in.nodeCores = nodeCores;
  if (k.costSoFar && k.elapsedSeconds > 0) in.costPerRankSecond = *k.costSoFar / (k.elapsedSeconds * in.ranks);
  if (k.totalSteps > 0 && spec.globalBatch() > 0) {
    in.jobSamples = static_cast<double>(k.totalSteps) * static_cast<double>(spec.globalBatch());
  } else if (k.totalSamples > 0) {
    in.jobSamples = static_cast<double>(k.totalSamples);
  }
  return in;
}

ScalingInputs withStepOf(ScalingInputs many, const ScalingInputs& one) {
  many.aloneUs = one.busyUs + one.otherUs + one.exposedUs;
  return many;
}

std::vector<std::uint32_t> projectionRanks(std::uint32_t measured) {
  std::vector<std::uint32_t> out;
  if (measured >= 2) out.push_back(measured / 2);
  for (const std::uint32_t times : {1u, 2u, 4u, 8u}) out.push_back(measured * times);
  return out;
}

std::vector<Projected> project(const ScalingInputs& in, const std::vector<std::uint32_t>& ranks) {
  const bool comm = in.bytesPerStep && in.busBandwidth && *in.busBandwidth > 0 && in.ranks > 1;
  // The all-reduce time that hid behind compute at the measured rank count hides at any other
  // (on a shared node it stretches with the compute it hid behind); exposed time beyond the
  // all-reduce's whole time (a wait for the last rank, a per-step latency) stays as it was.
  // Without a timed all-reduce there is nothing to split: both are 0.
  const double measuredUs = comm ? allreduceUs(in, in.ranks) : in.exposedUs;
  const double hiddenUs = std::max(0.0, measuredUs - in.exposedUs);
  const double fixedUs = std::max(0.0, in.exposedUs - measuredUs);
  const double aloneUs = aloneAt(in);
  std::vector<Projected> out;
  for (const std::uint32_t m : ranks) {
    if (m == 0 || (m > 1 && !comm) || in.ranks == 0) continue;
    Projected p;
    p.ranks = m;
    p.exposedUs = m > 1 ? std::max(0.0, allreduceUs(in, m) - hiddenUs / shareAt(in, m)) + fixedUs : 0;
    p.stepUs = m == 1 ? aloneUs : workAt(in, m) + p.exposedUs;
    if (p.stepUs <= 0) continue;
    p.samplesPerSecond = m * in.samplesPerRankStep / (p.stepUs / 1e6);
    p.efficiency = aloneUs / p.stepUs;
    if (in.costPerRankSecond && in.jobSamples) p.costPerJob = *in.jobSamples / p.samplesPerSecond * m * *in.costPerRankSecond;
    out.push_back(p);
  }
  return out;
}

}  // namespace lockstep::kpi
