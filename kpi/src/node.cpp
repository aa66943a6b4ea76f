#include "lockstep/kpi/node.h"

#include <algorithm>

namespace lockstep::kpi {

double busiest(const NetRate& rate) { return std::max(rate.rxBytesPerSecond, rate.txBytesPerSecond); }

NodeTracker::NodeTracker(std::string node, NodeSettings settings) : node_(std::move(node)), settings_(settings) {}

void NodeTracker::onNet(const std::string&, const NetSample& sample) {
  auto [it, fresh] = interfaces_.try_emplace(sample.interface);
  Interface& i = it->second;
  if (fresh) {
    i.last = i.anchor = sample;
    i.totals.interface = sample.interface;
    i.totals.linkBitsPerSecond = sample.linkBitsPerSecond;
    return;
  }
  if (sample.timeUnixUs <= i.last.timeUnixUs) return;  // replayed, or out of order
  i.rate = netRate(i.last, sample);
  if (i.rate) {
    i.totals.seconds += static_cast<double>(sample.timeUnixUs - i.last.timeUnixUs) / 1e6;
    i.totals.rxBytes += sample.rxBytes - i.last.rxBytes;
    i.totals.txBytes += sample.txBytes - i.last.txBytes;
    i.totals.errors += i.rate->newErrors;
  }
  if (sample.linkBitsPerSecond) i.totals.linkBitsPerSecond = sample.linkBitsPerSecond;
  i.last = sample;
  extendSeries(i, sample);
}

void NodeTracker::extendSeries(Interface& i, const NetSample& sample) {
  const double seconds = static_cast<double>(sample.timeUnixUs - i.anchor.timeUnixUs) / 1e6;
  if (seconds < settings_.pointSeconds) return;
  const auto rate = netRate(i.anchor, sample);
  i.anchor = sample;
  if (!rate) return;  // the counters went back: the next interval starts here
  i.totals.peakRxBytesPerSecond = std::max(i.totals.peakRxBytesPerSecond, rate->rxBytesPerSecond);
  i.totals.peakTxBytesPerSecond = std::max(i.totals.peakTxBytesPerSecond, rate->txBytesPerSecond);
  if (settings_.seriesCapacity == 0) return;
  auto& series = series_[sample.interface];
  series.push_back(NetPoint{sample.timeUnixUs, rate->rxBytesPerSecond, rate->txBytesPerSecond});
  while (series.size() > settings_.seriesCapacity) series.pop_front();
}

void NodeTracker::onGpu(const std::string&, const GpuSample& sample) {
  auto [it, fresh] = gpus_.try_emplace(sample.gpuIndex, sample);
  if (fresh) return;
  if (sample.timeUnixUs < it->second.timeUnixUs) return;
  const auto energy = it->second.energyMillijoules;
  it->second = sample;
  if (!sample.energyMillijoules) it->second.energyMillijoules = energy;
}

NodeKpis NodeTracker::snapshot() const {
  NodeKpis k;
  k.node = node_;
  for (const auto& [name, i] : interfaces_) {
    if (i.rate) k.interfaces.push_back(*i.rate);
  }
  std::stable_sort(k.interfaces.begin(), k.interfaces.end(),
                   [](const NetRate& a, const NetRate& b) { return busiest(a) > busiest(b); });
  for (const auto& [index, gpu] : gpus_) k.gpus.push_back(gpu);
  return k;
}

std::vector<InterfaceTotals> NodeTracker::totals() const {
  std::vector<InterfaceTotals> out;
  for (const auto& [name, i] : interfaces_) out.push_back(i.totals);
  return out;
}

std::vector<NetSample> NodeTracker::newestSamples() const {
  std::vector<NetSample> out;
  for (const auto& [name, i] : interfaces_) out.push_back(i.last);
  return out;
}

}  // namespace lockstep::kpi
