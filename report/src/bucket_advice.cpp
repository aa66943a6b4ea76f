// Which bucket_cap_mb a DDP program could try (diagnosis.h): the step model the built-in trainer
// chooses its buckets with (lockstep/kpi/step_model.h), fed with what the program's reports say.

#include <algorithm>
#include <cmath>

#include "lockstep/kpi/step_model.h"
#include "lockstep/report/diagnosis.h"

namespace lockstep::report {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kUnitBytes = 64 * 1024;     // DDP cuts between tensors: a granularity to plan at
constexpr double kFirstBucketMb = 1;         // DDP's first bucket (torch.distributed's default)
constexpr double kDefaultCapMb = 25;         // DDP's bucket_cap_mb default
constexpr double kBackwardShare = 2.0 / 3;   // backward's FLOPs are twice the forward's
constexpr double kWorthAdvising = 0.8;       // advise where the forecast exposed time drops 20%

// A `bytes` gradient in floats, whole kUnitBytes units of it (the step model counts floats).
std::size_t gradientFloats(double bytes) {
  return static_cast<std::size_t>(std::max(1.0, std::ceil(bytes / kUnitBytes)) * kUnitBytes / sizeof(float));
}

// The ranges DDP would cut that gradient into with this cap, at kUnitBytes boundaries.
std::vector<kpi::BufferRange> ddpBuckets(double bytes, double capMb) {
  const std::size_t floats = gradientFloats(bytes), unit = static_cast<std::size_t>(kUnitBytes / sizeof(float));
  std::vector<kpi::BufferRange> out;
  std::size_t begin = 0;
  double cap = std::min(capMb, kFirstBucketMb);
  while (begin < floats) {
    const auto units = static_cast<std::size_t>(std::max(1.0, std::floor(cap * kMiB / kUnitBytes)));
    out.push_back({begin, std::min(floats, begin + units * unit)});
    begin = out.back().end;
    cap = capMb;
  }
  return out;
}

// An all-reduce of `microsPerMiB` and a fixed kDdpAllReduceFixedUs, over the model's sizes.
kpi::CommCurve affine(double microsPerMiB) {
  kpi::CommCurve c;
  for (double mb : {0.0625, 1.0, 1024.0}) {
    c.bytes.push_back(mb * kMiB);
    c.micros.push_back(kDdpAllReduceFixedUs + microsPerMiB * mb);
  }
  return c;
}

}  // namespace

std::optional<BucketAdvice> ddpBucketAdvice(const kpi::JobKpis& k) {
  // On CPUs DDP's all-reduce runs on threads that compete with backward for the rank's cores, which
  // a program's step split does not show: checked against PyTorch DDP here, the model expected 3 to
  // 7 times less exposed time than the advised cap left (docs/benchmarks.md). So GPU jobs only.
  if (!k.gpuUtilizationPct) return std::nullopt;
  if (!k.bytesReducedPerStep || !k.meanBusyUs || !k.meanExposedUs || !(*k.bytesReducedPerStep > 0) ||
      !std::isfinite(*k.bytesReducedPerStep + *k.meanBusyUs + *k.meanExposedUs)) {
    return std::nullopt;
  }
  // What the buckets can change: the exposed time less any waiting for a late rank.
  const double exposed = *k.meanExposedUs * (1 - k.stragglerWaitShare.value_or(0));
  const double bytes = *k.bytesReducedPerStep;
  kpi::StepFigures f;
  f.readyEnds = {gradientFloats(bytes)};
  f.readyMicros = {*k.meanBusyUs * kBackwardShare};
  // The all-reduce rate that makes the default buckets leave this program's exposed time.
  const auto now = ddpBuckets(bytes, kDefaultCapMb);
  double low = 0, high = 1e9;
  for (int i = 0; i < 100; ++i) {
    f.allReduce = affine((low + high) / 2);
    (kpi::simulateStep(now, f).exposedMicros < exposed ? low : high) = (low + high) / 2;
  }
  f.allReduce = affine(high);
  const double current = kpi::simulateStep(now, f).stepMicros;
  BucketAdvice best{kDefaultCapMb, kpi::simulateStep(now, f).exposedMicros, exposed};
  double bestStep = current;
  for (double cap : {0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 50.0, 100.0}) {
    const auto forecast = kpi::simulateStep(ddpBuckets(bytes, cap), f);
    if (forecast.stepMicros < bestStep * 0.99) {
      bestStep = forecast.stepMicros;
      best = {cap, forecast.exposedMicros, exposed};
    }
  }
  if (best.capMb == kDefaultCapMb || best.expectedExposedUs > exposed * kWorthAdvising) return std::nullopt;
  return best;
}

}  // namespace lockstep::report
