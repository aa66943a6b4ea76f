#include "projection.h"

#include <algorithm>

#include "text.h"

namespace lockstep::report::detail {
namespace {

std::string ms(double us) { return number(us / 1e3, 1) + " ms"; }

// The cores of the node a job's first rank ran on, as its agent said (0: not known).
std::uint32_t firstNodeCores(const history::JobRecord& job) {
  if (job.spec.ranks.empty()) return 0;
  for (const auto& n : job.nodes) {
    if (n.node == job.spec.ranks.front().node) return n.cpuCores;
  }
  return 0;
}

std::string basis(const kpi::ScalingInputs& in) {
  std::string text = "From this job's step at " + std::to_string(in.ranks) + (in.ranks == 1 ? " rank" : " ranks") +
                     ": data + compute " + ms(in.busyUs) + ", the rest of the step " + ms(in.otherUs) +
                     ", exposed communication " + ms(in.exposedUs);
  if (in.bytesPerStep && in.busBandwidth) {
    text += "; " + bytes(*in.bytesPerStep) + " all-reduced per step at a bus bandwidth of " + present::bandwidth(in.busBandwidth);
  }
  text += in.sharedNode ? ". Its ranks share one node's " +
                             (in.nodeCores > 0 ? std::to_string(in.nodeCores) + " cores" : std::string("cores")) +
                             ": at m ranks each has 1/m of them, so its compute and its all-reduce take m/" +
                             std::to_string(in.ranks) + " the time, and adding ranks to the node buys nothing"
                       : ". Each rank keeps its batch and its compute time";
  return text +
         "; the all-reduce keeps its bus bandwidth, so its time grows with 2(m−1)/m, and what hid behind compute "
         "hides at any m (docs/kpis.md). A projection, not a measurement: a slower link between nodes than within "
         "one is not in it.";
}

}  // namespace

std::optional<Projection> projection(const ReportData& data) {
  const auto in = kpi::scalingInputs(data.kpis, data.job.spec, firstNodeCores(data.job));
  if (!in) return std::nullopt;
  return Projection{*in, kpi::project(*in, kpi::projectionRanks(in->ranks))};
}

Section projectionSection(const ReportData& data) {
  Section s;
  s.heading = "What more ranks would buy";
  const auto projected = projection(data);
  if (!projected) {
    s.paragraphs.push_back("No projection: it needs steps with their data, compute and communication times.");
    return s;
  }
  const kpi::ScalingInputs& in = projected->in;
  s.paragraphs.push_back(basis(in));
  if (projected->rows.size() <= 1) {
    s.paragraphs.push_back(in.ranks == 1 ? "A 1-rank job has no all-reduce to measure: a run of 2 ranks or more gives the projection its bandwidth."
                                          : "Its steps carry no timed all-reduce (bytes and time) to project the communication from.");
    return s;
  }
  const Prices& prices = data.job.spec.prices;
  Table table{"Projected", {"Ranks", "Step time", "Exposed communication", "Throughput", "Efficiency vs 1 rank", "Cost per job"}, {}};
  Series line{"projected", {}};
  for (const auto& p : projected->rows) {
    table.rows.push_back({std::to_string(p.ranks) + (p.ranks == in.ranks ? " (measured)" : ""), ms(p.stepUs),
                          ms(p.exposedUs), number(p.samplesPerSecond, 0) + " samples/s", percent(p.efficiency, 0),
                          prices.anySet() && p.costPerJob ? present::money(*p.costPerJob, prices.currency) : dash()});
    line.points.push_back({static_cast<double>(p.ranks), p.samplesPerSecond});
  }
  s.tables.push_back(std::move(table));
  Chart chart;
  chart.id = "projection";
  chart.title = "Projected throughput against ranks";
  chart.xLabel = "ranks";
  chart.yLabel = "samples/s";
  chart.series.push_back(std::move(line));
  if (data.kpis.samplesPerSecond) {
    chart.series.push_back({"measured (last 10 s)", {{static_cast<double>(in.ranks), *data.kpis.samplesPerSecond}}});
  }
  s.charts.push_back(std::move(chart));
  return s;
}

std::optional<Series> projectedScaling(std::span<const history::JobRecord* const> oneRank,
                                       const history::JobRecord& largest, std::uint32_t upTo) {
  if (!largest.finalKpis) return std::nullopt;
  auto in = kpi::scalingInputs(*largest.finalKpis, largest.spec, firstNodeCores(largest));
  if (!in) return std::nullopt;
  for (const auto* one : oneRank) {
    if (!one->finalKpis) continue;
    if (const auto step = kpi::scalingInputs(*one->finalKpis, one->spec)) {
      in = kpi::withStepOf(*in, *step);
      break;
    }
  }
  std::vector<std::uint32_t> ranks;
  for (std::uint32_t m = 1; m <= upTo; m *= 2) ranks.push_back(m);
  if (std::find(ranks.begin(), ranks.end(), in->ranks) == ranks.end()) ranks.push_back(in->ranks);
  std::sort(ranks.begin(), ranks.end());
  Series s{std::string(kProjectedSeries), {}};
  for (const auto& p : kpi::project(*in, ranks)) s.points.push_back({static_cast<double>(p.ranks), p.samplesPerSecond});
  if (s.points.size() < 2) return std::nullopt;
  return s;
}

}  // namespace lockstep::report::detail
