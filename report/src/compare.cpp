// Comparing recorded jobs: their KPIs side by side, and scaling curves for one workload.

#include <algorithm>
#include <map>
#include <set>

#include "kind_advice.h"
#include "lockstep/report/report.h"
#include "projection.h"
#include "text.h"

namespace lockstep::report {
namespace {

using detail::dash;
using detail::figure;
using detail::number;

std::size_t distinctNodes(const history::JobRecord& job) {
  std::set<std::string> nodes;
  for (const auto& p : job.spec.ranks) nodes.insert(p.node);
  for (const auto& p : job.parts) nodes.insert(p.node);
  return nodes.size();
}

// The ended job's throughput, from its final KPIs.
kpi::Maybe meanThroughput(const history::JobRecord& job) {
  return job.finalKpis ? present::jobThroughput(*job.finalKpis, true) : std::nullopt;
}

}  // namespace

Comparison compare(std::span<const history::JobRecord> jobs) {
  Comparison c;
  c.kpis.title = "Jobs compared";
  c.kpis.header.push_back("");
  for (const auto& job : jobs) c.kpis.header.push_back(job.spec.jobId);
  const auto row = [&](std::string name, const auto& cell) {
    std::vector<std::string> r{std::move(name)};
    for (const auto& job : jobs) r.push_back(cell(job));
    c.kpis.rows.push_back(std::move(r));
  };
  const auto fromKpis = [](const auto& get) {
    return [get](const history::JobRecord& job) { return job.finalKpis ? get(*job.finalKpis) : dash(); };
  };
  row("Name", [](const history::JobRecord& j) { return j.spec.name.empty() ? dash() : j.spec.name; });
  row("Ranks", [](const history::JobRecord& j) { return std::to_string(j.spec.worldSize); });
  row("Nodes", [](const history::JobRecord& j) { return std::to_string(distinctNodes(j)); });
  row("State", [](const history::JobRecord& j) { return std::string(jobStateName(j.state)); });
  row("Data parallelism", [](const history::JobRecord& j) {
    return j.spec.isCommand() ? std::string("your own program") : present::parallelismText(j.spec);
  });
  row("Started",
      [](const history::JobRecord& j) { return j.startedUnixUs > 0 ? detail::displayTime(j.startedUnixUs) : dash(); });
  row("Throughput (samples/s, mean)", [](const history::JobRecord& j) {
    const auto t = meanThroughput(j);
    return t ? number(*t, 0) : dash();
  });
  row("Scaling efficiency", fromKpis([](const kpi::JobKpis& k) {
        return k.scalingEfficiency ? detail::percent(k.scalingEfficiency) + " (" +
                                         std::string(kpi::scalingBasisName(k.scalingBasis)) + ")"
                                   : dash();
      }));
  row("Communication overhead", fromKpis([](const kpi::JobKpis& k) { return detail::percent(k.commOverhead); }));
  row("GPU utilization", fromKpis([](const kpi::JobKpis& k) { return figure(k.gpuUtilizationPct, 0, "%"); }));
  row("MFU", fromKpis([](const kpi::JobKpis& k) { return detail::percent(k.mfu); }));
  row("Load imbalance", fromKpis([](const kpi::JobKpis& k) { return figure(k.loadImbalance, 2, "×"); }));
  row("Time to convergence", fromKpis([](const kpi::JobKpis& k) {
        return k.timeToConvergenceSeconds ? detail::duration(*k.timeToConvergenceSeconds) : dash();
      }));
  row("Cost", [](const history::JobRecord& j) {
    return j.finalKpis && j.finalKpis->costSoFar && j.spec.prices.anySet()
               ? present::money(*j.finalKpis->costSoFar, j.spec.prices.currency)
               : dash();
  });
  row("Energy", fromKpis([](const kpi::JobKpis& k) { return figure(k.energyKwh, 3, " kWh"); }));
  row("Final loss", fromKpis([](const kpi::JobKpis& k) { return figure(k.smoothedLoss, 4); }));
  const auto heldBytes = [&](const char* name, kpi::Maybe kpi::JobKpis::*held) {
    row(name, fromKpis([held](const kpi::JobKpis& k) { return k.*held ? detail::bytes(*(k.*held)) : dash(); }));
  };
  heldBytes("Parameters per rank", &kpi::JobKpis::paramBytesPerRank);
  heldBytes("Gradients per rank", &kpi::JobKpis::gradBytesPerRank);
  heldBytes("Optimizer state per rank", &kpi::JobKpis::optimizerStateBytesPerRank);
  row("Staleness (mean, p99)", fromKpis([](const kpi::JobKpis& k) {
        return k.stalenessMean ? figure(k.stalenessMean, 1) + ", " + figure(k.stalenessP99, 0) : dash();
      }));
  c.advice = detail::kindAdvice(jobs);

  // Scaling: the workload with the most distinct rank counts among jobs with a known throughput.
  struct Group {
    std::map<std::uint32_t, std::vector<const history::JobRecord*>> byRanks;
    std::size_t order = 0;
  };
  std::map<std::string, Group> groups;
  for (const auto& job : jobs) {
    if (!meanThroughput(job)) continue;
    // One curve per kind of data parallelism too: a parameter server's scaling is not all-reduce's.
    Group& g = groups[workloadKey(job.spec) + " " + present::parallelismText(job.spec)];
    if (g.byRanks.empty()) g.order = groups.size();
    g.byRanks[job.spec.worldSize].push_back(&job);
  }
  const Group* best = nullptr;
  for (const auto& [key, g] : groups) {
    if (g.byRanks.size() < 2) continue;
    if (!best || g.byRanks.size() > best->byRanks.size() ||
        (g.byRanks.size() == best->byRanks.size() && g.order < best->order)) {
      best = &g;
    }
  }
  if (!best) {
    c.scalingNote =
        "No scaling chart: it needs at least two finished jobs of the same workload (model, data, per-rank "
        "batch, precision, optimizer, backend) at different rank counts.";
    return c;
  }

  // Several jobs at one rank count: their mean.
  std::vector<std::pair<std::uint32_t, double>> points;
  for (const auto& [ranks, list] : best->byRanks) {
    double sum = 0;
    for (const auto* job : list) sum += *meanThroughput(*job);
    points.emplace_back(ranks, sum / static_cast<double>(list.size()));
  }
  const auto [baseRanks, baseThroughput] = points.front();
  const double perRankBase = baseThroughput / baseRanks;

  Chart tp;
  tp.id = "scaling";
  tp.title = "Throughput against ranks";
  tp.xLabel = "ranks";
  tp.yLabel = "samples/s";
  const std::string baseName = std::to_string(baseRanks) + (baseRanks == 1 ? " rank" : " ranks");
  Series measured{"measured", {}};
  Series ideal{"ideal (linear from " + baseName + ")", {}};
  Chart eff;
  eff.id = "scaling_efficiency";
  eff.title = "Scaling efficiency against ranks";
  eff.xLabel = "ranks";
  eff.yLabel = "efficiency (%)";
  eff.yMax = 100;
  Series efficiency{"scaling efficiency", {}};
  for (const auto& [ranks, throughput] : points) {
    const auto n = static_cast<double>(ranks);
    measured.points.push_back({n, throughput});
    ideal.points.push_back({n, perRankBase * n});
    efficiency.points.push_back({n, throughput / n / perRankBase * 100});
  }
  tp.series = {std::move(measured), std::move(ideal)};
  const auto one = best->byRanks.find(1);
  const std::vector<const history::JobRecord*> none;
  const auto& largest = best->byRanks.rbegin()->second;
  auto projected = detail::projectedScaling(one == best->byRanks.end() ? none : one->second, *largest.front(),
                                            4 * best->byRanks.rbegin()->first);
  if (projected) tp.series.push_back(std::move(*projected));
  eff.series = {std::move(efficiency)};
  c.throughput = std::move(tp);
  c.efficiency = std::move(eff);

  const auto& baseJobs = best->byRanks.begin()->second;
  std::string ids;
  for (const auto* job : baseJobs) ids += (ids.empty() ? "" : ", ") + job->spec.jobId;
  const std::string jobWord = baseJobs.size() == 1 ? " job " : " jobs ";
  if (baseRanks == 1) {
    c.scalingNote = "Scaling efficiency = (throughput with N ranks / N) / single-rank throughput, against the 1-rank" +
                    jobWord + ids + ".";
  } else {
    c.scalingNote = "No 1-rank job of this workload: scaling efficiency is relative to the smallest run, the " +
                    baseName + jobWord + ids + ": (throughput with N ranks / N) / (its throughput / " +
                    std::to_string(baseRanks) + "), so it reads 100% there.";
  }
  c.scalingNote +=
      " Throughput is each job's mean, start to end; several jobs at one rank count are averaged." +
      std::string(c.throughput->series.size() > 2 ? " The projected line is the steady rate the model of docs/kpis.md gives, from the "
                                         "1-rank job's step (where there is one) and the largest job's all-reduce." : "") +
      " "
      "Workload: " +
      workloadKey(baseJobs.front()->spec) + ".";
  return c;
}

}  // namespace lockstep::report
