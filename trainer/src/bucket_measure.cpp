#include "bucket_measure.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "lockstep/kpi/median.h"

namespace lockstep::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using kpi::median;

// Timed runs of each measurement, after one to warm up. A backward is a step's longest part; the
// all-reduce's first run on a buffer range is slow (Gloo sets the range up, TCP grows its window),
// so the curve has few sizes (lines between them; see CommCurve) and the contention reuses one.
constexpr int kRepeats = 3;
constexpr int kBackwardRepeats = 2;
constexpr std::size_t kCurveBytes[] = {64u << 10, 512u << 10, 2u << 20};
constexpr std::size_t kContentionBytes = 512u << 10;
constexpr std::size_t kContentionReductions = 8;
constexpr std::size_t kOptimizerFloats = 256u << 10;  // the optimizer's rate, on a slice
constexpr std::size_t kProfilePieces = 32;  // about this many timed points along the backward
constexpr double kDrift = 1.3;              // re-plan when a figure moved by more than this factor
constexpr double kWorthChanging = 0.97;     // and another plan's forecast step is 3% shorter

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }


// The buffer offsets where the profile's backward is cut and timed: about kProfilePieces pieces,
// at the boundaries planBuckets may cut at.
std::vector<std::size_t> profileEnds(const ParamLayout& layout) {
  const std::size_t pieceBytes = std::max<std::size_t>(layout.totalFloats() * sizeof(float) / kProfilePieces, 4096);
  std::vector<std::size_t> ends;
  for (const auto& b : planBuckets(layout, pieceBytes, pieceBytes)) ends.push_back(b.end);
  return ends;
}

// Runs forward, then backward cut at `ends`, calling ready(end, when) for each piece; returns the
// backward's start, when it calls onStart() too.
template <class Ready, class Start = void (*)()>
Clock::time_point timedBackward(const CpuStepProbe& p, float* grads, const std::vector<std::size_t>& ends, Ready&& ready,
                                Start&& onStart = [] {}) {
  p.model.forward(p.params, p.x, p.labels, p.rows);
  const auto start = Clock::now();
  onStart();
  p.model.backward(p.params, grads, false, ends, [&](std::size_t end) { ready(end, Clock::now()); });
  return start;
}

// When each of `ends` was final, from the backward's start: the median of kBackwardRepeats
// backwards, after one to warm up.
std::vector<double> backwardProfile(const CpuStepProbe& p, float* grads, const std::vector<std::size_t>& ends) {
  std::vector<std::vector<double>> runs(ends.size());
  for (int run = 0; run <= kBackwardRepeats; ++run) {
    std::vector<Clock::time_point> at(ends.size());
    const auto start = timedBackward(p, grads, ends, [&](std::size_t end, Clock::time_point when) {
      const auto i = static_cast<std::size_t>(std::lower_bound(ends.begin(), ends.end(), end) - ends.begin());
      if (i < ends.size() && ends[i] == end) at[i] = when;
    });
    if (run == 0) continue;
    for (std::size_t i = 0; i < ends.size(); ++i) runs[i].push_back(micros(at[i] - start));
  }
  std::vector<double> profile;
  for (auto& r : runs) profile.push_back(std::max(median(r), profile.empty() ? 0.0 : profile.back()));
  return profile;
}

// The job's optimizer on a layout of its own of about kOptimizerFloats (its rule is per float), on
// copies of the parameters and gradients: the model's state stays as it is, and a large model's
// optimizer state is not allocated twice.
double optimizerMicrosPerFloat(const CpuStepProbe& p, const float* grads) {
  const ParamLayout slice({1024, kOptimizerFloats / 1024});
  const std::size_t n = std::min(p.layout.totalFloats(), slice.totalFloats());
  std::vector<float> params(slice.totalFloats(), 0.0f), gradients(slice.totalFloats(), 0.0f);
  std::copy_n(p.params, n, params.begin());
  std::copy_n(grads, n, gradients.begin());
  Optimizer optimizer(p.optimizer, slice);
  std::vector<double> runs;
  for (int run = 0; run <= kRepeats; ++run) {
    optimizer.beginStep(1e-9);
    const auto start = Clock::now();
    optimizer.apply(params.data(), gradients.data(), 0, slice.totalFloats(), 1.0f);
    if (run > 0) runs.push_back(micros(Clock::now() - start));
  }
  return median(runs) / static_cast<double>(slice.totalFloats());
}

// Compute time lost per microsecond of all-reduce: a backward (cut as the profile's) while the
// reducer's thread all-reduces one range kContentionReductions times (the same count on every
// rank), as a step's buckets would be, against the backward alone. Both are warm by now.
Result<double> contention(Comm& comm, const CpuStepProbe& p, float* grads, float* commScratch,
                          const std::vector<std::size_t>& ends, double backwardAlone) {
  const std::size_t floats = std::min(p.layout.totalFloats(), kContentionBytes / sizeof(float));
  GradientReducer reducer(comm, commScratch, std::vector<Bucket>(kContentionReductions, Bucket{0, floats}), p.timeout);
  std::vector<double> runs;
  for (int run = 1; run <= kBackwardRepeats; ++run) {
    reducer.beginStep();
    Clock::time_point end;
    const auto start = timedBackward(
        p, grads, ends, [&](std::size_t, Clock::time_point when) { end = when; }, [&] { reducer.markReady(floats); });
    for (std::size_t b = 0; b < reducer.buckets().size(); ++b) LOCKSTEP_TRY(reducer.waitBucket(b));
    double overlap = 0;
    for (const auto& t : reducer.timings()) overlap += std::max(0.0, micros(std::min(t.end, end) - std::max(t.start, start)));
    if (overlap > 0) runs.push_back(std::clamp((micros(end - start) - backwardAlone) / overlap, 0.0, 1.0));
  }
  reducer.shutdown();
  return median(runs);
}

}  // namespace

Result<CommCurve> measureAllReduce(Comm& comm, float* scratch, std::size_t maxBytes, std::chrono::milliseconds timeout) {
  std::vector<Bucket> sizes;  // ranges from the buffer's start, ascending, as the reducer needs them
  for (std::size_t bytes : kCurveBytes) {
    sizes.push_back({0, std::min(bytes, maxBytes) / sizeof(float)});
    if (bytes >= maxBytes) break;
  }
  // Through the reducer, one range at a time, as a step's last buckets go: the time from handing it
  // over to getting it back counts both threads' wake-ups, which a bucket pays too.
  GradientReducer reducer(comm, scratch, sizes, timeout);
  std::vector<std::vector<double>> runs(sizes.size());
  for (int run = 0; run <= kRepeats; ++run) {
    reducer.beginStep();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const auto start = Clock::now();
      reducer.markReady(sizes[i].end);
      LOCKSTEP_TRY(reducer.waitBucket(i));
      if (run > 0) runs[i].push_back(micros(Clock::now() - start));
    }
  }
  reducer.shutdown();
  CommCurve curve;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    curve.bytes.push_back(static_cast<double>(sizes[i].end * sizeof(float)));
    curve.micros.push_back(median(runs[i]));
  }
  return curve;
}

Result<PlanFigures> measureCpuStep(Comm& comm, const CpuStepProbe& p) {
  const std::size_t total = p.layout.totalFloats();
  std::vector<float> grads(total, 0.0f);
  // Reduced while backward writes `grads`: where the steps' gradients will be, so that it is timed
  // as they will be (in place, through shared memory), before they hold anything.
  std::vector<float> ownScratch;
  float* commScratch = reducibleBuffer(&comm, total, ownScratch);
  PlanFigures f;
  f.worldSize = static_cast<std::uint32_t>(comm.worldSize());
  LOCKSTEP_ASSIGN_OR_RETURN(f.allReduce, measureAllReduce(comm, commScratch, total * sizeof(float), p.timeout));
  f.readyEnds = profileEnds(p.layout);
  f.readyMicros = backwardProfile(p, grads.data(), f.readyEnds);
  f.optimizerMicrosPerFloat = optimizerMicrosPerFloat(p, grads.data());
  if (comm.worldSize() > 1) {
    LOCKSTEP_ASSIGN_OR_RETURN(f.contention, contention(comm, p, grads.data(), commScratch, f.readyEnds, f.backwardMicros()));
  }
  comm.releaseBuffers();  // before `commScratch` goes
  return f;
}

Result<PlanFigures> agreeOnFigures(Comm& comm, const PlanFigures& mine) {
  std::vector<float> packed;
  for (double v : mine.allReduce.micros) packed.push_back(static_cast<float>(v));
  for (double v : mine.readyMicros) packed.push_back(static_cast<float>(v));
  packed.push_back(static_cast<float>(mine.optimizerMicrosPerFloat * 1e6));  // in a float's range
  packed.push_back(static_cast<float>(mine.contention));
  LOCKSTEP_TRY(comm.allReduceSum(packed.data(), packed.size()));
  // Summation order may differ between ranks in the last bit; rank 0's result is the one.
  LOCKSTEP_TRY(comm.broadcast(packed.data(), packed.size() * sizeof(float), 0));
  comm.releaseBuffers();
  PlanFigures agreed = mine;
  const double ranks = comm.worldSize();
  std::size_t at = 0;
  for (double& v : agreed.allReduce.micros) v = packed[at++] / ranks;
  for (double& v : agreed.readyMicros) v = packed[at++] / ranks;
  agreed.optimizerMicrosPerFloat = packed[at++] / ranks / 1e6;
  agreed.contention = packed[at++] / ranks;
  return agreed;
}

PlanFigures scaledFigures(PlanFigures f, double comm, double compute) {
  for (double& v : f.allReduce.micros) v *= comm;
  // A longer all-reduce is longer waiting for the wire or the peers; its CPU work is the same.
  f.contention = std::min(1.0, f.contention / comm);
  for (double& v : f.readyMicros) v *= compute;
  f.optimizerMicrosPerFloat *= compute;
  return f;
}

PlanWatch::PlanWatch(const ParamLayout& layout, PlanFigures figures, BucketPlan plan, std::uint64_t every)
    : layout_(layout), figures_(std::move(figures)), plan_(std::move(plan)), every_(every) {}

void PlanWatch::noteStep(const std::vector<BucketTiming>& timings, Clock::time_point backwardStart,
                         Clock::time_point backwardEnd) {
  if (timings.size() != plan_.buckets.size()) return;
  bucketMicros_.resize(timings.size());
  // From when the reducer's thread could take it (final, and the one before done) to its end, as
  // measureAllReduce times it: the threads' wake-ups included.
  for (std::size_t b = 0; b < timings.size(); ++b) {
    const auto from = b == 0 ? timings[b].ready : std::max(timings[b].ready, timings[b - 1].end);
    bucketMicros_[b].push_back(micros(timings[b].end - from));
  }
  backwardMicros_.push_back(micros(backwardEnd - backwardStart));
}

// The window's medians, the same on every rank: each rank's row gathered (a sum of rows that are
// zero but for one), then per bucket the least over the ranks. A rank that arrived first at an
// all-reduce waited for the last one there, which a slower link does not explain and other buckets
// would not change; the last to arrive waited for nobody. The backward: the mean over the ranks.
// Returns each bucket's all-reduce time, then the backward's.
Result<std::vector<double>> PlanWatch::agreeOnWindow(Comm& comm) {
  const std::size_t width = plan_.buckets.size() + 1, ranks = static_cast<std::size_t>(comm.worldSize());
  window_.assign(width * ranks, 0.0f);  // the same size on every rank: one plan
  float* mine = window_.data() + width * static_cast<std::size_t>(comm.rank());
  for (std::size_t b = 0; b < bucketMicros_.size() && b < plan_.buckets.size(); ++b) {
    mine[b] = static_cast<float>(median(bucketMicros_[b]));
  }
  mine[width - 1] = static_cast<float>(median(backwardMicros_));
  bucketMicros_.clear();
  backwardMicros_.clear();
  LOCKSTEP_TRY(comm.allReduceSum(window_.data(), window_.size()));
  std::vector<double> agreed(width, 0.0);
  for (std::size_t b = 0; b + 1 < width; ++b) {
    agreed[b] = window_[b];
    for (std::size_t r = 1; r < ranks; ++r) agreed[b] = std::min<double>(agreed[b], window_[r * width + b]);
  }
  for (std::size_t r = 0; r < ranks; ++r) agreed[width - 1] += window_[r * width + width - 1] / static_cast<double>(ranks);
  return agreed;
}

// The all-reduce curve a window's buckets drew: each size's median time, equal sizes averaged.
CommCurve PlanWatch::curveOf(const std::vector<double>& bucketMicros) const {
  std::map<double, std::pair<double, int>> bySize;
  for (std::size_t b = 0; b < plan_.buckets.size(); ++b) {
    auto& [sum, n] = bySize[static_cast<double>(plan_.buckets[b].end - plan_.buckets[b].begin) * sizeof(float)];
    sum += bucketMicros[b];
    ++n;
  }
  CommCurve curve;
  for (const auto& [bytes, sumAndCount] : bySize) {
    curve.bytes.push_back(bytes);
    curve.micros.push_back(sumAndCount.first / sumAndCount.second);
  }
  return curve;
}

Result<std::optional<std::string>> PlanWatch::check(Comm& comm, std::uint64_t step) {
  if (every_ == 0 || step % every_ != 0) return std::optional<std::string>();
  LOCKSTEP_ASSIGN_OR_RETURN(const auto window, agreeOnWindow(comm));
  const auto drifted = [](double r) { return r > kDrift || r < 1 / kDrift; };
  // First the all-reduce: the curve the steps drew, where it moved; its CPU work kept, so the
  // contention shrinks as it lengthens. Then the backward, against what it should take beside it.
  PlanFigures next = figures_;
  const CommCurve seen = curveOf(window);
  double was = 0, now = 0;
  for (std::size_t i = 0; i < seen.bytes.size(); ++i) {
    was += figures_.allReduce.at(seen.bytes[i]);
    now += seen.micros[i];
  }
  const double commMoved = was > 0 ? now / was : 1.0;
  if (drifted(commMoved)) {
    next.allReduce = seen.bytes.size() > 1 ? seen : scaledFigures(figures_, commMoved, 1.0).allReduce;
    next.contention = std::min(1.0, figures_.contention / commMoved);
  }
  const double forecastBackward = simulateStep(plan_.buckets, next).backwardEndMicros;
  const double computeMoved = forecastBackward > 0 && window.back() > 0 ? window.back() / forecastBackward : 1.0;
  if (drifted(computeMoved)) next = scaledFigures(std::move(next), 1.0, computeMoved);
  if (!drifted(commMoved) && !drifted(computeMoved)) return std::optional<std::string>();
  figures_ = std::move(next);
  plan_.forecast = simulateStep(plan_.buckets, figures_);
  BucketPlan better = chooseBuckets(layout_, figures_);
  if (better.forecast.stepMicros >= plan_.forecast.stepMicros * kWorthChanging) return std::optional<std::string>();
  plan_ = std::move(better);
  char moved[200];
  std::snprintf(moved, sizeof moved,
                "re-planned after step %llu: all-reduce took %.2fx and backward %.2fx what the plan assumed; ",
                static_cast<unsigned long long>(step), drifted(commMoved) ? commMoved : 1.0,
                drifted(computeMoved) ? computeMoved : 1.0);
  return std::optional<std::string>(std::string(moved) + describePlan(plan_, figures_));
}

}  // namespace lockstep::trainer
