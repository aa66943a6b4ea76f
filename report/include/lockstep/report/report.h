#pragma once
// KPI reports of one job, from the history: CSV (time series), JSON (summary KPIs plus series,
// docs/report.schema.json), HTML (one self-contained file, charts as inline SVG) and, through
// report_pdf.h (Qt), PDF. Also the comparison of several jobs with a scaling chart.
//
// A report says what it does not know: a KPI that was not measured is written as missing (JSON
// null, "–" in tables) and listed with the reason, never as 0. No Qt here.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/alerts/alert.h"
#include "lockstep/common/natural.h"
#include "lockstep/common/result.h"
#include "lockstep/history/history.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/node.h"
#include "lockstep/kpi/timeline.h"
#include "lockstep/report/diagnosis.h"

namespace lockstep::report {

enum class Format { kCsv, kJson, kHtml, kPdf };
Result<Format> parseFormat(std::string_view name);           // "csv", "json", "html", "pdf"
std::optional<Format> formatOfPath(std::string_view path);  // by extension
std::string_view formatName(Format format);

// ---- what a report holds ----

struct Series {
  std::string name;
  std::vector<kpi::Point> points;
};

// The ranks' steps in a window of the job (kpi/timeline.h), for the report's timeline figure.
struct TimelineFigure {
  std::int64_t fromUs = 0, toUs = 0;  // the window, on the recording client's clock
  std::int64_t zeroUs = 0;            // the job's first step's start: the axis counts from it
  struct Lane {
    std::string label;
    std::vector<kpi::Box> boxes;  // within the window
    std::vector<std::pair<kpi::Box, std::string>> phases;  // the named phases within it, over the boxes
    std::vector<kpi::CollectiveBox> collectives;            // the collectives within it, over the boxes
  };
  std::vector<Lane> lanes;
  std::size_t ranks = 0;  // of the job: lanes may show only some
};

struct Chart {
  enum class Kind { kLine, kStackedArea, kBars, kTimeline };
  std::string id;  // stable: "throughput", "loss", "step_time", "utilization", "communication", "scaling"
  std::string title, xLabel, yLabel;
  Kind kind = Kind::kLine;
  std::vector<Series> series;           // kBars: one series, x = index into categories
  std::vector<std::string> categories;  // kBars only
  std::optional<double> yMax;           // fixed top (percentages), else from the data
  std::optional<TimelineFigure> timeline;  // kTimeline only
};

// A node's network interfaces while the job ran (kpi/node.h): everything they carried, the job's
// traffic and any other, from the job's start to its end. Loopback is not sampled (docs/agent.md).
struct NodeNetwork {
  std::string node;
  std::vector<kpi::InterfaceTotals> interfaces;  // natural order
  // Each interface's throughput over time.
  std::map<std::string, std::vector<kpi::NetPoint>, NaturalLess> series;
};

struct ReportData {
  history::JobRecord job;
  kpi::JobKpis kpis;  // at the job's end (or now, for a job still running), with ranks and GPUs
  std::optional<double> meanSamplesPerSecond;  // start to end, start-up included
  std::vector<kpi::Point> throughput;          // samples/s against seconds since start
  std::vector<kpi::Point> loss;                // global loss against step
  std::vector<kpi::StepSplit> stepSplits;      // mean data / compute / exposed ms per step
  bool utilizationIsGpu = false;               // else: CPU % per rank
  std::vector<Series> utilization;             // per GPU ("node:index") or per rank ("rank N")
  std::vector<JobEvent> events;
  // The job's alerts (docs/alerts.md), from its events: each change (firing, resolved) as its
  // supervising agent raised it, in time order; and the webhooks that did not take one.
  std::vector<alerts::Alert> alerts;
  std::vector<JobEvent> undeliveredAlerts;
  std::vector<NodeNetwork> network;            // the job's nodes, natural order
  std::vector<std::string> missing;            // what could not be measured, in words
  // What the job's bus bandwidth is held against (the peak other jobs reached on its nodes).
  std::optional<BandwidthReference> bandwidthReference;
  std::vector<std::string> recommendations;    // plain advice drawn from the figures
  std::optional<TimelineFigure> timeline;      // the slowest minute; none without steps
  std::int64_t generatedUnixUs = 0;
};

// Reads everything a report needs. NotFound for an unknown job.
Result<ReportData> load(const history::History& history, const std::string& jobId, std::int64_t nowUnixUs);
// Advice from the figures, e.g. "Communication is 41% of step time: raise the per-rank batch or
// the bucket size." Empty when nothing stands out.
std::vector<std::string> recommendations(const ReportData& data);
std::vector<Chart> charts(const ReportData& data);

// ---- one layout for HTML and PDF ----

struct Table {
  std::string title;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

struct Section {
  std::string heading;
  std::vector<std::string> paragraphs;
  std::vector<Table> tables;
  std::vector<std::string> bullets;
  std::vector<Chart> charts;
  std::vector<std::string> code;  // monospaced blocks, line for line (a rank's stacks)
};

struct Document {
  std::string title;
  std::string subtitle;
  std::vector<Section> sections;
};

Document document(const ReportData& data);

// ---- renderers (pure: strings; writing files is write()'s job) ----

std::string svg(const Chart& chart, int width, int height);  // a standalone <svg> element
std::string html(const Document& document);                   // self-contained: CSS and SVG inline
std::string json(const ReportData& data);                     // docs/report.schema.json
// CSV: one row per rank per step; the GPU samples go to a second file, `gpuCsvPath(path)`, and
// the nodes' network samples to a third, `networkCsvPath(path)`.
std::string gpuCsvPath(const std::string& path);      // report.csv -> report-gpus.csv
std::string networkCsvPath(const std::string& path);  // report.csv -> report-network.csv

// Writes a CSV, JSON or HTML report atomically (a temp file renamed into place; no half-written
// file on failure). PDF needs Qt: report_pdf.h.
Result<void> write(const history::History& history, const std::string& jobId, Format format, const std::string& path,
                   std::int64_t nowUnixUs);

// ---- comparing jobs ----

// Jobs with the same workload (model, data, per-rank batch, precision, optimizer, backend) differ
// only in their rank count, so their throughputs make a scaling curve.
using kpi::workloadKey;

// A command job's argv as a shell would read it back: words quoted where they need it.
std::string shellWord(const std::string& word);
std::string commandLine(const std::vector<std::string>& argv);

struct Comparison {
  Table kpis;  // a column per job
  // Present when at least two of the jobs share a workload at different rank counts: throughput
  // (samples/s) and scaling efficiency (%) against ranks, and how the efficiency was obtained.
  // The throughput chart's series: measured, ideal, and where the jobs allow one the projected
  // line (docs/kpis.md), named kProjectedSeries.
  std::optional<Chart> throughput;
  std::optional<Chart> efficiency;
  std::string scalingNote;
  // Where one workload ran under several kinds of data parallelism: which fits it, and why, with
  // what each other kind traded (a line each); empty otherwise.
  std::vector<std::string> advice;
};
inline constexpr std::string_view kProjectedSeries = "projected (docs/kpis.md)";
Comparison compare(std::span<const history::JobRecord> jobs);

}  // namespace lockstep::report
