#include "network.h"

#include <algorithm>

#include "text.h"

namespace lockstep::report::detail {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::size_t kChartNodes = 8;

double meanRate(std::uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }

// The interface of a node that carried the most, if it carried anything.
const kpi::InterfaceTotals* busiestInterface(const NodeNetwork& node) {
  const kpi::InterfaceTotals* best = nullptr;
  for (const auto& i : node.interfaces) {
    if (!best || i.rxBytes + i.txBytes > best->rxBytes + best->txBytes) best = &i;
  }
  return best;
}

}  // namespace

std::vector<NodeNetwork> networkOf(const std::map<std::string, kpi::NodeTracker, NaturalLess>& nodes) {
  std::vector<NodeNetwork> out;
  for (const auto& [name, tracker] : nodes) {
    NodeNetwork n;
    n.node = name;
    n.interfaces = tracker.totals();
    for (const auto& [interface, points] : tracker.networkSeries()) n.series[interface].assign(points.begin(), points.end());
    out.push_back(std::move(n));
  }
  return out;
}

void addNetwork(Section& s, const ReportData& data) {
  if (data.network.empty()) {
    s.paragraphs.push_back("No network samples were recorded for this job's nodes.");
    return;
  }
  s.paragraphs.push_back(
      "Network: each node's interfaces from the job's start to its end, as the kernel counts them: everything they "
      "carried, the job's traffic and any other. Loopback is not sampled, so ranks that talk within one node show no "
      "traffic here.");
  Table t{"Network interfaces",
          {"Node", "Interface", "Link", "Received", "Sent", "Mean \u2193", "Mean \u2191", "Peak \u2193", "Peak \u2191",
           "Peak use of link", "Errors, drops"},
          {}};
  for (const auto& node : data.network) {
    for (const auto& i : node.interfaces) {
      const auto use = kpi::linkUse(i.peakRxBytesPerSecond, i.peakTxBytesPerSecond, i.linkBitsPerSecond);
      t.rows.push_back({node.node, i.interface,
                        i.linkBitsPerSecond ? kpi::formatBitsPerSecond(static_cast<double>(*i.linkBitsPerSecond)) : dash(),
                        bytes(static_cast<double>(i.rxBytes)), bytes(static_cast<double>(i.txBytes)),
                        present::bitRate(meanRate(i.rxBytes, i.seconds)), present::bitRate(meanRate(i.txBytes, i.seconds)),
                        present::bitRate(i.peakRxBytesPerSecond), present::bitRate(i.peakTxBytesPerSecond), use ? percent(*use) : dash(),
                        std::to_string(i.errors)});
    }
  }
  s.tables.push_back(std::move(t));
  if (auto chart = networkChart(data)) s.charts.push_back(std::move(*chart));
}

std::optional<Chart> networkChart(const ReportData& data) {
  // The nodes whose busiest interface carried the most, shown in natural order.
  std::vector<std::pair<const NodeNetwork*, const kpi::InterfaceTotals*>> busiest;
  for (const auto& node : data.network) {
    if (const auto* i = busiestInterface(node); i && node.series.count(i->interface)) busiest.emplace_back(&node, i);
  }
  if (busiest.empty()) return std::nullopt;
  std::stable_sort(busiest.begin(), busiest.end(), [](const auto& a, const auto& b) {
    return a.second->rxBytes + a.second->txBytes > b.second->rxBytes + b.second->txBytes;
  });
  if (busiest.size() > kChartNodes) busiest.resize(kChartNodes);
  std::stable_sort(busiest.begin(), busiest.end(), [](const auto& a, const auto& b) { return naturalLess(a.first->node, b.first->node); });

  double peak = 0;
  for (const auto& [node, i] : busiest) peak = std::max({peak, i->peakRxBytesPerSecond, i->peakTxBytesPerSecond});
  const double scale = 8 * peak >= 1e9 ? 1e9 : 8 * peak >= 1e6 ? 1e6 : 1e3;
  const char* unit = scale == 1e9 ? "Gb/s" : scale == 1e6 ? "Mb/s" : "kb/s";
  Chart chart;
  chart.id = "network";
  chart.title = "Network: each node's busiest interface" +
                std::string(data.network.size() > busiest.size() ? " (the " + std::to_string(busiest.size()) + " busiest nodes)" : "");
  chart.xLabel = "seconds since start";
  chart.yLabel = unit;
  const double startUs = static_cast<double>(data.job.startedUnixUs);
  for (const auto& [node, i] : busiest) {
    Series rx{node->node + " " + i->interface + " \u2193", {}}, tx{node->node + " " + i->interface + " \u2191", {}};
    for (const auto& p : node->series.at(i->interface)) {
      const double x = (static_cast<double>(p.timeUnixUs) - startUs) / 1e6;
      rx.points.push_back({x, 8 * p.rxBytesPerSecond / scale});
      tx.points.push_back({x, 8 * p.txBytesPerSecond / scale});
    }
    chart.series.push_back(std::move(rx));
    chart.series.push_back(std::move(tx));
  }
  return chart;
}

Json networkJson(const ReportData& data) {
  Json nodes = Json::array();
  for (const auto& node : data.network) {
    Json interfaces = Json::array();
    for (const auto& i : node.interfaces) {
      Json series = Json::array();
      if (auto it = node.series.find(i.interface); it != node.series.end()) {
        for (const auto& p : it->second) series.push_back(Json::array({p.timeUnixUs, p.rxBytesPerSecond, p.txBytesPerSecond}));
      }
      interfaces.push_back({{"interface", i.interface},
                            {"link_bits_per_second", i.linkBitsPerSecond ? Json(*i.linkBitsPerSecond) : Json(nullptr)},
                            {"seconds", i.seconds},
                            {"rx_bytes", i.rxBytes},
                            {"tx_bytes", i.txBytes},
                            {"mean_rx_bytes_per_second", meanRate(i.rxBytes, i.seconds)},
                            {"mean_tx_bytes_per_second", meanRate(i.txBytes, i.seconds)},
                            {"peak_rx_bytes_per_second", i.peakRxBytesPerSecond},
                            {"peak_tx_bytes_per_second", i.peakTxBytesPerSecond},
                            {"errors_and_drops", i.errors},
                            {"series", std::move(series)}});
    }
    nodes.push_back({{"node", node.node}, {"interfaces", std::move(interfaces)}});
  }
  return nodes;
}

}  // namespace lockstep::report::detail
