#include "lockstep/report/diagnosis.h"

#include <cmath>

#include "lockstep/present/present.h"

namespace lockstep::report {
namespace {

std::string ms(double us) { return present::number(us / 1e3, us < 10e3 ? 2 : 1) + " ms"; }

std::string percentOf(double fraction) { return present::number(fraction * 100, 0) + "%"; }

// What a job can change to hide more of its all-reduce behind compute.
std::string hideAdvice(const JobSpec& spec) {
  if (spec.isCommand()) return "a larger per-rank batch would give compute more time to hide it behind";
  return "a larger per-rank batch (now " + std::to_string(spec.batchPerRank) +
         ") would give compute more time to hide it behind";
}

// For a DDP program, the model's bucket_cap_mb where it expects one to help.
std::string bucketText(const JobSpec& spec, const kpi::JobKpis& k) {
  if (spec.isCommand()) {
    const auto advice = ddpBucketAdvice(k);
    if (!advice) return "larger buckets (DDP's bucket_cap_mb)";
    return "DDP(bucket_cap_mb=" + present::number(advice->capMb, advice->capMb < 1 ? 2 : 0) +
           ") (the step model lockstep-trainer chooses its buckets with expects about " + ms(advice->expectedExposedUs) +
           " exposed a step instead of " + ms(advice->currentExposedUs) + ", from DDP's default 25 MB)";
  }
  return "a larger bucket (now " + present::number(spec.bucketMb, spec.bucketMb < 1 ? 3 : 0) + " MB, --bucket-mb)";
}

std::string slowestText(const kpi::JobKpis& k) {
  if (!k.slowestRank) return "the slowest rank";
  std::string text = "rank " + std::to_string(*k.slowestRank);
  for (const auto& s : k.slowestRanks) {
    if (s.rank == *k.slowestRank && !s.node.empty()) text += " on " + s.node;
  }
  return text + " (" + std::string(kpi::slowCauseName(k.slowestCause)) + ")";
}

CommDiagnosis straggler(const kpi::JobKpis& k, const std::string& lead) {
  std::string advice = lead + "; " + percentOf(*k.stragglerWaitShare) +
                       " of it is ranks waiting in the all-reduce for the last one to arrive";
  if (k.arrivalSkewUs) advice += " (arrival skew " + ms(*k.arrivalSkewUs) + " per step)";
  advice += ". The slowest is " + slowestText(k) +
            ": speed it up, or let it take fewer samples (--balance dynamic); the network is not what holds the step.";
  return {CommBound::kStraggler, std::move(advice)};
}

}  // namespace

std::string_view commBoundName(CommBound bound) {
  switch (bound) {
    case CommBound::kStraggler: return "waiting on a straggler";
    case CommBound::kBandwidth: return "bandwidth-bound";
    case CommBound::kLatency: return "latency-bound";
    case CommBound::kUndetermined: break;
  }
  return "undetermined";
}

kpi::Maybe meanReductionBytes(const kpi::JobKpis& k, const JobSpec& spec) {
  if (!k.bytesReducedPerStep || *k.bytesReducedPerStep <= 0) return {};
  if (spec.isCommand()) return k.bytesReducedPerStep;
  if (spec.bucketMb <= 0) return {};  // chosen by the trainer: its sizes are in its note, not here
  const double buckets = std::ceil(*k.bytesReducedPerStep / (spec.bucketMb * 1024 * 1024));
  return *k.bytesReducedPerStep / std::max(1.0, buckets);
}

std::optional<CommDiagnosis> diagnoseCommunication(const kpi::JobKpis& k, const JobSpec& spec,
                                                   const std::optional<BandwidthReference>& reference) {
  if (!k.commOverhead || *k.commOverhead <= kHighCommShare) return std::nullopt;
  // With a decimal where rounding would make it read as the threshold itself ("15.0%" for 0.1504).
  const double pct = *k.commOverhead * 100;
  const int decimals = std::round(pct) == std::round(kHighCommShare * 100) ? 1 : 0;
  const std::string lead = "Exposed communication is " + present::number(pct, decimals) + "% of step time";
  if (k.stragglerWaitShare && *k.stragglerWaitShare >= kStragglerWaitShare) return straggler(k, lead);

  const kpi::Maybe reduction = meanReductionBytes(k, spec);
  const bool small = reduction && *reduction < kSmallReductionBytes;
  const std::string bus = k.busBandwidth ? "a bus bandwidth of " + present::bandwidth(k.busBandwidth) : "";
  std::string against;
  kpi::Maybe ratio;
  if (reference && reference->bytesPerSecond > 0 && k.busBandwidth) {
    ratio = *k.busBandwidth / reference->bytesPerSecond;
    against = ", " + percentOf(*ratio) + " of " + reference->what;
  }
  const std::string sizes = reduction ? "all-reduces of " + present::bytes(*reduction) : "";
  if (ratio && *ratio >= kNearReference) {
    return CommDiagnosis{CommBound::kBandwidth,
                         lead + " at " + bus + against + ": the link is the limit. Fewer bytes (bf16 gradients) " +
                             "or a faster link would shorten it; " + hideAdvice(spec) + "."};
  }
  if (small) {
    return CommDiagnosis{CommBound::kLatency,
                         lead + ", in " + sizes + (bus.empty() ? "" : " at " + bus + against) +
                             ": so small a message costs its latency more than its bytes. " + bucketText(spec, {}) +
                             " would send fewer, larger ones."};
  }
  std::string figures = bus.empty() ? "" : " at " + bus + against;
  if (!sizes.empty()) figures += (figures.empty() ? " in " : ", in ") + sizes;
  const std::string unknown = ratio ? "" : bus.empty() ? " (no timed reductions to measure a bandwidth from)"
                                                       : " (no link speed or earlier peak on these nodes to hold it against)";
  const std::string buckets = !spec.isCommand() && spec.bucketMb <= 0
                                  ? " (the trainer chose its buckets from measurements to hide the most: its plan "
                                    "is in the job's events)"
                                  : ", and " + bucketText(spec, k) + " would overlap more of it with the backward pass";
  return CommDiagnosis{CommBound::kUndetermined, lead + figures + unknown + ": " + hideAdvice(spec) + buckets + "."};
}

std::string waitingText(const kpi::JobKpis& k, const Prices& prices) {
  if (!k.waitingShare) return std::string(present::kUnknown);
  const auto part = [&](double share, const kpi::Maybe& cost, const kpi::Maybe& gpuHours, std::string_view what) {
    std::string text = percentOf(share) + std::string(what);
    if (prices.anySet() && cost) text += ", " + present::money(*cost, prices.currency);
    if (gpuHours) text += ", " + present::number(*gpuHours, 2) + " GPU-hours";
    return text;
  };
  std::string text = part(*k.waitingShare, k.waitingCost, k.waitingGpuHours, " of step time");
  if (k.stragglerShare) text += "; stragglers " + part(*k.stragglerShare, k.stragglerCost, k.stragglerGpuHours, "");
  return text;
}

}  // namespace lockstep::report
