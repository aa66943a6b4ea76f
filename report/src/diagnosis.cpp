#include "lockstep/report/diagnosis.h"

#include <algorithm>
#include <cmath>

#include "lockstep/present/present.h"
#include "lockstep/protocol/names.h"

namespace lockstep::report {
namespace {

std::string title(CollectiveKind kind) { return std::string(titleOf(kind)); }
// "all-gathers", "pushes", "sends and receives": the kind in the plural.
std::string plural(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kPush: return "pushes";
    case CollectiveKind::kSendRecv: return "sends and receives";
    default: return title(kind) + "s";
  }
}

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

// The kind of collective that carries the most exposed time, where the reports tell kinds apart.
const kpi::CollectiveKpis* dominantKind(const kpi::JobKpis& k) {
  const kpi::CollectiveKpis* most = nullptr;
  for (const auto& c : k.collectives) {
    if (c.exposedShare && *c.exposedShare > 0 && (!most || *c.exposedShare > *most->exposedShare)) most = &c;
  }
  return most;
}

bool allReduce(const kpi::CollectiveKpis* kind) { return !kind || kind->kind == CollectiveKind::kAllReduce; }

// "Exposed communication is 30% of step time", and where kinds other than all-reduce share it,
// the split: " (all-gather 18.0% · reduce-scatter 9.0%)".
std::string leadText(const kpi::JobKpis& k) {
  // With a decimal where rounding would make it read as the threshold itself ("15.0%" for 0.1504).
  const double pct = *k.commOverhead * 100;
  const int decimals = std::round(pct) == std::round(kHighCommShare * 100) ? 1 : 0;
  std::string lead = "Exposed communication is " + present::number(pct, decimals) + "% of step time";
  const bool others = std::any_of(k.collectives.begin(), k.collectives.end(), [](const kpi::CollectiveKpis& c) {
    return c.kind != CollectiveKind::kAllReduce && c.exposedShare && *c.exposedShare > 0;
  });
  if (others) lead += " (" + present::collectiveSplit(k.collectives) + ")";
  return lead;
}

CommDiagnosis straggler(const kpi::JobKpis& k, const std::string& lead, const kpi::CollectiveKpis* kind) {
  const std::string in = allReduce(kind) ? "the all-reduce" : "the " + plural(kind->kind);
  std::string advice = lead + "; " + percentOf(*k.stragglerWaitShare) + " of it is ranks waiting in " + in +
                       " for the last one to arrive";
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
  if (spec.isCommand()) {
    // Where the program counted its all-reduces (lockstep.watch), their mean size.
    for (const auto& c : k.collectives) {
      if (c.kind == CollectiveKind::kAllReduce && c.perStep >= 1 && c.bytesPerStep && *c.bytesPerStep > 0) {
        return *c.bytesPerStep / c.perStep;
      }
    }
  }
  if (!k.bytesReducedPerStep || *k.bytesReducedPerStep <= 0) return {};
  if (spec.isCommand()) return k.bytesReducedPerStep;
  if (spec.bucketMb <= 0) return {};  // chosen by the trainer: its sizes are in its note, not here
  const double buckets = std::ceil(*k.bytesReducedPerStep / (spec.bucketMb * 1024 * 1024));
  return *k.bytesReducedPerStep / std::max(1.0, buckets);
}

namespace {

// A bus bandwidth held against the reference: their ratio and ", 80% of <the link>"; unknown (and
// "") without either.
struct Against {
  kpi::Maybe ratio;
  std::string text;
};
Against against(const kpi::Maybe& busBandwidth, const std::optional<BandwidthReference>& reference) {
  if (!reference || reference->bytesPerSecond <= 0 || !busBandwidth) return {};
  const double ratio = *busBandwidth / reference->bytesPerSecond;
  return {ratio, ", " + percentOf(ratio) + " of " + reference->what};
}

// What bounds a collective, for every kind alike: the link when its bus bandwidth is near the
// reference, its latency when its messages are small, else undetermined.
CommBound boundOf(const Against& bus, const kpi::Maybe& messageBytes) {
  if (bus.ratio && *bus.ratio >= kNearReference) return CommBound::kBandwidth;
  if (messageBytes && *messageBytes < kSmallReductionBytes) return CommBound::kLatency;
  return CommBound::kUndetermined;
}

// The all-reduce's diagnosis: DDP's and the built-in trainer's gradients.
CommDiagnosis allReduceDiagnosis(const kpi::JobKpis& k, const JobSpec& spec,
                                 const std::optional<BandwidthReference>& reference, const std::string& lead) {
  const kpi::Maybe reduction = meanReductionBytes(k, spec);
  const std::string bus = k.busBandwidth ? "a bus bandwidth of " + present::bandwidth(k.busBandwidth) : "";
  const Against held = against(k.busBandwidth, reference);
  const std::string sizes = reduction ? "all-reduces of " + present::bytes(*reduction) : "";
  const CommBound bound = boundOf(held, reduction);
  if (bound == CommBound::kBandwidth) {
    return CommDiagnosis{CommBound::kBandwidth,
                         lead + " at " + bus + held.text + ": the link is the limit. Fewer bytes (bf16 gradients) " +
                             "or a faster link would shorten it; " + hideAdvice(spec) + "."};
  }
  if (bound == CommBound::kLatency) {
    return CommDiagnosis{CommBound::kLatency,
                         lead + ", in " + sizes + (bus.empty() ? "" : " at " + bus + held.text) +
                             ": so small a message costs its latency more than its bytes. " + bucketText(spec, {}) +
                             " would send fewer, larger ones."};
  }
  std::string figures = bus.empty() ? "" : " at " + bus + held.text;
  if (!sizes.empty()) figures += (figures.empty() ? " in " : ", in ") + sizes;
  const std::string unknown = held.ratio ? "" : bus.empty() ? " (no timed reductions to measure a bandwidth from)"
                                                       : " (no link speed or earlier peak on these nodes to hold it against)";
  const std::string buckets = !spec.isCommand() && spec.bucketMb <= 0
                                  ? " (the trainer chose its buckets from measurements to hide the most: its plan "
                                    "is in the job's events)"
                                  : ", and " + bucketText(spec, k) + " would overlap more of it with the backward pass";
  return CommDiagnosis{CommBound::kUndetermined, lead + figures + unknown + ": " + hideAdvice(spec) + buckets + "."};
}

std::string aTitle(CollectiveKind kind) { return (titleOf(kind).front() == 'a' ? "an " : "a ") + title(kind); }

// Where the spans put the steps' exposed collective time, when most of it is at one end:
// "; 75% of their exposed time is the step's first collective, the all-gather before ...".
std::string whereText(const kpi::ExposedEnds& e) {
  std::string out;
  if (e.firstShare && *e.firstShare >= kConcentratedShare) {
    out += "; " + percentOf(*e.firstShare) + " of their exposed time is the step's first collective, " +
           (e.firstKind == CollectiveKind::kAllGather
                ? "the all-gather before the first layer's forward, which nothing before it hides"
                : aTitle(e.firstKind));
  }
  if (e.lastShare && *e.lastShare >= kConcentratedShare) {
    out += "; " + percentOf(*e.lastShare) + " of their exposed time is the step's last collective, " +
           (e.lastKind == CollectiveKind::kReduceScatter
                ? "the reduce-scatter after backward, with no compute left to hide it"
            : e.lastKind == CollectiveKind::kBroadcast ? "a broadcast after the optimizer"
                                                       : aTitle(e.lastKind));
  }
  return out;
}

// The built-in trainer's own kinds of data parallelism (docs/trainer.md): what they trade.
std::string trainerKindAdvice(CollectiveKind kind, Shard shard, const std::string& where) {
  switch (kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      if (shard == Shard::kGradients || shard == Shard::kParameters) {
        return "sharded " + std::string(nameOf(shard)) + " (--shard " + std::string(nameOf(shard)) +
               ") reduce-scatter each bucket while backward goes on and" +
               (shard == Shard::kParameters ? " all-gather each layer just before forward and backward reach it"
                                            : " all-gather the parameters after each step") +
               where + ": they keep 1/N of the model state at that price; with memory to spare, --shard optimizer "
               "keeps the gradients and parameters whole and communicates less";
      }
      return "the sharded optimizer (--shard optimizer) reduce-scatters the gradients and waits for the parameters' "
             "all-gather after each step" + where + ": it keeps 1/N of the optimizer state at that price; with "
             "memory to spare, --shard none all-reduces while backward runs instead";
    case CollectiveKind::kPush:
    case CollectiveKind::kPull:
      return "a parameter server's pushes and pulls carry every rank's whole gradient and weights across the "
             "server's link each step" + where + ": --sync allreduce moves them among the ranks instead, and "
             "asynchronous training (--staleness K) lets a rank go on without waiting for the others";
    default:
      return "the " + plural(kind) + " carry it" + where;
  }
}

// What to change for a kind other than all-reduce: sharded training's all-gathers and
// reduce-scatters, ZeroRedundancyOptimizer's broadcasts, a barrier's wait.
std::string kindAdvice(const kpi::JobKpis& k, const JobSpec& spec, CollectiveKind kind) {
  const std::string where = whereText(k.exposedEnds);
  if (!spec.isCommand() && (spec.shard != Shard::kNone || spec.sync != Sync::kAllReduce)) {
    return trainerKindAdvice(kind, spec.shard, where);
  }
  switch (kind) {
    case CollectiveKind::kAllGather:
      return "sharded training (FSDP, ZeRO) waits for its parameters' all-gathers" + where +
             ". Prefetch them (FSDP's forward_prefetch=True and backward_prefetch=BACKWARD_PRE; ZeRO's overlap_comm "
             "and stage3_prefetch_bucket_size), let more run ahead where memory allows (FSDP's "
             "limit_all_gathers=False), gather in fewer, larger pieces (larger FSDP units, ZeRO's "
             "allgather_bucket_size), or " + hideAdvice(spec);
    case CollectiveKind::kReduceScatter:
      return "sharded training (FSDP, ZeRO) waits for its gradients' reduce-scatters" + where +
             ". Overlap them with backward (ZeRO's overlap_comm; FSDP's backward_prefetch=BACKWARD_PRE), reduce in "
             "fewer, larger pieces (larger FSDP units, ZeRO's reduce_bucket_size), or " + hideAdvice(spec);
    case CollectiveKind::kBroadcast:
      return "broadcasts after the optimizer are ZeroRedundancyOptimizer's parameter broadcasts (each rank updates "
             "its shard, then sends it to the others)" + where +
             ". ZeroRedundancyOptimizer(overlap_with_ddp=True) overlaps them with the next backward pass, "
             "parameters_as_bucket_view=True sends fewer, larger ones; broadcasts before forward are DDP's buffers "
             "(broadcast_buffers=False where they need no syncing); or " + hideAdvice(spec);
    case CollectiveKind::kBarrier:
      return "barriers move no data: their time is ranks waiting for each other" + where + ". The slowest is " +
             slowestText(k) + "; speed it up, or drop the barriers the program does not need";
    default:
      return "the " + plural(kind) + " carry it" + where + ": overlap them with compute where the program can, or " +
             hideAdvice(spec);
  }
}

// A kind other than all-reduce carries the most exposed time: its bandwidth against the reference,
// its message size, and what to change for it.
CommDiagnosis kindDiagnosis(const kpi::JobKpis& k, const JobSpec& spec,
                            const std::optional<BandwidthReference>& reference, const std::string& lead,
                            const kpi::CollectiveKpis& kind) {
  const Against held = against(kind.busBandwidth, reference);
  std::string figures = kind.busBandwidth
                            ? " at " + aTitle(kind.kind) + " bus bandwidth of " + present::bandwidth(kind.busBandwidth) +
                                  held.text
                            : "";
  kpi::Maybe size;
  if (kind.bytesPerStep && *kind.bytesPerStep > 0 && kind.perStep > 0) size = *kind.bytesPerStep / kind.perStep;
  if (size) figures += (figures.empty() ? " in " : ", in ") + plural(kind.kind) + " of " + present::bytes(*size);
  const std::string advice = kindAdvice(k, spec, kind.kind);
  const CommBound bound = boundOf(held, size);
  if (bound == CommBound::kBandwidth) {
    return {CommBound::kBandwidth, lead + figures + ": the link is the limit; " + advice + "."};
  }
  if (bound == CommBound::kLatency) {
    return {CommBound::kLatency,
            lead + figures + ": so small a message costs its latency more than its bytes; " + advice + "."};
  }
  const std::string unknown = held.ratio || kind.kind == CollectiveKind::kBarrier ? ""
                              : !kind.busBandwidth
                                  ? " (no timed " + plural(kind.kind) + " to measure a bandwidth from)"
                                  : " (no link speed or earlier peak on these nodes to hold it against)";
  return {CommBound::kUndetermined, lead + figures + unknown + ": " + advice + "."};
}

}  // namespace

std::optional<CommDiagnosis> diagnoseCommunication(const kpi::JobKpis& k, const JobSpec& spec,
                                                   const std::optional<BandwidthReference>& reference) {
  if (!k.commOverhead || *k.commOverhead <= kHighCommShare) return std::nullopt;
  const std::string lead = leadText(k);
  const kpi::CollectiveKpis* kind = dominantKind(k);
  if (k.stragglerWaitShare && *k.stragglerWaitShare >= kStragglerWaitShare) return straggler(k, lead, kind);
  if (allReduce(kind)) return allReduceDiagnosis(k, spec, reference, lead);
  return kindDiagnosis(k, spec, reference, lead, *kind);
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
