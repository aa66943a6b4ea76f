#include "lockstep/report/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "csv.h"
#include "network.h"
#include "timeline_figure.h"
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
  LOCKSTEP_ASSIGN_OR_RETURN(history::Replay replayed, history.replayJob(jobId));
  const auto& tracker = replayed.job;
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
  for (const auto& e : data.events) {
    if (auto alert = alerts::alertOf(e)) data.alerts.push_back(std::move(*alert));
    if (e.kind == JobEventKind::kAlertUndelivered) data.undeliveredAlerts.push_back(e);
  }
  std::stable_sort(data.alerts.begin(), data.alerts.end(),
                   [](const auto& a, const auto& b) { return a.timeUs < b.timeUs; });
  data.network = detail::networkOf(replayed.nodes);
  std::vector<std::string> nodes;
  for (const auto& part : data.job.parts) nodes.push_back(part.node);
  LOCKSTEP_ASSIGN_OR_RETURN(auto peak, history.peakBusBandwidth(nodes, jobId));
  if (peak) data.bandwidthReference = BandwidthReference{peak->bytesPerSecond, "the peak job " + peak->jobId + " reached on these nodes"};
  LOCKSTEP_ASSIGN_OR_RETURN(data.timeline, detail::slowestMinuteFigure(history, data.job));
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

  if (data.timeline && !data.timeline->lanes.empty()) {
    const auto& t = *data.timeline;
    Chart timeline;
    timeline.id = "timeline";
    timeline.title = "The slowest minute, rank by rank" +
                     (t.lanes.size() < t.ranks ? " (the " + std::to_string(t.lanes.size()) + " slowest of " + std::to_string(t.ranks) + " ranks)"
                                               : std::string());
    timeline.xLabel = "seconds since the first step";
    timeline.kind = Chart::Kind::kTimeline;
    timeline.timeline = t;
    out.push_back(std::move(timeline));
  }
  return out;
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
      LOCKSTEP_ASSIGN_OR_RETURN(const std::string network, detail::networkCsv(history, jobId));
      LOCKSTEP_ASSIGN_OR_RETURN(const std::string steps, detail::stepsCsv(history, jobId));
      // The step file last: half a report would be taken for a whole one.
      const std::string others[] = {gpuCsvPath(path), networkCsvPath(path)};
      const std::string* texts[] = {&gpus, &network};
      for (std::size_t i = 0; i < 2; ++i) {
        if (auto written = writeFileAtomic(others[i], *texts[i]); !written) {
          for (std::size_t j = 0; j < i; ++j) std::remove(others[j].c_str());
          return written.error().withContext(context);
        }
      }
      if (auto written = writeFileAtomic(path, steps); !written) {
        for (const auto& other : others) std::remove(other.c_str());
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
