#include "lockstep/kpi/step_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace lockstep::kpi {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

std::string format(const char* pattern, double a, double b = 0) {
  char text[96];
  std::snprintf(text, sizeof text, pattern, a, b);
  return text;
}

// The simulated step (step_model.h): compute progresses at full speed, or at 1 - contention while
// an all-reduce runs; one all-reduce at a time, in bucket order, each once backward has passed its
// end; after backward, each bucket's optimizer once it is reduced.
class StepSimulation {
 public:
  StepSimulation(const std::vector<BufferRange>& buckets, const StepFigures& f)
      : buckets_(buckets), f_(f), slowed_(1.0 - std::clamp(f.contention, 0.0, 1.0)) {}

  StepForecast run() {
    constexpr double kInfinity = std::numeric_limits<double>::infinity();
    const std::size_t n = buckets_.size();
    const double backward = f_.backwardMicros();
    // When each bucket is final, never after backward's end, so that rounding cannot strand one.
    std::vector<double> ready(n);
    bool finite = std::isfinite(backward) && backward >= 0 && std::isfinite(slowed_);
    for (std::size_t i = 0; i < n; ++i) {
      ready[i] = std::min(f_.readyAt(buckets_[i].end), backward);
      finite = finite && std::isfinite(ready[i]) && std::isfinite(f_.allReduce.at(bytesOf(i))) && std::isfinite(optimizerOf(i));
    }
    if (!finite) return {kInfinity, kInfinity, kInfinity};
    const double eps = 1e-9 * std::max(1.0, backward);
    std::size_t started = 0, reduced = 0, applying = 0;
    double now = 0, work = 0, commLeft = 0, optimizerLeft = 0, exposed = 0, backwardEnd = 0;
    bool commBusy = false, inBackward = true;
    // Each pass ends an event: a bucket ready, an all-reduce done, backward or an optimizer done.
    for (std::size_t events = 0; applying < n && events < 8 * n + 16; ++events) {
      if (!commBusy && started < n && (!inBackward || ready[started] <= work + eps)) {
        commBusy = true;
        commLeft = f_.allReduce.at(bytesOf(started));
        ++started;
      }
      const double rate = commBusy ? slowed_ : 1.0;
      const bool waiting = !inBackward && applying >= reduced;
      double mainLeft = kInfinity;
      if (inBackward) {
        double until = backward;
        if (!commBusy && started < n) until = std::min(until, ready[started]);
        mainLeft = timeFor(until - work, rate, eps);
      } else if (!waiting) {
        mainLeft = timeFor(optimizerLeft, rate, eps);
      }
      const double dt = std::max(0.0, std::min(commBusy ? commLeft : kInfinity, mainLeft));
      if (!std::isfinite(dt)) break;  // nothing left to happen: cannot be, but never spin
      now += dt;
      if (waiting) exposed += dt;
      if (inBackward) {
        work += dt * rate;
      } else if (!waiting) {
        optimizerLeft -= dt * rate;
      }
      if (commBusy && (commLeft -= dt) <= eps) {
        commBusy = false;
        ++reduced;
      }
      if (inBackward && work >= backward - eps) {
        inBackward = false;
        backwardEnd = now;
        optimizerLeft = optimizerOf(0);
      } else if (!inBackward && !waiting && optimizerLeft <= eps && applying < reduced) {
        if (++applying < n) optimizerLeft = optimizerOf(applying);
      }
    }
    if (applying < n) return {kInfinity, kInfinity, kInfinity};
    return {now, exposed, backwardEnd};
  }

 private:
  // Wall time for `work` at `rate`: none left is done now, even with compute stopped.
  static double timeFor(double work, double rate, double eps) {
    if (work <= eps) return 0;
    return rate > 0 ? work / rate : std::numeric_limits<double>::infinity();
  }
  double bytesOf(std::size_t i) const { return static_cast<double>(buckets_[i].end - buckets_[i].begin) * sizeof(float); }
  double optimizerOf(std::size_t i) const {
    return f_.optimizerMicrosPerFloat * static_cast<double>(buckets_[i].end - buckets_[i].begin);
  }

  const std::vector<BufferRange>& buckets_;
  const StepFigures& f_;
  double slowed_;
};

}  // namespace

std::string megabytes(double bytes) {
  const double mb = bytes / kMiB;
  return format(mb < 0.1 ? "%.3f MB" : mb < 10 ? "%.2g MB" : "%.0f MB", mb);
}

double CommCurve::at(double messageBytes) const {
  if (bytes.empty()) return 0;
  if (bytes.size() == 1 || messageBytes <= bytes.front()) return micros.front();
  if (messageBytes > bytes.back()) {
    // Beyond the last point, the slope of the fit over all of them: two neighbouring sizes'
    // noise, divided by their small difference, can be any slope at all.
    return std::max(micros.front(), micros.back() + fit().microsPerByte * (messageBytes - bytes.back()));
  }
  std::size_t i = 1;
  while (bytes[i] < messageBytes) ++i;
  const double slope = std::max(0.0, (micros[i] - micros[i - 1]) / (bytes[i] - bytes[i - 1]));
  return std::max(micros.front(), micros[i - 1] + slope * (messageBytes - bytes[i - 1]));
}

CommCurve::Fit CommCurve::fit() const {
  const double n = static_cast<double>(bytes.size());
  if (n < 2) return {n == 1 ? micros[0] : 0, 0};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    sx += bytes[i], sy += micros[i], sxx += bytes[i] * bytes[i], sxy += bytes[i] * micros[i];
  }
  // Never falling with size: a noisy measurement can tilt the fit, not the curve (at() keeps it flat).
  const double slope = std::max(0.0, (n * sxy - sx * sy) / std::max(1e-300, n * sxx - sx * sx));
  return {std::max(0.0, (sy - slope * sx) / n), slope};
}

std::string CommCurve::describe() const {
  if (bytes.size() < 2) return bytes.size() == 1 ? format("all-reduce %.2f ms", micros[0] / 1e3) : "no all-reduce measured";
  const Fit f = fit();
  return format("all-reduce %.2f ms + %.2f ms/MB", f.fixedMicros / 1e3, f.microsPerByte * kMiB / 1e3);
}

double StepFigures::readyAt(std::size_t end) const {
  std::size_t fromEnd = 0;
  double fromMicros = 0;
  for (std::size_t i = 0; i < readyEnds.size(); ++i) {
    if (end <= readyEnds[i]) {
      if (readyOnlyAtPoints || end == readyEnds[i]) return readyMicros[i];
      const double span = static_cast<double>(readyEnds[i] - fromEnd);
      return fromMicros + (span > 0 ? (readyMicros[i] - fromMicros) * static_cast<double>(end - fromEnd) / span : 0);
    }
    fromEnd = readyEnds[i];
    fromMicros = readyMicros[i];
  }
  return backwardMicros();
}

StepForecast simulateStep(const std::vector<BufferRange>& buckets, const StepFigures& figures) {
  return StepSimulation(buckets, figures).run();
}

std::string describeBuckets(const std::vector<BufferRange>& buckets) {
  std::vector<double> sizes;
  for (const auto& b : buckets) sizes.push_back(static_cast<double>(b.end - b.begin) * sizeof(float));
  if (sizes.size() == 1) return "1 bucket of " + megabytes(sizes[0]);
  std::vector<double> sorted = sizes;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2), sorted.end());
  return std::to_string(sizes.size()) + " buckets of ~" + megabytes(sorted[sorted.size() / 2]);
}

}  // namespace lockstep::kpi
