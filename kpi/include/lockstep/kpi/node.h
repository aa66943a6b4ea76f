#pragma once
// A node's own figures from its stream (issue 31): its network interfaces and its GPUs, held by a
// job's rank or idle. The node records of the stream (protocol/stream.h) reach a NodeTracker;
// the app's cluster view, lockstepctl watch's node lines, the agent's metrics page and the
// reports' network section all read one. Not thread-safe: one owner at a time.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/common/natural.h"
#include "lockstep/kpi/network.h"
#include "lockstep/protocol/stream.h"

namespace lockstep::kpi {

// An interface's throughput over an interval (of at least NodeSettings::pointSeconds).
struct NetPoint {
  std::int64_t timeUnixUs = 0;  // the interval's end
  double rxBytesPerSecond = 0;
  double txBytesPerSecond = 0;
};

// An interface over everything the tracker saw of it: the growth of its counters from one sample
// to the next, summed (a counter that went back, as when the interface was recreated, adds
// nothing for that interval).
struct InterfaceTotals {
  std::string interface;
  double seconds = 0;
  std::uint64_t rxBytes = 0, txBytes = 0;
  std::uint64_t errors = 0;  // errors and drops, both ways, where the kernel counts them
  std::optional<std::uint64_t> linkBitsPerSecond;
  double peakRxBytesPerSecond = 0, peakTxBytesPerSecond = 0;  // over the series' intervals
};

struct NodeKpis {
  std::string node;
  std::vector<NetRate> interfaces;  // the newest throughput of each, busiest first
  // The newest sample of each GPU, by index; its energy counter is the newest reading (the agent
  // reads it less often than the rest, so a sample without one keeps the one before).
  std::vector<GpuSample> gpus;
};

struct NodeSettings {
  double pointSeconds = 1.0;          // the shortest interval of a series point
  std::size_t seriesCapacity = 3600;  // points kept per interface; 0: no series
};
// For views of the newest figures (the app, watch, the metrics page): no series.
inline constexpr NodeSettings kNewestOnly{1.0, 0};

// The busier direction of a rate, bytes per second.
double busiest(const NetRate& rate);

class NodeTracker : public RecordSink {
 public:
  explicit NodeTracker(std::string node, NodeSettings settings = {});

  void onNet(const std::string& node, const NetSample& sample) override;
  void onGpu(const std::string& node, const GpuSample& sample) override;

  const std::string& node() const { return node_; }
  NodeKpis snapshot() const;
  std::vector<InterfaceTotals> totals() const;   // in natural order of the interfaces
  std::vector<NetSample> newestSamples() const;  // each interface's, in natural order
  const std::map<std::string, std::deque<NetPoint>, NaturalLess>& networkSeries() const { return series_; }

 private:
  struct Interface {
    NetSample last, anchor;       // anchor: where the series' current interval began
    std::optional<NetRate> rate;  // between the two newest samples
    InterfaceTotals totals;
  };
  void extendSeries(Interface& i, const NetSample& sample);

  std::string node_;
  NodeSettings settings_;
  std::map<std::string, Interface, NaturalLess> interfaces_;
  std::map<std::string, std::deque<NetPoint>, NaturalLess> series_;
  std::map<std::uint32_t, GpuSample> gpus_;
};

}  // namespace lockstep::kpi
