#pragma once
// The network under a job in its report: each node's interfaces while it ran, as a table, a chart
// and JSON. Private to report/.

#include <nlohmann/json.hpp>

#include "lockstep/report/report.h"

namespace lockstep::report::detail {

// The job's nodes' figures from its replay (history::Replay), in natural order.
std::vector<NodeNetwork> networkOf(const std::map<std::string, kpi::NodeTracker, NaturalLess>& nodes);

// Into the report's "Nodes and GPUs": what each node's interfaces carried, as a table and a chart.
void addNetwork(Section& nodes, const ReportData& data);
// Each node's busiest interface (of the 8 busiest nodes), received and sent, in bits/s against
// seconds since the start; empty without samples.
std::optional<Chart> networkChart(const ReportData& data);
nlohmann::ordered_json networkJson(const ReportData& data);

}  // namespace lockstep::report::detail
