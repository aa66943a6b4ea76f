// A report's layout, shared by HTML and PDF: its sections, tables and charts (report.h).

#include <map>
#include <optional>
#include <set>

#include "lockstep/protocol/names.h"
#include "alerts_section.h"
#include "lockstep/report/report.h"
#include "network.h"
#include "projection.h"
#include "settings.h"
#include "text.h"

namespace lockstep::report {
namespace {

using detail::compact;
using detail::dash;
using detail::figure;
using detail::number;

// The job's stalls (docs/stalls.md): each diagnosis as it began, how it ended, and each stalled
// rank's evidence (its state, threads, stacks and log), at most kCodeLines lines each.
std::optional<Section> stallSection(const std::vector<JobEvent>& events) {
  constexpr std::size_t kCodeLines = 200;
  Section s;
  s.heading = "Stalls";
  for (const auto& e : events) {
    if (e.kind == JobEventKind::kStalled || e.kind == JobEventKind::kStallEnded) {
      s.paragraphs.push_back(detail::displayTime(e.timeUnixUs) + ": " + e.message);
    } else if (e.kind == JobEventKind::kRankEvidence) {
      std::string text = e.logTail.empty() ? e.message : e.logTail;
      std::size_t at = 0, lines = 0;
      while (lines < kCodeLines && (at = text.find('\n', at)) != std::string::npos) {
        ++at;
        ++lines;
      }
      if (lines == kCodeLines && at < text.size()) text = text.substr(0, at) + "[… the rest is in the JSON report]";
      s.code.push_back(std::move(text));
    }
  }
  if (s.paragraphs.empty() && s.code.empty()) return std::nullopt;
  return s;
}

// Model FLOPs utilization and what it was taken against (docs/kpis.md, MFU): the report says which
// peak it used.
std::vector<std::string> mfuRow(const kpi::JobKpis& k) {
  const std::string mfu = present::mfuText(k);
  if (mfu.empty()) return {"MFU", dash(), "no step report counted the model's FLOPs"};
  std::string how = "model FLOP/s over the peak of the ranks that have one, last 10 s";
  const std::string basis = present::mfuBasisText(k);
  if (!basis.empty()) how += "; " + basis;
  if (k.peakFlops && k.peakBasis.empty()) how += "; no agent said where its peak came from";
  return {"MFU", mfu, how};
}

// "rank exited": the JSON's name, for people.
std::string eventName(JobEventKind kind) {
  std::string name(jobEventKindName(kind));
  std::replace(name.begin(), name.end(), '_', ' ');
  return name;
}

}  // namespace

Document document(const ReportData& data) {
  const history::JobRecord& job = data.job;
  const JobSpec& spec = job.spec;
  const kpi::JobKpis& k = data.kpis;
  Document doc;
  doc.title = "Job " + spec.jobId + (spec.name.empty() ? "" : " — " + spec.name);
  doc.subtitle = std::string(jobStateName(job.state));
  if (job.startedUnixUs > 0) doc.subtitle += " · started " + detail::displayTime(job.startedUnixUs);
  if (job.endedUnixUs > 0) doc.subtitle += " · ended " + detail::displayTime(job.endedUnixUs);
  if (!job.owner.empty()) doc.subtitle += " · ran as " + job.owner;
  if (!spec.slurmJobId.empty()) {
    doc.subtitle += " · Slurm job " + spec.slurmJobId +
                    (spec.allocatedGpus > 0 ? " (" + std::to_string(spec.allocatedGpus) + " GPUs allocated)" : "");
  }
  doc.subtitle += " · report generated " + detail::displayTime(data.generatedUnixUs);

  // ---- Summary ----
  Section summary;
  summary.heading = "Summary";
  if (!job.message.empty()) summary.paragraphs.push_back(job.message);
  Table kpis{"Key figures", {"KPI", "Value", "How it was obtained"}, {}};
  kpis.rows.push_back({"Training throughput",
                       present::figure(data.meanSamplesPerSecond, 0, " samples/s"),
                       std::string(present::jobThroughputMeaning(true))});
  kpis.rows.push_back({"Throughput at the end", present::figure(k.samplesPerSecond, 0, " samples/s"),
                       std::string(present::jobThroughputMeaning(false))});
  kpis.rows.push_back({"Scaling efficiency", detail::percent(k.scalingEfficiency),
                       k.scalingEfficiency ? std::string(kpi::scalingBasisName(k.scalingBasis)) : "not known"});
  kpis.rows.push_back({"GPU utilization", figure(k.gpuUtilizationPct, 0, "%"),
                       k.gpuUtilizationPct             ? "mean over the job's GPUs and time"
                       : spec.backend == Backend::kCpu ? "a CPU job"
                                                       : "no GPU samples"});
  kpis.rows.push_back(mfuRow(k));
  kpis.rows.push_back({"Communication overhead", detail::percent(k.commOverhead),
                       "exposed communication time / step time, last 10 s"});
  // Its split by kind: each kind's exposed and whole time, count, bytes and bus bandwidth a step.
  for (const auto& c : k.collectives) {
    kpis.rows.push_back({"  " + std::string(titleOf(c.kind)), detail::collectiveShares(c),
                         detail::collectiveSizes(c) + "; mean over ranks, last 10 s"});
  }
  kpis.rows.push_back({"Waiting for the last rank", detail::percent(k.stragglerWaitShare) + " of exposed communication",
                       "per step, each rank's exposed time beyond the least any rank had; arrival skew " +
                           (k.arrivalSkewUs ? number(*k.arrivalSkewUs / 1e3, 2) + " ms" : dash()) + " per step, last 10 s"});
  kpis.rows.push_back({"All-reduce bandwidth", present::bandwidth(k.busBandwidth) + " bus, " + present::bandwidth(k.algBandwidth) + " algorithm",
                       "bytes all-reduced / reduction time, last 10 s, mean over ranks; bus = algorithm × 2(n−1)/n"});
  if (const std::string state = present::modelStateText(k); !state.empty()) {
    kpis.rows.push_back({"Model state per rank", state,
                         "the most any rank's newest step report says it holds; staleness: updates between the "
                         "weights a gradient was computed on and its own update, last 10 s"});
  }
  std::string convergence = "no target loss";
  if (spec.targetLoss) {
    convergence =
        (k.timeToConvergenceSeconds ? "smoothed loss reached " : "not reached: target ") + compact(*spec.targetLoss);
  }
  kpis.rows.push_back({"Time to convergence",
                       k.timeToConvergenceSeconds ? detail::duration(*k.timeToConvergenceSeconds) : dash(),
                       convergence});
  std::string costNote = "no prices set";
  if (spec.prices.anySet()) {
    costNote = "spent";
    if (k.costProjected && k.totalSteps > k.step)
      costNote += "; projected " + present::money(*k.costProjected, spec.prices.currency);
    if (!k.costComplete) costNote += "; without unmeasured parts";
  }
  kpis.rows.push_back({"Cost per training job",
                       spec.prices.anySet() && k.costSoFar ? present::money(*k.costSoFar, spec.prices.currency) : dash(),
                       costNote});
  kpis.rows.push_back({"Cost of waiting", waitingText(k, spec.prices),
                       "the share of the ranks' step time spent in exposed communication (of it, waiting for the "
                       "last rank to arrive), of the cost and GPU-hours"});
  kpis.rows.push_back({"Energy", figure(k.energyKwh, 3, " kWh"),
                       k.energyKwh ? "NVML energy counters of the job's GPUs" : "no energy counter readings"});
  std::string slowest = "–";
  if (k.slowestRank) {
    slowest =
        "slowest rank " + std::to_string(*k.slowestRank) + " (" + std::string(kpi::slowCauseName(k.slowestCause)) + ")";
  }
  if (k.initialLoadImbalance) slowest += "; " + number(*k.initialLoadImbalance, 2) + "× over the first steps";
  if (spec.rebalanceEvery > 0) slowest += "; batch re-split every " + std::to_string(spec.rebalanceEvery) + " steps";
  kpis.rows.push_back({"Load imbalance", figure(k.loadImbalance, 2, "×"), slowest});
  kpis.rows.push_back({"Final loss", figure(k.smoothedLoss, 4),
                       k.lastGlobalLoss ? "smoothed (EMA 0.1); last global loss " + number(*k.lastGlobalLoss, 4)
                                        : std::string("smoothed (EMA 0.1)")});
  kpis.rows.push_back({"Steps",
                       number(static_cast<double>(k.step), 0) +
                           (k.totalSteps > 0 ? " of " + number(static_cast<double>(k.totalSteps), 0) : ""),
                       k.attempts > 1 ? std::to_string(k.attempts) + " attempts" : ""});
  kpis.rows.push_back(
      {"Elapsed", k.elapsedSeconds > 0 ? detail::duration(k.elapsedSeconds) : dash(), "first step to end"});
  kpis.rows.push_back({"GPU-hours / core-hours", figure(k.gpuHours, 2) + " / " + figure(k.coreHours, 2),
                       "GPUs × elapsed; measured CPU time of the ranks"});
  summary.tables.push_back(std::move(kpis));
  doc.sections.push_back(std::move(summary));

  // ---- Recommendations ----
  Section advice;
  advice.heading = "Recommendations";
  advice.bullets = data.recommendations;
  if (advice.bullets.empty()) advice.paragraphs.push_back("Nothing stands out: no figure crossed a threshold.");
  doc.sections.push_back(std::move(advice));

  // ---- Job spec ----
  Section specSection;
  specSection.heading = "Job spec";
  Table settings{"Settings", {"Setting", "Value"}, detail::specSettings(spec)};
  specSection.tables.push_back(std::move(settings));
  doc.sections.push_back(std::move(specSection));


  // ---- Nodes and GPUs ----
  Section nodes;
  nodes.heading = "Nodes and GPUs";
  Table nodeTable{"Nodes", {"Node", "Host", "CPU cores", "Memory", "GPUs", "Ranks", "Agent"}, {}};
  std::map<std::string, std::string, NaturalLess> ranksOn;
  for (const auto& p : spec.ranks) {
    std::string& text = ranksOn[p.node];
    text += (text.empty() ? "" : ", ") + std::to_string(p.rank) +
            (p.gpuIndex ? " (GPU " + std::to_string(*p.gpuIndex) + ")" : "");
  }
  std::set<std::string> listed;
  for (const auto& n : job.nodes) {
    std::string gpus;
    for (const auto& g : n.gpus) {
      gpus += (gpus.empty() ? "" : "; ") + std::to_string(g.index) + ": " + g.name + " (" +
              detail::bytes(static_cast<double>(g.memoryTotalBytes)) + ")";
    }
    nodeTable.rows.push_back({n.node, n.host, std::to_string(n.cpuCores),
                              detail::bytes(static_cast<double>(n.memoryTotalBytes)), gpus.empty() ? "none" : gpus,
                              ranksOn.count(n.node) ? ranksOn[n.node] : dash(), n.agentVersion});
    listed.insert(n.node);
  }
  for (const auto& [node, ranks] : ranksOn) {
    if (!listed.count(node)) nodeTable.rows.push_back({node, dash(), dash(), dash(), dash(), ranks, dash()});
  }
  nodes.tables.push_back(std::move(nodeTable));
  detail::addNetwork(nodes, data);
  doc.sections.push_back(std::move(nodes));

  // ---- Ranks ----
  Section ranks;
  ranks.heading = "Ranks";
  ranks.paragraphs.push_back("Rates and means over each rank's last 10 s of reports.");
  Table rankTable{"Per rank",
                  {"Rank", "Node", "Steps", "Rows/step", "Samples/s", "Comm", "Bus GB/s", "Data ms", "Compute ms",
                   "Exposed ms", "Step ms", "Loss", "CPU %", "RSS"},
                  {}};
  const auto ms = [](const kpi::Maybe& us) { return us ? number(*us / 1000, 1) : dash(); };
  for (const auto& r : k.ranks) {
    rankTable.rows.push_back({std::to_string(r.rank), r.node, number(static_cast<double>(r.step), 0),
                              figure(r.samplesPerStep, 0), figure(r.samplesPerSecond, 0), detail::percent(r.commOverhead),
                              r.busBandwidth ? number(*r.busBandwidth / 1e9, 2) : dash(), ms(r.meanDataUs),
                              ms(r.meanComputeUs), ms(r.meanExposedUs), ms(r.meanStepUs), figure(r.loss, 4),
                              figure(r.cpuPct, 0), r.rssBytes ? detail::bytes(*r.rssBytes) : dash()});
  }
  ranks.tables.push_back(std::move(rankTable));
  if (!k.gpus.empty()) {
    Table gpuTable{
        "GPUs",
        {"Node", "GPU", "Name", "Utilization", "Mean utilization", "Memory used", "Power", "Temperature", "Energy"},
        {}};
    for (const auto& g : k.gpus) {
      std::string name = dash();
      for (const auto& n : job.nodes) {
        for (const auto& info : n.gpus) {
          if (n.node == g.node && info.index == g.index) name = info.name;
        }
      }
      gpuTable.rows.push_back(
          {g.node, std::to_string(g.index), name, figure(g.utilizationPct, 0, "%"),
           figure(g.meanUtilizationPct, 0, "%"), g.memoryUsedBytes ? detail::bytes(*g.memoryUsedBytes) : dash(),
           figure(g.powerWatts, 0, " W"), figure(g.temperatureC, 0, " °C"), figure(g.energyKwh, 3, " kWh")});
    }
    ranks.tables.push_back(std::move(gpuTable));
  }
  doc.sections.push_back(std::move(ranks));

  doc.sections.push_back(detail::projectionSection(data));

  // ---- Charts ----
  Section chartSection;
  chartSection.heading = "Charts";
  chartSection.charts = charts(data);
  doc.sections.push_back(std::move(chartSection));

  if (auto alerts = detail::alertSection(data)) doc.sections.push_back(std::move(*alerts));
  if (auto stalls = stallSection(data.events)) doc.sections.push_back(std::move(*stalls));

  // ---- Events ----
  Section events;
  events.heading = "Events";
  Table eventTable{"Events", {"Time", "Event", "Rank", "Message"}, {}};
  for (const auto& e : data.events) {
    // The agent's message usually says it already; add what it leaves out.
    std::string message = e.message;
    const auto add = [&](const std::string& what) {
      if (message.find(what) == std::string::npos) message += (message.empty() ? "" : " ") + ("(" + what + ")");
    };
    if (e.exitCode) add("exit code " + std::to_string(*e.exitCode));
    if (e.signal) add("signal " + std::to_string(*e.signal));
    if (e.step) add("at step " + std::to_string(*e.step));
    eventTable.rows.push_back(
        {detail::displayTime(e.timeUnixUs), eventName(e.kind), e.rank ? std::to_string(*e.rank) : dash(), message});
  }
  if (eventTable.rows.empty()) {
    events.paragraphs.push_back("No events were recorded.");
  } else {
    events.tables.push_back(std::move(eventTable));
  }
  doc.sections.push_back(std::move(events));

  // ---- Missing data ----
  Section missing;
  missing.heading = "Missing data";
  missing.bullets = data.missing;
  if (missing.bullets.empty()) missing.paragraphs.push_back("Everything was measured.");
  doc.sections.push_back(std::move(missing));
  return doc;
}

}  // namespace lockstep::report
