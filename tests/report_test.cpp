// Issue 5: KPI reports. The SVG charts (well-formed, round ticks, escaping, many series, thinning),
// the HTML and JSON renderers (unknown KPIs are null, never 0; the JSON matches
// docs/report.schema.json), recommendations on their thresholds, the scaling comparison, and
// load()/write() over a real SQLite history.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "lockstep/history/history.h"
#include "lockstep/report/report.h"
#include "report_fixtures.h"
#include "support/test_support.h"

namespace lockstep::report {
namespace {

using namespace fixtures;
using test::TempDir;

// ---- a small XML well-formedness check (enough for the SVG we write) ----

bool entityAt(std::string_view text, std::size_t at) {
  const std::size_t semi = text.find(';', at);
  if (semi == std::string_view::npos || semi - at > 8) return false;
  const std::string_view name = text.substr(at + 1, semi - at - 1);
  if (name == "amp" || name == "lt" || name == "gt" || name == "quot" || name == "apos") return true;
  return name.size() > 1 && name[0] == '#' &&
         std::all_of(name.begin() + 1, name.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// Empty when well-formed: tags closed in order, attributes quoted, '&' only in entities.
std::string xmlProblem(std::string_view text) {
  std::vector<std::string> open;
  std::size_t i = 0;
  bool root = false;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '&') {
      if (!entityAt(text, i)) return "bare & at " + std::to_string(i);
      ++i;
      continue;
    }
    if (c == '>') return "stray > at " + std::to_string(i);
    if (c != '<') {
      ++i;
      continue;
    }
    std::size_t end = i + 1;
    char quote = 0;
    for (; end < text.size(); ++end) {
      if (quote) {
        if (text[end] == quote)
          quote = 0;
        else if (text[end] == '<')
          return "< inside an attribute at " + std::to_string(end);
        else if (text[end] == '&' && !entityAt(text, end))
          return "bare & in an attribute at " + std::to_string(end);
      } else if (text[end] == '"' || text[end] == '\'') {
        quote = text[end];
      } else if (text[end] == '>') {
        break;
      }
    }
    if (end >= text.size()) return "unterminated tag at " + std::to_string(i);
    std::string_view tag = text.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.starts_with('?') || tag.starts_with('!')) continue;
    if (tag.starts_with('/')) {
      const std::string name(tag.substr(1));
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
      continue;
    }
    const bool selfClosing = tag.ends_with('/');
    if (selfClosing) tag.remove_suffix(1);
    const std::size_t nameEnd = std::min(tag.find_first_of(" \t\n"), tag.size());
    const std::string name(tag.substr(0, nameEnd));
    if (name.empty()) return "empty tag name";
    // name="value" pairs.
    static const std::regex attributes(R"((\s+[A-Za-z_:][-A-Za-z0-9_:.]*="[^"]*")*\s*)");
    if (!std::regex_match(std::string(tag.substr(nameEnd)), attributes)) return "bad attributes in <" + name + ">";
    if (open.empty() && root) return "a second root element <" + name + ">";
    if (open.empty()) root = true;
    if (!selfClosing) open.push_back(name);
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  return "";
}

// The y axis labels: right-anchored texts.
std::vector<std::string> yTickLabels(const std::string& svgText) {
  static const std::regex label(R"re(text-anchor="end">([^<]*)</text>)re");
  std::vector<std::string> out;
  for (auto it = std::sregex_iterator(svgText.begin(), svgText.end(), label); it != std::sregex_iterator(); ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

double parseLabel(std::string label) {
  label.erase(std::remove(label.begin(), label.end(), ','), label.end());
  return std::stod(label);
}

Chart lineChart(const std::string& title, std::vector<kpi::Point> points) {
  Chart c;
  c.id = "throughput";
  c.title = title;
  c.xLabel = "seconds since start";
  c.yLabel = "samples/s";
  c.series.push_back({"samples/s", std::move(points)});
  return c;
}

// ---- SVG ----

TEST(ReportSvg, LineChartIsWellFormedWithSeriesTitlesAndThousandsSeparators) {
  std::vector<kpi::Point> points;
  for (int i = 0; i <= 100; ++i) points.push_back({static_cast<double>(i), 124.0 * i});  // up to 12,400
  const std::string out = svg(lineChart("Training throughput", points), 640, 300);
  EXPECT_EQ(xmlProblem(out), "") << out;
  EXPECT_TRUE(out.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_EQ(count(out, "<polyline"), 1u);
  EXPECT_NE(out.find(">Training throughput</text>"), std::string::npos);
  EXPECT_NE(out.find(">seconds since start</text>"), std::string::npos);
  EXPECT_NE(out.find(">samples/s</text>"), std::string::npos);
  EXPECT_NE(out.find(">10,000</text>"), std::string::npos) << out;
  EXPECT_NE(out.find("font-family=\"sans-serif\""), std::string::npos);
  // SVG Tiny 1.2 for QSvgRenderer: no style sheets, no classes, no dominant-baseline.
  EXPECT_EQ(out.find("<style"), std::string::npos);
  EXPECT_EQ(out.find("class="), std::string::npos);
  EXPECT_EQ(out.find("dominant-baseline"), std::string::npos);
  EXPECT_EQ(out.find("clipPath"), std::string::npos);
}

TEST(ReportSvg, TicksAreRoundAndCoverTheData) {
  for (const auto& [lo, hi] : std::vector<std::pair<double, double>>{
           {0, 97}, {0, 12400}, {0.5, 0.034}, {2.31, 2.25}, {-3, 7}, {1e6, 3.3e6}, {5, 5}, {0, 0}}) {
    const std::string out = svg(lineChart("t", {{0, lo}, {1, hi}}), 640, 300);
    ASSERT_EQ(xmlProblem(out), "");
    const auto labels = yTickLabels(out);
    ASSERT_GE(labels.size(), 2u) << lo << ".." << hi;
    std::vector<double> values;
    for (const auto& l : labels) values.push_back(parseLabel(l));
    const double step = values[1] - values[0];
    ASSERT_GT(step, 0);
    const double power = std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    const double mantissa = step / power;
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 || std::abs(mantissa - 5) < 1e-6)
        << "step " << step << " for " << lo << ".." << hi;
    for (std::size_t i = 1; i < values.size(); ++i) EXPECT_NEAR(values[i] - values[i - 1], step, step * 1e-6);
    EXPECT_LE(values.front(), std::min(lo, hi));
    EXPECT_GE(values.back(), std::max(lo, hi));
    EXPECT_LE(labels.size(), 9u);
  }
}

TEST(ReportSvg, RatesStartAtZeroAndTheLossFitsItsRange) {
  Chart c = lineChart("t", {{0, 2.31}, {1, 2.25}});
  EXPECT_EQ(yTickLabels(svg(c, 640, 300)).front(), "0");
  c.id = "loss";
  const auto labels = yTickLabels(svg(c, 640, 300));
  EXPECT_GE(parseLabel(labels.front()), 2.2);
  EXPECT_LE(parseLabel(labels.back()), 2.35);
}

TEST(ReportSvg, TickLabelsHaveTheDecimalsTheStepNeeds) {
  const auto labels = yTickLabels(svg(lineChart("t", {{0, 0.0}, {1, 0.034}}), 640, 300));
  EXPECT_NE(std::find(labels.begin(), labels.end(), "0.01"), labels.end());
  EXPECT_EQ(std::find(labels.begin(), labels.end(), "0.0"), labels.end());
  const auto whole = yTickLabels(svg(lineChart("t", {{0, 0.0}, {1, 97}}), 640, 300));
  EXPECT_NE(std::find(whole.begin(), whole.end(), "100"), whole.end());
  EXPECT_EQ(std::find(whole.begin(), whole.end(), "100.0"), whole.end());
}

TEST(ReportSvg, EscapesText) {
  Chart c = lineChart("loss <a> & \"b\"", {{0, 1}, {1, 2}});
  c.xLabel = "x<&>";
  c.series.push_back({"rank <1> & 'two'", {{0, 2}, {1, 3}}});
  const std::string out = svg(c, 640, 300);
  EXPECT_EQ(xmlProblem(out), "") << out;
  EXPECT_NE(out.find("loss &lt;a&gt; &amp; &quot;b&quot;"), std::string::npos);
  EXPECT_NE(out.find("x&lt;&amp;&gt;"), std::string::npos);
  EXPECT_NE(out.find("rank &lt;1&gt; &amp; &#39;two&#39;"), std::string::npos);
  EXPECT_EQ(out.find("<a>"), std::string::npos);
}

TEST(ReportSvg, EmptyChartSaysNoData) {
  Chart c = lineChart("Loss", {});
  const std::string out = svg(c, 640, 300);
  EXPECT_EQ(xmlProblem(out), "");
  EXPECT_NE(out.find(">no data</text>"), std::string::npos);
  EXPECT_EQ(out.find("<polyline"), std::string::npos);
  EXPECT_TRUE(yTickLabels(out).empty());  // no invented scale
  Chart bars;
  bars.kind = Chart::Kind::kBars;
  bars.categories = {"0", "1"};
  bars.series.push_back({"comm", {}});
  EXPECT_NE(svg(bars, 640, 300).find(">no data</text>"), std::string::npos);
  // Non-finite values are not data either.
  EXPECT_NE(svg(lineChart("t", {{0, NAN}, {INFINITY, 1}}), 640, 300).find(">no data</text>"), std::string::npos);
}

TEST(ReportSvg, LegendForSeveralSeriesAndMinMeanMaxBeyondSixteen) {
  Chart c = lineChart("GPU utilization", {});
  c.series.clear();
  for (int g = 0; g < 3; ++g) c.series.push_back({"node-a:" + std::to_string(g), {{0, 10.0 * g}, {1, 20.0 * g}}});
  std::string out = svg(c, 640, 300);
  EXPECT_EQ(count(out, "<polyline"), 3u);
  EXPECT_NE(out.find(">node-a:2</text>"), std::string::npos);
  // Colours cycle after eight series: the ninth line has the first's colour.
  c.series.clear();
  for (int g = 0; g < 9; ++g) c.series.push_back({"g" + std::to_string(g), {{0, 1.0 * g}, {1, 2.0 * g}}});
  out = svg(c, 640, 300);
  static const std::regex stroke(R"re(<polyline fill="none" stroke="(#[0-9a-f]{6})")re");
  std::vector<std::string> colors;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), stroke); it != std::sregex_iterator(); ++it) {
    colors.push_back((*it)[1]);
  }
  ASSERT_EQ(colors.size(), 9u);
  EXPECT_EQ(std::set<std::string>(colors.begin(), colors.begin() + 8).size(), 8u);
  EXPECT_EQ(colors[8], colors[0]);

  c.series.clear();
  for (int g = 0; g < 20; ++g) c.series.push_back({"n:" + std::to_string(g), {{0, 1.0 * g}, {1, 2.0 * g}}});
  c.yMax = 100;
  out = svg(c, 640, 300);
  EXPECT_EQ(xmlProblem(out), "");
  EXPECT_EQ(count(out, "<polyline"), 3u);
  EXPECT_NE(out.find(">min of 20</text>"), std::string::npos);
  EXPECT_NE(out.find(">mean</text>"), std::string::npos);
  EXPECT_NE(out.find(">max</text>"), std::string::npos);
  EXPECT_EQ(out.find(">n:19</text>"), std::string::npos);
  const auto labels = yTickLabels(out);
  EXPECT_EQ(labels.back(), "100");  // yMax sets the top
}

TEST(ReportSvg, ThinsLongSeries) {
  std::vector<kpi::Point> points;
  for (int i = 0; i < 10'000; ++i) points.push_back({static_cast<double>(i), std::sin(i / 100.0)});
  const std::string out = svg(lineChart("t", points), 640, 300);
  const std::size_t at = out.find("points=\"", out.find("<polyline"));
  ASSERT_NE(at, std::string::npos);
  const std::string coordinates = out.substr(at + 8, out.find('"', at + 8) - at - 8);
  const std::size_t drawn = count(coordinates, " ") + 1;
  EXPECT_LE(drawn, 601u);
  EXPECT_GE(drawn, 500u);
}

TEST(ReportSvg, StackedAreaAndBars) {
  Chart split;
  split.title = "Step time";
  split.kind = Chart::Kind::kStackedArea;
  for (const char* name : {"data", "compute", "exposed"}) {
    Series s{name, {}};
    for (int i = 1; i <= 50; ++i) s.points.push_back({static_cast<double>(i), 10.0});
    split.series.push_back(s);
  }
  std::string out = svg(split, 640, 300);
  EXPECT_EQ(xmlProblem(out), "") << out;
  EXPECT_EQ(count(out, "<polygon"), 3u);
  // Stacked: the top reaches 30, so the axis goes at least that far.
  EXPECT_GE(parseLabel(yTickLabels(out).back()), 30.0);

  Chart bars;
  bars.title = "Communication overhead per rank";
  bars.kind = Chart::Kind::kBars;
  bars.categories = {"0", "1", "2", "3"};
  bars.series.push_back({"comm", {{0, 12.5}, {1, 41}, {3, 7}}});
  out = svg(bars, 640, 300);
  EXPECT_EQ(xmlProblem(out), "") << out;
  EXPECT_EQ(count(out, "<rect"), 1u + 3u);  // the background and three bars
  EXPECT_NE(out.find(">41.0</text>"), std::string::npos) << out;
  EXPECT_NE(out.find(">3</text>"), std::string::npos);
}

// ---- report data by hand ----

// A job with nothing to advise on.
ReportData healthy() {
  ReportData d;
  d.generatedUnixUs = kT0 + 200 * kSecond;
  d.job.spec = spec("job-1", 2);
  d.job.state = JobState::kFinished;
  d.job.startedUnixUs = kT0;
  d.job.endedUnixUs = kT0 + 100 * kSecond;
  d.job.nodes.push_back({"node-a",
                         "a.example",
                         32,
                         64ull << 30,
                         {{0, "NVIDIA H200", "GPU-0", 141ull << 30}, {1, "NVIDIA H200", "GPU-1", 141ull << 30}},
                         "0.1.0"});
  kpi::JobKpis& k = d.kpis;
  k.jobId = "job-1";
  k.worldSize = 2;
  k.attempts = 1;
  k.step = 1000;
  k.totalSteps = 1000;
  k.elapsedSeconds = 100;
  k.samplesPerSecond = 1300;
  k.commOverhead = 0.10;
  k.scalingEfficiency = 0.9;
  k.scalingBasis = kpi::ScalingBasis::kEstimatedFromCompute;
  k.gpuUtilizationPct = 90;
  k.loadImbalance = 1.05;
  k.slowestRank = 1;
  k.slowestCause = kpi::SlowCause::kCompute;
  k.lastGlobalLoss = 0.3;
  k.smoothedLoss = 0.31;
  k.timeToConvergenceSeconds = 80;
  k.energyKwh = 0.5;
  k.gpuHours = 2 * 100 / 3600.0;
  k.costSoFar = 0.29;
  for (std::uint32_t r = 0; r < 2; ++r) {
    kpi::RankKpis rk;
    rk.rank = r;
    rk.node = "node-a";
    rk.step = 1000;
    rk.samplesPerSecond = 650;
    rk.commOverhead = 0.1;
    rk.meanDataUs = 5'000;
    rk.meanComputeUs = 80'000;
    rk.meanExposedUs = 10'000;
    rk.meanStepUs = 100'000;
    rk.loss = 0.3;
    rk.cpuPct = 99;
    rk.rssBytes = 1 << 30;
    k.ranks.push_back(rk);
    k.gpus.push_back({"node-a", r, 91.0, 90.0, 2e9, 350.0, 60.0, 0.25});
  }
  d.meanSamplesPerSecond = 1280;
  for (int i = 0; i < 100; ++i) {
    d.throughput.push_back({static_cast<double>(i), 1280});
    d.loss.push_back({static_cast<double>(10 * i + 10), 2.3 / (1 + 0.1 * i)});
    d.stepSplits.push_back({static_cast<std::uint64_t>(10 * i + 10), 5, 80, 10});
  }
  d.utilizationIsGpu = true;
  d.utilization = {{"node-a:0", {{0, 90}, {50, 91}}}, {"node-a:1", {{0, 89}, {50, 90}}}};
  d.events.push_back(event("job-1", JobEventKind::kStarted, kT0));
  d.events.push_back(event("job-1", JobEventKind::kFinished, kT0 + 100 * kSecond));
  return d;
}

// The one recommendation that contains `key`, or "".
std::string advice(const ReportData& d, const std::string& key) {
  std::string found;
  for (const auto& r : recommendations(d)) {
    if (r.find(key) != std::string::npos) {
      EXPECT_EQ(found, "") << "two recommendations about " << key;
      found = r;
    }
  }
  return found;
}

TEST(ReportRecommendations, NoneForAHealthyJob) {
  const auto recs = recommendations(healthy());
  EXPECT_TRUE(recs.empty()) << recs.front();
}

TEST(ReportRecommendations, CommunicationAboveFifteenPercent) {
  ReportData d = healthy();
  d.job.spec.bucketMb = 25;  // given with --bucket-mb (without, the trainer chooses: issue 34)
  d.kpis.commOverhead = 0.15;
  EXPECT_EQ(advice(d, "Exposed communication"), "");
  d.kpis.commOverhead = 0.41;
  const std::string text = advice(d, "Exposed communication");
  EXPECT_NE(text.find("41%"), std::string::npos) << text;
  EXPECT_NE(text.find("now 64"), std::string::npos) << text;
  EXPECT_NE(text.find("now 25 MB"), std::string::npos) << text;
  d.kpis.commOverhead = 0.1504;  // rounds to the threshold: more decimals say why it fired
  EXPECT_NE(advice(d, "Exposed communication").find("15.0%"), std::string::npos) << advice(d, "Exposed communication");
}

TEST(ReportRecommendations, LoadImbalanceNamesTheSlowestRankAndItsCause) {
  ReportData d = healthy();
  d.kpis.loadImbalance = 1.15;
  EXPECT_EQ(advice(d, "imbalance"), "");
  d.kpis.loadImbalance = 1.32;
  d.kpis.slowestRank = 1;
  d.kpis.slowestCause = kpi::SlowCause::kDataWait;
  std::string text = advice(d, "imbalance");
  EXPECT_NE(text.find("1.32"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 on node-a"), std::string::npos) << text;
  EXPECT_NE(text.find("data loader"), std::string::npos) << text;
  d.kpis.slowestCause = kpi::SlowCause::kCompute;
  text = advice(d, "imbalance");
  EXPECT_NE(text.find("hardware"), std::string::npos) << text;
  d.kpis.slowestCause = kpi::SlowCause::kCommunication;
  EXPECT_NE(advice(d, "imbalance").find("network"), std::string::npos);
}

TEST(ReportRecommendations, GpuUtilizationBelowSeventyPercent) {
  ReportData d = healthy();
  d.kpis.gpuUtilizationPct = 70;
  EXPECT_EQ(advice(d, "GPU utilization"), "");
  d.kpis.gpuUtilizationPct = 52.2;
  const std::string text = advice(d, "GPU utilization");
  EXPECT_NE(text.find("52%"), std::string::npos) << text;
  EXPECT_NE(text.find("2 GPUs"), std::string::npos) << text;
  d.kpis.gpuUtilizationPct = 69.8;
  EXPECT_NE(advice(d, "GPU utilization").find("69.8%"), std::string::npos) << advice(d, "GPU utilization");
}

TEST(ReportRecommendations, ScalingEfficiencyBelowEightyPercent) {
  ReportData d = healthy();
  d.kpis.scalingEfficiency = 0.8;
  EXPECT_EQ(advice(d, "Scaling efficiency"), "");
  d.kpis.scalingEfficiency = 0.64;
  const std::string text = advice(d, "Scaling efficiency");
  EXPECT_NE(text.find("64%"), std::string::npos) << text;
  EXPECT_NE(text.find("2 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("estimated from compute time"), std::string::npos) << text;
}

TEST(ReportRecommendations, DataWaitAboveTenPercentOfStepTime) {
  ReportData d = healthy();
  for (auto& r : d.kpis.ranks) r.meanDataUs = 10'000;
  EXPECT_EQ(advice(d, "Waiting for data"), "");
  for (auto& r : d.kpis.ranks) r.meanDataUs = 18'000;
  EXPECT_NE(advice(d, "Waiting for data").find("18%"), std::string::npos) << advice(d, "Waiting for data");
}

TEST(ReportRecommendations, LossThatIsNotANumberOrRises) {
  ReportData d = healthy();
  d.kpis.ranks[1].loss.reset();
  std::string text = advice(d, "not a number");
  EXPECT_NE(text.find("rank 1"), std::string::npos) << text;
  EXPECT_NE(text.find("step 1000"), std::string::npos) << text;
  EXPECT_NE(text.find("now 0.01"), std::string::npos) << text;

  d = healthy();
  std::reverse(d.loss.begin(), d.loss.end());
  for (std::size_t i = 0; i < d.loss.size(); ++i) d.loss[i].x = static_cast<double>(10 * i + 10);
  text = advice(d, "rose");
  // Means of the first and last tenth of the points.
  EXPECT_NE(text.find("rose from 0.2203 to 1.6532"), std::string::npos) << text;
}

TEST(ReportRecommendations, TargetNotReachedAndNoPrices) {
  ReportData d = healthy();
  d.job.spec.targetLoss = 0.1;
  d.kpis.timeToConvergenceSeconds.reset();
  const std::string text = advice(d, "target loss");
  EXPECT_NE(text.find("0.31"), std::string::npos) << text;
  EXPECT_NE(text.find("target loss 0.1 "), std::string::npos) << text;
  EXPECT_NE(text.find("1,000 steps"), std::string::npos) << text;
  d.job.state = JobState::kRunning;  // still on its way
  d.job.endedUnixUs = 0;
  EXPECT_EQ(advice(d, "target loss"), "");

  d = healthy();
  d.job.spec.prices = {};
  EXPECT_NE(advice(d, "No prices").find("cost"), std::string::npos);
}

// ---- document, HTML, JSON ----

TEST(ReportDocument, HtmlHoldsEveryChartTheKpisAndEscapedText) {
  ReportData d = healthy();
  d.job.spec.name = "<script>alert(1)</script> & co";
  d.recommendations = {"Raise the batch <now>."};
  d.missing = {"energy (no counter)"};
  const Document doc = document(d);
  EXPECT_EQ(doc.title, "Job job-1 — <script>alert(1)</script> & co");
  std::vector<std::string> headings;
  for (const auto& s : doc.sections) headings.push_back(s.heading);
  EXPECT_EQ(headings, (std::vector<std::string>{"Summary", "Recommendations", "Job spec", "Nodes and GPUs", "Ranks",
                                                "What more ranks would buy", "Charts", "Events", "Missing data"}));

  const std::string page = html(doc);
  EXPECT_TRUE(page.starts_with("<!DOCTYPE html>"));
  EXPECT_EQ(page.find("<script>"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;alert(1)&lt;/script&gt; &amp; co"), std::string::npos);
  EXPECT_NE(page.find("Raise the batch &lt;now&gt;."), std::string::npos);
  EXPECT_NE(page.find("energy (no counter)"), std::string::npos);
  const auto all = charts(d);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(count(page, "<svg "), all.size());
  for (const auto& c : all) {
    EXPECT_NE(page.find("id=\"chart-" + c.id + "\""), std::string::npos) << c.id;
    EXPECT_NE(page.find(svg(c, 760, 320)), std::string::npos) << c.id;
  }
  // Each inline SVG is well-formed on its own.
  for (std::size_t at = page.find("<svg "); at != std::string::npos; at = page.find("<svg ", at + 1)) {
    const std::size_t end = page.find("</svg>", at);
    ASSERT_NE(end, std::string::npos);
    EXPECT_EQ(xmlProblem(std::string_view(page).substr(at, end + 6 - at)), "");
  }
  // The KPIs, formatted.
  for (const char* value :
       {"1,280 samples/s", "90.0%", "10.0%", "1.05×", "1.7 min", "80 s", "0.29 USD", "0.500 kWh", "0.3100",
        "estimated from compute time", "slowest rank 1 (compute)", "NVIDIA H200", "784, 256, 10"}) {
    EXPECT_NE(page.find(value), std::string::npos) << value;
  }
  EXPECT_NE(page.find("<td class=\"num\">1,280 samples/s</td>"), std::string::npos);
}

TEST(ReportDocument, UnknownKpisAreDashesNotZeros) {
  ReportData d = healthy();
  d.kpis.gpuUtilizationPct.reset();
  d.kpis.energyKwh.reset();
  d.kpis.timeToConvergenceSeconds.reset();
  const Document doc = document(d);
  const Table& kpis = doc.sections[0].tables[0];
  for (const auto& row : kpis.rows) {
    if (row[0] == "GPU utilization" || row[0] == "Energy" || row[0] == "Time to convergence") {
      EXPECT_EQ(row[1], "–") << row[0];
    }
  }
  // Issue 46: no step report counted FLOPs: an MFU row that says so, not 0%.
  const auto mfu = std::find_if(kpis.rows.begin(), kpis.rows.end(), [](const auto& row) { return row[0] == "MFU"; });
  ASSERT_NE(mfu, kpis.rows.end());
  EXPECT_EQ((*mfu)[1], "–");
  EXPECT_EQ((*mfu)[2], "no step report counted the model's FLOPs");
}

TEST(ReportDocument, ASmallCostKeepsItsSignificantDigits) {
  ReportData d = healthy();
  d.job.spec.prices.coreHour = 0.048;
  const auto costOf = [&](double amount) {
    d.kpis.costSoFar = amount;
    d.kpis.costProjected = amount;
    const Document doc = document(d);
    for (const auto& row : doc.sections[0].tables[0].rows) {
      if (row[0] == "Cost per training job") return row[1];
    }
    return std::string("(no cost row)");
  };
  EXPECT_EQ(costOf(0.000213), "0.00021 USD");
  EXPECT_EQ(costOf(0.0099), "0.0099 USD");
  EXPECT_EQ(costOf(12.5), "12.50 USD");
  EXPECT_EQ(costOf(0), "0.00 USD");
}

TEST(ReportJson, ParsesAndWritesNullForUnknownKpis) {
  ReportData d = healthy();
  d.kpis.gpuUtilizationPct.reset();
  d.kpis.energyKwh.reset();
  d.kpis.timeToConvergenceSeconds.reset();
  d.kpis.slowestRank.reset();
  d.kpis.ranks[0].cpuPct.reset();
  d.job.spec.prices = {};
  d.loss.push_back({2000, NAN});
  d.recommendations = recommendations(d);
  const auto j = nlohmann::json::parse(json(d));
  EXPECT_EQ(j["schema"], "lockstep.report.v1");
  EXPECT_EQ(j["generated_at"], "2027-01-15T08:03:20Z");
  EXPECT_EQ(j["generated_at_unix_us"], kT0 + 200 * kSecond);
  EXPECT_EQ(j["job"]["id"], "job-1");
  EXPECT_EQ(j["job"]["state"], "finished");
  EXPECT_EQ(j["job"]["spec"]["jobId"], "job-1");
  EXPECT_EQ(j["job"]["nodes"][0]["gpus"].size(), 2u);
  const auto& k = j["kpis"];
  for (const char* unknown : {"gpu_utilization_pct", "energy_kwh", "time_to_convergence_seconds", "slowest_rank",
                              "slowest_cause", "cost_so_far", "eta_seconds", "model_flops_utilization",
                              "model_flops_per_second", "peak_flops", "flops_basis", "peak_basis"}) {
    EXPECT_TRUE(k.at(unknown).is_null()) << unknown;
  }
  EXPECT_TRUE(j["ranks"][0].at("model_flops_utilization").is_null());
  EXPECT_DOUBLE_EQ(k["comm_overhead"].get<double>(), 0.10);
  EXPECT_DOUBLE_EQ(k["mean_samples_per_second"].get<double>(), 1280);
  EXPECT_EQ(k["scaling_basis"], "estimated_from_compute");
  EXPECT_EQ(k["step"], 1000);
  EXPECT_TRUE(j["ranks"][0]["cpu_pct"].is_null());
  EXPECT_DOUBLE_EQ(j["ranks"][1]["cpu_pct"].get<double>(), 99);
  EXPECT_EQ(j["ranks"][1]["rss_bytes"], 1 << 30);
  EXPECT_TRUE(j["ranks"][1]["rss_bytes"].is_number_integer());
  EXPECT_EQ(j["gpus"].size(), 2u);
  EXPECT_EQ(j["series"]["loss"].size(), 100u);  // the NaN point is left out
  EXPECT_EQ(j["series"]["throughput"][0], nlohmann::json::array({0.0, 1280.0}));
  EXPECT_EQ(j["series"]["step_time"][0]["compute_ms"], 80.0);
  EXPECT_EQ(j["series"]["utilization"][1]["name"], "node-a:1");
  EXPECT_EQ(j["events"][1]["kind"], "finished");
  EXPECT_TRUE(j["events"][1]["rank"].is_null());
  EXPECT_FALSE(j["recommendations"].empty());
}

// Validates with Python's jsonschema (python3-jsonschema) when it is installed.
TEST(ReportJson, MatchesTheSchema) {
  ReportData d = healthy();
  d.recommendations = recommendations(d);
  d.missing = {"cost (no prices)"};
  expectMatchesSchema(json(d));
  d.kpis = {};
  d.job.endedUnixUs = 0;
  d.job.state = JobState::kRunning;
  expectMatchesSchema(json(d));
}

}  // namespace
}  // namespace lockstep::report
