#include "ChartSeries.h"

#include <span>

namespace lockstep::app {

template <class T>
void FrameSeries::push(std::deque<T>& series, T value, std::size_t capacity) {
  series.push_back(value);
  while (series.size() > capacity) series.pop_front();
}

// The heatmap's rows are the blocks of the job's nodes in the newest frame, each with its points so
// far: a block the frame no longer holds (an elastic restart left its nodes out) goes. None where
// the frame holds every rank (the devices' rows are all there) or has no blocks (an older agent).
template <class Add>
void FrameSeries::addBlocks(const kpi::JobKpis& k, const Add& add) {
  BlockSeries now;
  for (const auto& b : k.ranks.size() >= k.worldSize ? std::span<const kpi::NodeBlock>{} : k.nodeBlocks) {
    auto kept = blocks_.extract(b.firstNode);
    BlockPoints& block = now[b.firstNode] = kept ? std::move(kept.mapped()) : BlockPoints{};
    block.nodes = b.nodes;
    if (b.leastPct) add(block.least, *b.leastPct);
    auto& least = block.least;
    while (!least.empty() && least.front().x < k.elapsedSeconds - kHeatmapSeconds) least.pop_front();
  }
  blocks_ = std::move(now);
}

void FrameSeries::add(const kpi::JobKpis& k) {
  const double x = k.elapsedSeconds;
  // A point a second, as a tracker's: its capacity holds as long a span.
  if (k.samplesPerSecond && (throughput_.empty() || x >= throughput_.back().x + 1)) {
    push(throughput_, kpi::Point{x, *k.samplesPerSecond}, capacity_);
  }
  // A point per step, as the tracker's: the frame repeats a step until the next one completes.
  if (k.lastGlobalLoss && (loss_.empty() || loss_.back().x < static_cast<double>(k.step))) {
    push(loss_, kpi::Point{static_cast<double>(k.step), *k.lastGlobalLoss}, capacity_);
  }
  if (k.meanBusyUs && k.meanExposedUs && (splits_.empty() || splits_.back().step < k.step)) {
    // The job's busy time, split into data and compute as the timed rows in the frame split theirs.
    double data = 0, compute = 0;
    for (const auto& r : k.ranks) {
      if (!r.meanDataUs || !r.meanComputeUs) continue;
      data += *r.meanDataUs;
      compute += *r.meanComputeUs;
    }
    const double dataShare = data + compute > 0 ? data / (data + compute) : 0;
    push(splits_,
         kpi::StepSplit{k.step, *k.meanBusyUs * dataShare / 1e3, *k.meanBusyUs * (1 - dataShare) / 1e3,
                        *k.meanExposedUs / 1e3},
         capacity_);
  }
  // A device's points in time order: a job's last frame is of its newest report, which may come
  // before the moment of the frames polled after the end.
  const auto add = [x](std::deque<kpi::Point>& points, double y) {
    if (points.empty() || x >= points.back().x + kDevicePointSeconds) points.push_back({x, y});
  };
  for (const auto& g : k.gpus) {
    if (g.utilizationPct) add(gpus_[{g.node, g.index}], *g.utilizationPct);
  }
  for (const auto& r : k.ranks) {
    if (r.cpuPct) add(cpus_[r.rank], *r.cpuPct);
  }
  addBlocks(k, add);
  dropOlderThan(gpus_, x - deviceSeconds_);
  dropOlderThan(cpus_, x - deviceSeconds_);
}

// A device whose rows left the frames (a rank no longer among the slowest) goes with its last point.
template <class Devices>
void FrameSeries::dropOlderThan(Devices& devices, double oldest) {
  for (auto it = devices.begin(); it != devices.end();) {
    auto& points = it->second;
    while (!points.empty() && points.front().x < oldest) points.pop_front();
    it = points.empty() ? devices.erase(it) : std::next(it);
  }
}

}  // namespace lockstep::app
