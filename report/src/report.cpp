#include "lockstep/report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "csv.h"
#include "projection.h"
#include "lockstep/common/files.h"
#include "settings.h"
#include "text.h"

namespace lockstep::report {
namespace {

using detail::compact;
using detail::dash;
using detail::figure;
using detail::kDash;
using detail::number;

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// A figure that crossed a threshold, in whole percent; with one decimal where rounding would make it
// read as the threshold itself ("15.0%", not "15%", for 0.1504 above 15%).
std::string percentPast(double valuePct, double thresholdPct) {
  return number(valuePct, std::round(valuePct) == std::round(thresholdPct) ? 1 : 0) + "%";
}

// "rank exited": the JSON's name, for people.
std::string eventName(JobEventKind kind) {
  std::string name(jobEventKindName(kind));
  std::replace(name.begin(), name.end(), '_', ' ');
  return name;
}


// The share of step time the ranks spend waiting for data: over the ranks' last window when known,
// else over the recorded step splits.
kpi::Maybe dataWaitShare(const ReportData& data) {
  double dataUs = 0, stepUs = 0;
  for (const auto& r : data.kpis.ranks) {
    if (r.meanDataUs && r.meanStepUs) {
      dataUs += *r.meanDataUs;
      stepUs += *r.meanStepUs;
    }
  }
  if (stepUs > 0) return dataUs / stepUs;
  double d = 0, total = 0;
  for (const auto& s : data.stepSplits) {
    d += s.dataMs;
    total += s.dataMs + s.computeMs + s.exposedMs;
  }
  if (total > 0) return d / total;
  return std::nullopt;
}

bool ended(const history::JobRecord& job) {
  return job.endedUnixUs != 0 || job.state == JobState::kFinished || job.state == JobState::kFailed ||
         job.state == JobState::kStopped;
}

std::vector<kpi::Point> toVector(const std::deque<kpi::Point>& points) { return {points.begin(), points.end()}; }

void addMissing(std::vector<std::string>& missing, std::string what) {
  if (std::find(missing.begin(), missing.end(), what) == missing.end()) missing.push_back(std::move(what));
}

std::vector<std::string> missingOf(const ReportData& data) {
  const JobSpec& spec = data.job.spec;
  const kpi::JobKpis& k = data.kpis;
  std::vector<std::string> missing = k.missing;
  const bool stepsSeen = k.step > 0 || !k.ranks.empty();
  if (!stepsSeen) {
    addMissing(
        missing,
        "step reports (no rank reported a step: throughput, communication, load imbalance and loss are unknown)");
  } else {
    if (!k.samplesPerSecond) addMissing(missing, "throughput over the last 10 s (no step report in that window)");
    if (!k.commOverhead) addMissing(missing, "communication overhead (no step times in the last 10 s)");
    if (!k.loadImbalance) addMissing(missing, "load imbalance (no step that every rank completed in the last 10 s)");
    if (!k.lastGlobalLoss) addMissing(missing, "loss (no finite global loss was reported)");
  }
  if (stepsSeen && !k.scalingEfficiency) {
    addMissing(missing, "scaling efficiency (no calibration run and no compute times to estimate it from)");
  }
  if (spec.backend == Backend::kCpu && !k.gpuUtilizationPct) {
    addMissing(missing, "GPU utilization (a CPU job uses no GPUs)");
  }
  if (!spec.targetLoss) addMissing(missing, "time to convergence (the job has no target loss)");
  if (!spec.prices.anySet())
    addMissing(missing, "cost (no prices were set for this job)");
  else if (!k.costComplete)
    addMissing(missing, "part of the cost (a priced quantity was not measured; the cost leaves it out)");
  return missing;
}

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

Result<Format> parseFormat(std::string_view name) {
  const std::string n = lower(name);
  if (n == "csv") return Format::kCsv;
  if (n == "json") return Format::kJson;
  if (n == "html") return Format::kHtml;
  if (n == "pdf") return Format::kPdf;
  return invalidArgument("unknown report format '" + std::string(name) + "': use csv, json, html or pdf");
}

std::optional<Format> formatOfPath(std::string_view path) {
  const std::size_t dot = path.rfind('.');
  const std::size_t slash = path.rfind('/');
  if (dot == std::string_view::npos || (slash != std::string_view::npos && dot < slash)) return std::nullopt;
  const std::string ext = lower(path.substr(dot + 1));
  if (ext == "htm") return Format::kHtml;
  auto format = parseFormat(ext);
  if (!format) return std::nullopt;
  return *format;
}

std::string_view formatName(Format format) {
  switch (format) {
    case Format::kCsv:
      return "csv";
    case Format::kJson:
      return "json";
    case Format::kHtml:
      return "html";
    case Format::kPdf:
      return "pdf";
  }
  return "unknown";
}

Result<ReportData> load(const history::History& history, const std::string& jobId, std::int64_t nowUnixUs) {
  ReportData data;
  data.generatedUnixUs = nowUnixUs;
  LOCKSTEP_ASSIGN_OR_RETURN(data.job, history.job(jobId));
  LOCKSTEP_ASSIGN_OR_RETURN(auto tracker, history.tracker(jobId));
  // At the job's end; a rank's last report can be stamped after the agent saw the job end, and the
  // KPIs' window must include it.
  const std::int64_t at =
      data.job.endedUnixUs > 0 ? std::max(data.job.endedUnixUs, tracker->lastReportUnixUs()) : nowUnixUs;
  data.kpis = tracker->snapshot(at);
  const kpi::JobKpis& k = data.kpis;
  data.meanSamplesPerSecond = k.meanSamplesPerSecond;
  data.throughput = toVector(tracker->throughputSeries());
  data.loss = toVector(tracker->lossSeries());
  data.stepSplits.assign(tracker->stepSplits().begin(), tracker->stepSplits().end());
  data.utilizationIsGpu = !tracker->gpuUtilizationSeries().empty();
  if (data.utilizationIsGpu) {
    for (const auto& [key, points] : tracker->gpuUtilizationSeries()) {
      data.utilization.push_back({key.first + ":" + std::to_string(key.second), toVector(points)});
    }
  } else {
    for (const auto& [rank, points] : tracker->cpuPercentSeries()) {
      data.utilization.push_back({"rank " + std::to_string(rank), toVector(points)});
    }
  }
  LOCKSTEP_ASSIGN_OR_RETURN(data.events, history.events(jobId));
  std::vector<std::string> nodes;
  for (const auto& part : data.job.parts) nodes.push_back(part.node);
  LOCKSTEP_ASSIGN_OR_RETURN(auto peak, history.peakBusBandwidth(nodes, jobId));
  if (peak) data.bandwidthReference = BandwidthReference{peak->bytesPerSecond, "the peak job " + peak->jobId + " reached on these nodes"};
  data.missing = missingOf(data);
  data.recommendations = recommendations(data);
  return data;
}

std::vector<std::string> recommendations(const ReportData& data) {
  const JobSpec& spec = data.job.spec;
  const kpi::JobKpis& k = data.kpis;
  std::vector<std::string> out;

  if (const auto diagnosis = diagnoseCommunication(k, spec, data.bandwidthReference)) out.push_back(diagnosis->advice);

  if (k.loadImbalance && *k.loadImbalance > 1.15 && k.slowestRank) {
    std::string node;
    for (const auto& r : k.ranks) {
      if (r.rank == *k.slowestRank) node = r.node;
    }
    std::string text = "Load imbalance is " + number(*k.loadImbalance, 2) +
                       "× (the slowest compute time per step over the median rank's): rank " +
                       std::to_string(*k.slowestRank) + (node.empty() ? "" : " on " + node) + " is the slowest";
    switch (k.slowestCause) {
      case kpi::SlowCause::kDataWait:
        text +=
            ", waiting for data: give it more data loader threads or faster storage (or keep the data set in memory).";
        break;
      case kpi::SlowCause::kCompute:
        text +=
            ", computing: its hardware is slower or shared; check for a slower or throttled GPU or CPU, or other work "
            "on " +
            (node.empty() ? std::string("its node") : node) + ".";
        break;
      case kpi::SlowCause::kCommunication:
        text += ", communicating: check the network link of " + (node.empty() ? std::string("its node") : node) + ".";
        break;
      case kpi::SlowCause::kUnknown:
        text += ".";
        break;
    }
    out.push_back(text);
  }

  if (k.gpuUtilizationPct && *k.gpuUtilizationPct < 70) {
    out.push_back("GPU utilization is " + percentPast(*k.gpuUtilizationPct, 70) + " (mean over " +
                  std::to_string(k.gpus.size()) + " GPU" + (k.gpus.size() == 1 ? "" : "s") +
                  " and the job): the GPUs wait for data, communication or the host; raise the per-rank batch (now " +
                  std::to_string(spec.batchPerRank) + ") so that each step gives them more work.");
  }

  if (k.scalingEfficiency && *k.scalingEfficiency < 0.8 && spec.worldSize > 1) {
    const std::string efficiency = percentPast(*k.scalingEfficiency * 100, 80);
    out.push_back("Scaling efficiency is " + efficiency + " with " + std::to_string(spec.worldSize) + " ranks (" +
                  std::string(kpi::scalingBasisName(k.scalingBasis)) + "): each rank delivers " + efficiency +
                  " of what it would alone; fewer ranks or a larger per-rank batch would use the hardware better.");
  }

  if (const auto share = dataWaitShare(data); share && *share > 0.10) {
    out.push_back("Waiting for data is " + percentPast(*share * 100, 10) +
                  " of step time: use more data loader threads or faster storage, or keep the data set in memory.");
  }

  for (const auto& r : k.ranks) {
    if (r.step > 0 && !r.loss) {
      out.push_back("The loss of rank " + std::to_string(r.rank) + " is not a number at step " +
                    std::to_string(r.step) + ": training diverged; lower the learning rate (now " +
                    compact(spec.optimizer.lr) + ") or check the data for bad values.");
      break;
    }
  }
  if (data.loss.size() >= 10) {
    // Means of the first and last tenth: single steps are too noisy to compare.
    const std::size_t tenth = data.loss.size() / 10;
    double first = 0, last = 0;
    for (std::size_t i = 0; i < tenth; ++i) {
      first += data.loss[i].y;
      last += data.loss[data.loss.size() - 1 - i].y;
    }
    first /= static_cast<double>(tenth);
    last /= static_cast<double>(tenth);
    if (last > first * 1.05 && last - first > 1e-6) {
      out.push_back("The loss rose from " + number(first, 4) + " to " + number(last, 4) +
                    " over the job: lower the learning rate (now " + compact(spec.optimizer.lr) + ").");
    }
  }

  if (spec.targetLoss && !k.timeToConvergenceSeconds && ended(data.job)) {
    out.push_back(
        (k.smoothedLoss ? "The smoothed loss (" + number(*k.smoothedLoss, 4) + ")" : std::string("The loss")) +
        " did not reach the target loss " + compact(*spec.targetLoss) + " in " +
        number(static_cast<double>(k.step), 0) + " steps: train for longer, or revisit the learning rate (now " +
        compact(spec.optimizer.lr) + ").");
  }

  if (!spec.prices.anySet()) {
    out.push_back(
        "No prices were set for this job, so its cost is unknown: give the price per GPU-hour, per CPU core-hour "
        "and per kWh when starting a job.");
  }
  return out;
}

std::vector<Chart> charts(const ReportData& data) {
  std::vector<Chart> out;

  Chart throughput;
  throughput.id = "throughput";
  throughput.title = "Training throughput";
  throughput.xLabel = "seconds since start";
  throughput.yLabel = "samples/s";
  throughput.series.push_back({"samples/s", data.throughput});
  out.push_back(std::move(throughput));

  Chart loss;
  loss.id = "loss";
  loss.title = "Global loss";
  loss.xLabel = "step";
  loss.yLabel = "loss";
  loss.series.push_back({"global loss", data.loss});
  out.push_back(std::move(loss));

  Chart split;
  split.id = "step_time";
  split.title = "Step time: data, compute, exposed communication (mean over ranks)";
  split.xLabel = "step";
  split.yLabel = "ms";
  split.kind = Chart::Kind::kStackedArea;
  Series dataWait{"data", {}}, compute{"compute", {}}, exposed{"exposed communication", {}};
  for (const auto& s : kpi::groupedSplits(data.stepSplits, 300)) {
    const auto x = static_cast<double>(s.step);
    dataWait.points.push_back({x, s.dataMs});
    compute.points.push_back({x, s.computeMs});
    exposed.points.push_back({x, s.exposedMs});
  }
  split.series = {std::move(dataWait), std::move(compute), std::move(exposed)};
  out.push_back(std::move(split));

  Chart util;
  util.id = "utilization";
  util.title = data.utilizationIsGpu ? "GPU utilization" : "CPU % per rank";
  util.xLabel = "seconds since start";
  util.yLabel = data.utilizationIsGpu ? "GPU utilization (%)" : "CPU (%)";
  util.series = data.utilization;
  // CPU % of a rank exceeds 100 with several BLAS threads; only GPU utilization has a fixed top.
  if (data.utilizationIsGpu) util.yMax = 100;
  out.push_back(std::move(util));

  Chart comm;
  comm.id = "communication";
  comm.title = "Communication overhead per rank";
  comm.xLabel = "rank";
  comm.yLabel = "% of step time";
  comm.kind = Chart::Kind::kBars;
  Series bars{"communication overhead", {}};
  for (const auto& r : data.kpis.ranks) {
    if (r.commOverhead) bars.points.push_back({static_cast<double>(comm.categories.size()), *r.commOverhead * 100});
    comm.categories.push_back(std::to_string(r.rank));
  }
  comm.series.push_back(std::move(bars));
  out.push_back(std::move(comm));
  return out;
}

Document document(const ReportData& data) {
  const history::JobRecord& job = data.job;
  const JobSpec& spec = job.spec;
  const kpi::JobKpis& k = data.kpis;
  Document doc;
  doc.title = "Job " + spec.jobId + (spec.name.empty() ? "" : " — " + spec.name);
  doc.subtitle = std::string(jobStateName(job.state));
  if (job.startedUnixUs > 0) doc.subtitle += " · started " + detail::displayTime(job.startedUnixUs);
  if (job.endedUnixUs > 0) doc.subtitle += " · ended " + detail::displayTime(job.endedUnixUs);
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
  kpis.rows.push_back(
      {"Communication overhead", detail::percent(k.commOverhead), "exposed all-reduce time / step time, last 10 s"});
  kpis.rows.push_back({"Waiting for the last rank", detail::percent(k.stragglerWaitShare) + " of exposed communication",
                       "per step, each rank's exposed time beyond the least any rank had; arrival skew " +
                           (k.arrivalSkewUs ? number(*k.arrivalSkewUs / 1e3, 2) + " ms" : dash()) + " per step, last 10 s"});
  kpis.rows.push_back({"All-reduce bandwidth", present::bandwidth(k.busBandwidth) + " bus, " + present::bandwidth(k.algBandwidth) + " algorithm",
                       "bytes all-reduced / reduction time, last 10 s, mean over ranks; bus = algorithm × 2(n−1)/n"});
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
  std::map<std::string, std::string> ranksOn;
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

  // Scaling: the workload with the most distinct rank counts among jobs with a known throughput.
  struct Group {
    std::map<std::uint32_t, std::vector<const history::JobRecord*>> byRanks;
    std::size_t order = 0;
  };
  std::map<std::string, Group> groups;
  for (const auto& job : jobs) {
    if (!meanThroughput(job)) continue;
    Group& g = groups[workloadKey(job.spec)];
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

Result<void> write(const history::History& history, const std::string& jobId, Format format, const std::string& path,
                   std::int64_t nowUnixUs) {
  const std::string context = "cannot write the " + std::string(formatName(format)) + " report " + path;
  switch (format) {
    case Format::kPdf:
      return invalidArgument(
          "a PDF report needs Qt: use report_pdf (writePdf) from the app, or write html and print it");
    case Format::kCsv: {
      LOCKSTEP_TRY(history.job(jobId));  // NotFound for an unknown job, before any file is written
      LOCKSTEP_ASSIGN_OR_RETURN(const std::string gpus, detail::gpuCsv(history, jobId));
      LOCKSTEP_ASSIGN_OR_RETURN(const std::string steps, detail::stepsCsv(history, jobId));
      const std::string gpuPath = gpuCsvPath(path);
      if (auto written = writeFileAtomic(gpuPath, gpus); !written) return written.error().withContext(context);
      if (auto written = writeFileAtomic(path, steps); !written) {
        // Half a report would be taken for a whole one.
        std::remove(gpuPath.c_str());
        return written.error().withContext(context);
      }
      return {};
    }
    case Format::kJson: {
      LOCKSTEP_ASSIGN_OR_RETURN(const ReportData data, load(history, jobId, nowUnixUs));
      if (auto written = writeFileAtomic(path, json(data)); !written) return written.error().withContext(context);
      return {};
    }
    case Format::kHtml: {
      LOCKSTEP_ASSIGN_OR_RETURN(const ReportData data, load(history, jobId, nowUnixUs));
      if (auto written = writeFileAtomic(path, html(document(data))); !written)
        return written.error().withContext(context);
      return {};
    }
  }
  return invalidArgument("unknown report format");
}

}  // namespace lockstep::report
