#include "bucket_plan.h"

#include <algorithm>
#include <cstdio>
#include <limits>

namespace lockstep::trainer {
namespace {

constexpr std::size_t kSmallestCap = 16u << 10;
constexpr std::size_t kFirstCap = 1u << 20;      // like PyTorch DDP: start communicating early
constexpr std::size_t kFixedDefault = 25u << 20;  // the fixed plan before measurement (PyTorch's too)
constexpr double kCapStep = 1.189207115;          // 2^(1/4): four caps per doubling
constexpr double kCloseEnough = 1.01;             // forecasts within 1% count as a tie

std::string format(const char* pattern, double a, double b = 0, double c = 0) {
  char text[160];
  std::snprintf(text, sizeof text, pattern, a, b, c);
  return text;
}

}  // namespace

std::vector<Bucket> cappedBuckets(const ParamLayout& layout, std::size_t capBytes) {
  return planBuckets(layout, capBytes, std::min(capBytes, kFirstCap));
}

BucketPlan chooseBuckets(const ParamLayout& layout, const PlanFigures& figures) {
  const double total = static_cast<double>(layout.totalFloats()) * sizeof(float);
  std::vector<BucketPlan> tried;
  const auto sameCuts = [](const std::vector<Bucket>& a, const std::vector<Bucket>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const Bucket& x, const Bucket& y) {
             return x.begin == y.begin && x.end == y.end;
           });
  };
  for (double cap = kSmallestCap;; cap *= kCapStep) {
    const auto capBytes = static_cast<std::size_t>(std::min(cap, total));
    BucketPlan plan{cappedBuckets(layout, capBytes), capBytes, {}, {}};
    if (tried.empty() || !sameCuts(plan.buckets, tried.back().buckets)) {  // caps that cut alike forecast alike
      plan.forecast = simulateStep(plan.buckets, figures);
      tried.push_back(std::move(plan));
    }
    if (cap >= total) break;
  }
  double best = std::numeric_limits<double>::infinity();
  for (const auto& p : tried) best = std::min(best, p.forecast.stepMicros);
  BucketPlan chosen;
  for (auto& p : tried) {
    if (p.forecast.stepMicros <= best * kCloseEnough && (chosen.buckets.empty() || p.buckets.size() < chosen.buckets.size())) {
      chosen = std::move(p);
    }
  }
  chosen.defaultForecast = simulateStep(cappedBuckets(layout, kFixedDefault), figures);
  return chosen;
}

std::string describePlan(const BucketPlan& plan, const PlanFigures& f) {
  const double optimizerMs = f.optimizerMicrosPerFloat * static_cast<double>(plan.buckets.back().end) / 1e3;
  return "buckets: " + describeBuckets(plan.buckets) + " (cap " + kpi::megabytes(static_cast<double>(plan.capBytes)) +
         "), chosen from " + f.allReduce.describe() + " among " + std::to_string(f.worldSize) + " ranks" +
         format(f.readyOnlyAtPoints ? ", forward and backward %.1f ms, optimizer %.1f ms, compute slowed %.0f%% while an all-reduce runs"
                                    : ", backward %.1f ms, optimizer %.1f ms, compute slowed %.0f%% while an all-reduce runs",
                f.backwardMicros() / 1e3,
                optimizerMs, 100 * std::clamp(f.contention, 0.0, 1.0)) +
         format("; expected exposed communication %.2f ms a step (25 MB buckets: %.2f ms)",
                plan.forecast.exposedMicros / 1e3, plan.defaultForecast.exposedMicros / 1e3) +
         format(", step from backward on %.1f ms (%.1f ms)", plan.forecast.stepMicros / 1e3,
                plan.defaultForecast.stepMicros / 1e3);
}

}  // namespace lockstep::trainer
