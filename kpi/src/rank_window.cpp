#include "rank_window.h"

#include <cmath>

#include "lockstep/protocol/collectives.h"

namespace lockstep::kpi::detail {
namespace {

bool whole(double flops) { return std::trunc(flops) == flops && std::fabs(flops) < 0x1p100; }

// Whether `r` is in (fromUs, toUs]: the window a snapshot reads.
bool heldIn(const StepReport& r, std::int64_t fromUs, std::int64_t toUs) { return r.timeUnixUs > fromUs && r.timeUnixUs <= toUs; }

bool hadCollectives(const StepReport& r) { return !collectivesOf(r).empty(); }
bool declaredBasis(const StepReport& r) { return r.flops && r.flopsBasis; }
bool saidPeak(const StepReport& r) { return r.peakFlops.has_value(); }
bool saidStateBytes(const StepReport& r) { return r.paramBytes || r.gradBytes || r.optimizerStateBytes; }

// Notes one held report's part in the figures that are not sums, as the reports come in their
// order: the last to come, or for the peak and the state the newest by time (the later of two at
// once).
void noteNewest(HeldReports& h, const StepReport& r) {
  const auto newer = [&](const StepReport* held) { return !held || r.timeUnixUs >= held->timeUnixUs; };
  if (!h.oldest) h.oldest = &r;
  h.newest = &r;
  if (hadCollectives(r)) h.newestCollectives = &r;
  if (declaredBasis(r)) h.newestBasis = &r;
  if (saidPeak(r) && newer(h.newestPeak)) h.newestPeak = &r;
  if (saidStateBytes(r) && newer(h.newestStateBytes)) h.newestStateBytes = &r;
}

}  // namespace

void WindowSums::add(const StepReport& r, int sign) {
  const double s = sign;
  reports += sign;
  samples += s * r.samples;
  stepUs += s * static_cast<double>(r.stepTimeUs);
  if (r.tokens) {
    tokens += sign * static_cast<ExactSum>(*r.tokens);
    withTokens += sign;
  }
  if (r.bytesReduced) {  // a CPU DDP program counts its bytes without timing its all-reduce
    countedBytes += sign * static_cast<ExactSum>(*r.bytesReduced);
    countedReports += sign;
  }
  if (r.dataTimeUs && r.computeTimeUs && r.exposedCommTimeUs) {
    dataUs += s * static_cast<double>(*r.dataTimeUs);
    computeUs += s * static_cast<double>(*r.computeTimeUs);
    exposedUs += s * static_cast<double>(*r.exposedCommTimeUs);
    timedSamples += s * r.samples;
    timedStepUs += s * static_cast<double>(r.stepTimeUs);
    timed += sign;
  }
  if (r.flops) {
    withFlops += sign;
    if (whole(*r.flops)) {
      flops += sign * static_cast<ExactSum>(*r.flops);
    } else {
      fractionalFlops += sign;
    }
  }
  if (declaredBasis(r)) withBasis += sign;
  if (saidPeak(r)) withPeak += sign;
  if (saidStateBytes(r)) withStateBytes += sign;
  if (r.staleness) withStaleness += sign;
  collectives.add(r, sign);
  ends.add(r, sign);
}

void RankWindow::push(const StepReport& report) {
  if (!reports_.empty() && report.timeUnixUs < reports_.back().timeUnixUs) sorted_ = false;
  reports_.push_back(report);
  sums_.add(reports_.back(), 1);
}

void RankWindow::trim(std::int64_t timeUs) {
  while (!reports_.empty() && reports_.front().timeUnixUs <= timeUs) {
    sums_.add(reports_.front(), -1);
    reports_.pop_front();
  }
  if (reports_.empty()) clear();
}

void RankWindow::clear() {
  reports_.clear();
  sums_ = {};
  sorted_ = true;
}

HeldReports RankWindow::held(std::int64_t fromUs, std::int64_t toUs) const {
  HeldReports h;
  const auto holds = [&](const StepReport& r) { return heldIn(r, fromUs, toUs); };
  if (sorted_ && (reports_.empty() || reports_.back().timeUnixUs <= fromUs || reports_.front().timeUnixUs > toUs)) {
    return h;  // it holds none of them
  }
  std::size_t begin = 0, end = reports_.size();
  if (sorted_) {
    // The sums, less the oldest reports the window has left behind and the ones after its end.
    h.sums = sums_;
    for (; begin < end && !holds(reports_[begin]); ++begin) h.sums.add(reports_[begin], -1);
    for (; end > begin && !holds(reports_[end - 1]); --end) h.sums.add(reports_[end - 1], -1);
  } else {
    for (const auto& r : reports_) {
      if (holds(r)) h.sums.add(r, 1);
    }
  }
  // What is not a sum: the newest report of each kind (usually the newest of all), and the few
  // that are walked.
  if (!sorted_ || h.sums.withStaleness > 0 || h.sums.fractionalFlops > 0) {
    walk(h, begin, end, fromUs, toUs);
  } else if (begin < end) {
    // Time order: the held reports are [begin, end), and the newest of a kind is the first found
    // from the end (the sums say whether there is one).
    h.oldest = &reports_[begin];
    h.newest = &reports_[end - 1];
    const auto newestWhere = [&](int count, bool (*pred)(const StepReport&), const StepReport*& out) {
      for (std::size_t i = end; count > 0 && !out && i > begin; --i) {
        if (pred(reports_[i - 1])) out = &reports_[i - 1];
      }
    };
    newestWhere(h.sums.collectives.reports(), hadCollectives, h.newestCollectives);
    newestWhere(h.sums.withBasis, declaredBasis, h.newestBasis);
    newestWhere(h.sums.withPeak, saidPeak, h.newestPeak);
    newestWhere(h.sums.withStateBytes, saidStateBytes, h.newestStateBytes);
  }
  // The sums' own is the newest summed, which may be one left out here.
  if (h.newestCollectives) h.sums.collectives.setWorldSize(h.newestCollectives->worldSize);
  if (h.sums.fractionalFlops == 0) h.flops = static_cast<double>(h.sums.flops);
  return h;
}

void RankWindow::walk(HeldReports& h, std::size_t begin, std::size_t end, std::int64_t fromUs, std::int64_t toUs) const {
  for (std::size_t i = begin; i < end; ++i) {
    const StepReport& r = reports_[i];
    if (!heldIn(r, fromUs, toUs)) continue;
    noteNewest(h, r);
    if (r.staleness) h.staleness.push_back(static_cast<double>(*r.staleness));
    if (r.flops) h.flops += *r.flops;  // read only when a fraction makes the exact sum wrong
  }
}

}  // namespace lockstep::kpi::detail
