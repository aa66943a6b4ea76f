#pragma once
// What the dashboard's charts draw of a job: its series, read under the job's lock. A job the app
// folds itself gets them from its KPI tracker (kpi/kpi.h); a fanned-in job (FanIn.h) from the
// frames its supervising agent sent, a point a frame (FrameSeries).

#include <cstdint>
#include <deque>
#include <map>

#include "lockstep/kpi/kpi.h"

namespace lockstep::app {

using DeviceSeries = std::map<kpi::NodeGpu, std::deque<kpi::Point>, kpi::NodeGpuLess>;
using RankSeries = std::map<std::uint32_t, std::deque<kpi::Point>>;

struct ChartSeries {
  const std::deque<kpi::Point>& throughput;  // x: seconds since the job started
  const std::deque<kpi::Point>& loss;        // x: step
  const std::deque<kpi::StepSplit>& splits;
  const DeviceSeries& gpuUtilization;  // x: seconds since the job started
  const RankSeries& cpuPercent;        // per rank, x: seconds since the job started

  static ChartSeries of(const kpi::JobTracker& t) {
    return {t.throughputSeries(), t.lossSeries(), t.stepSplits(), t.gpuUtilizationSeries(), t.cpuPercentSeries()};
  }
};

// A fanned-in job's series, a point per frame: the job's throughput and loss, the step split of the
// ranks in the frame, and each GPU's and rank's utilization among the frame's rows (the ranks in
// view and the slowest, and their nodes' GPUs).
class FrameSeries {
 public:
  // Points kept: the job's series as a tracker keeps them (`capacity`); a device's, its newest
  // `deviceSeconds` (a device whose rows left the frames goes once it has none).
  FrameSeries(std::size_t capacity, double deviceSeconds) : capacity_(capacity), deviceSeconds_(deviceSeconds) {}

  void add(const kpi::JobKpis& k);
  ChartSeries view() const { return {throughput_, loss_, splits_, gpus_, cpus_}; }

 private:
  template <class T>
  static void push(std::deque<T>& series, T value, std::size_t capacity);
  template <class Devices>
  static void dropOlderThan(Devices& devices, double oldest);

  std::size_t capacity_;
  double deviceSeconds_;
  std::deque<kpi::Point> throughput_, loss_;
  std::deque<kpi::StepSplit> splits_;
  DeviceSeries gpus_;
  RankSeries cpus_;
};

}  // namespace lockstep::app
