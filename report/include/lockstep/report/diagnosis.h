#pragma once
// Why a job's exposed communication is high (docs/kpis.md, "Why communication is slow"): ranks
// waiting for a straggler, the link's bandwidth, or per-message latency, told apart from the
// figures; the advice names the figures it rests on, the kind of collective that carries most of
// it (all-reduce; sharded training's all-gathers and reduce-scatters; ZeroRedundancyOptimizer's
// broadcasts; ...) and where in the step it sits. The report's recommendations and the dashboard's
// Communication tile both say this.

#include <optional>
#include <string>
#include <string_view>

#include "lockstep/kpi/kpi.h"
#include "lockstep/protocol/types.h"

namespace lockstep::report {

enum class CommBound { kStraggler, kBandwidth, kLatency, kUndetermined };
std::string_view commBoundName(CommBound bound);  // "waiting on a straggler", ...

// What the bus bandwidth is held against: the link the job's nodes talk over, or the best another
// job reached on the same nodes (history::History::peakBusBandwidth).
struct BandwidthReference {
  double bytesPerSecond = 0;
  std::string what;  // "the 25 Gb/s link of node-b", "the peak job ab12 reached on these nodes"
};

struct CommDiagnosis {
  CommBound bound = CommBound::kUndetermined;
  std::string advice;
};

inline constexpr double kHighCommShare = 0.15;             // exposed communication worth explaining
inline constexpr double kStragglerWaitShare = 0.5;         // of it, waiting for the last rank
inline constexpr double kNearReference = 0.6;              // bus bandwidth this near the reference
inline constexpr double kSmallReductionBytes = 1 << 20;    // collectives this small: latency dominates
inline constexpr double kConcentratedShare = 0.5;          // of the exposed time, in the step's first (last) collective

// Empty while exposed communication is at most kHighCommShare of step time (or unknown).
std::optional<CommDiagnosis> diagnoseCommunication(const kpi::JobKpis& k, const JobSpec& spec,
                                                   const std::optional<BandwidthReference>& reference);

// The mean size of one all-reduce: the built-in trainer's step split into its buckets; a
// program's all-reduced bytes per step over their count where its reports count them (the
// all-reduce of JobKpis::collectives), else its whole step (its buckets are its own: an upper
// bound). Unknown without byte counts.
kpi::Maybe meanReductionBytes(const kpi::JobKpis& k, const JobSpec& spec);

// A bucket_cap_mb for a DDP program to try, and the exposed communication per step the step model
// (lockstep/kpi/step_model.h, the one lockstep-trainer chooses its buckets with) expects with it.
// The model is fed the program's gradient bytes per step, its compute (backward taken as two thirds
// of it, at an even pace) and its exposed time, assumed to come from DDP's default 25 MB buckets;
// an all-reduce costs kDdpAllReduceFixedUs plus a rate fitted to that exposed time. GPU jobs only
// (on CPUs the model does not foresee DDP: bucket_advice.cpp). Empty when the
// figures are missing or no cap is expected to cut the exposed time by a fifth.
inline constexpr double kDdpAllReduceFixedUs = 100;
struct BucketAdvice {
  double capMb = 25;
  double expectedExposedUs = 0;
  double currentExposedUs = 0;  // what the buckets can change: the exposed time less straggler waits
};
std::optional<BucketAdvice> ddpBucketAdvice(const kpi::JobKpis& k);

// What waiting cost, over the whole job: "12% of step time, 0.42 USD, 0.10 GPU-hours; stragglers
// 4%, 0.14 USD, 0.03 GPU-hours" (money only where prices are set); "–" when unknown.
std::string waitingText(const kpi::JobKpis& k, const Prices& prices);

}  // namespace lockstep::report
