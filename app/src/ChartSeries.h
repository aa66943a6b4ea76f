#pragma once
// What the dashboard's charts draw of a job: its series, read under the job's lock. A job the app
// folds itself gets them from its KPI tracker (kpi/kpi.h); a fanned-in job (FanIn.h) from the
// frames its supervising agent sent (FrameSeries).

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "lockstep/common/natural.h"
#include "lockstep/kpi/kpi.h"

namespace lockstep::app {

// How far back the heatmap draws, a column a second (DashboardWidget).
inline constexpr int kHeatmapSeconds = 120;
inline constexpr double kDevicePointSeconds = 0.5;

using DeviceSeries = std::map<kpi::NodeGpu, std::deque<kpi::Point>, kpi::NodeGpuLess>;
using RankSeries = std::map<std::uint32_t, std::deque<kpi::Point>>;
// A fanned-in job's heatmap rows: each block of its nodes (kpi::NodeBlock, by its first node) and
// its least busy device over the heatmap's span.
struct BlockPoints {
  std::uint32_t nodes = 0;  // in the block, as the newest frame said
  std::deque<kpi::Point> least;
};
using BlockSeries = std::map<std::string, BlockPoints, NaturalLess>;

struct ChartSeries {
  const std::deque<kpi::Point>& throughput;  // x: seconds since the job started
  const std::deque<kpi::Point>& loss;        // x: step
  const std::deque<kpi::StepSplit>& splits;
  const DeviceSeries& gpuUtilization;  // x: seconds since the job started
  const RankSeries& cpuPercent;        // per rank, x: seconds since the job started
  const BlockSeries& nodeBlocks;       // a fanned-in job's: the heatmap's rows; none otherwise

  static ChartSeries of(const kpi::JobTracker& t) {
    static const BlockSeries kNone;
    return {t.throughputSeries(), t.lossSeries(), t.stepSplits(), t.gpuUtilizationSeries(), t.cpuPercentSeries(), kNone};
  }
};

// A fanned-in job's series, from its frames: the job's throughput (a point a second) and loss and
// step split of the ranks in the frame (a point a step), and, at most every kDevicePointSeconds
// (frames come ten times a second; the heatmap has a column a second), each GPU's and rank's
// utilization among the frame's rows (the ranks in view and the slowest, and their nodes' GPUs) and
// each block of the job's nodes' least busy device.
class FrameSeries {
 public:
  // Points kept: the job's series as a tracker keeps them (`capacity`); a device's, its newest
  // `deviceSeconds` (a device whose rows left the frames goes once it has none).
  FrameSeries(std::size_t capacity, double deviceSeconds) : capacity_(capacity), deviceSeconds_(deviceSeconds) {}

  void add(const kpi::JobKpis& k);
  ChartSeries view() const { return {throughput_, loss_, splits_, gpus_, cpus_, blocks_}; }

 private:
  template <class T>
  static void push(std::deque<T>& series, T value, std::size_t capacity);
  template <class Devices>
  static void dropOlderThan(Devices& devices, double oldest);
  template <class Add>
  void addBlocks(const kpi::JobKpis& k, const Add& add);

  std::size_t capacity_;
  double deviceSeconds_;
  std::deque<kpi::Point> throughput_, loss_;
  std::deque<kpi::StepSplit> splits_;
  DeviceSeries gpus_;
  RankSeries cpus_;
  BlockSeries blocks_;
};

}  // namespace lockstep::app
