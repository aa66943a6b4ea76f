// Charts as standalone SVG. Written for browsers and for Qt's QSvgRenderer (the PDF report), which
// reads SVG Tiny 1.2: presentation attributes only (no CSS), no clip paths, no dominant-baseline
// (text is placed by explicit baseline offsets).

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "lockstep/report/report.h"
#include "lockstep/present/present.h"
#include "lockstep/protocol/names.h"
#include "text.h"

namespace lockstep::report {
namespace {

using detail::plainNumber;
using detail::xmlEscape;

constexpr std::array<std::string_view, 8> kColors = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                                     "#59a14f", "#edc948", "#b07aa1", "#9c755f"};
constexpr std::size_t kMaxPoints = 600;  // per series; the dashboard draws as many
constexpr std::size_t kMaxLines = 16;    // beyond this, min / mean / max (as the dashboard)
constexpr double kFontSize = 11;
constexpr double kCharWidth = 6.2;  // a sans-serif character at kFontSize, on average
constexpr std::string_view kTextColor = "#333333";
constexpr std::string_view kGridColor = "#e3e3e3";
constexpr std::string_view kAxisColor = "#888888";

std::string_view color(std::size_t i) { return kColors[i % kColors.size()]; }

std::string px(double v) { return plainNumber(v, 1); }

// Round tick positions (1, 2 or 5 times a power of ten) covering [lo, hi] in at most `intervals`.
struct Ticks {
  double lo = 0, hi = 1, step = 1;
  int decimals = 0;
  long first = 0, count = 1;  // tick i is at (first + i) * step
};

Ticks niceTicks(double lo, double hi, int intervals) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= lo == 0 ? 0 : pad;
    hi += pad;
  }
  const double step = present::tickStep(hi - lo, intervals);
  Ticks t;
  t.step = step;
  t.first = std::lround(std::floor(lo / step + 1e-9));
  const long last = std::lround(std::ceil(hi / step - 1e-9));
  t.count = last - t.first + 1;
  t.lo = static_cast<double>(t.first) * step;
  t.hi = static_cast<double>(last) * step;
  t.decimals = present::tickDecimals(step);
  return t;
}

std::vector<std::string> tickLabels(const Ticks& t) {
  std::vector<std::string> labels;
  for (long i = 0; i < t.count; ++i)
    labels.push_back(detail::number(static_cast<double>(t.first + i) * t.step, t.decimals));
  return labels;
}

std::vector<kpi::Point> finitePoints(const std::vector<kpi::Point>& points) {
  std::vector<kpi::Point> out;
  out.reserve(points.size());
  for (const auto& p : points) {
    if (std::isfinite(p.x) && std::isfinite(p.y)) out.push_back(p);
  }
  return out;
}

// Every stride-th point, the last one always kept, so that at most ~kMaxPoints remain.
std::size_t strideFor(std::size_t n) { return std::max<std::size_t>(1, (n + kMaxPoints - 1) / kMaxPoints); }

std::vector<kpi::Point> thinned(const std::vector<kpi::Point>& points) {
  const std::size_t n = points.size();
  const std::size_t stride = strideFor(n);
  if (stride == 1) return points;
  std::vector<kpi::Point> out;
  for (std::size_t i = 0; i < n; i += stride) out.push_back(points[i]);
  if ((n - 1) % stride != 0) out.push_back(points[n - 1]);
  return out;
}

// Many series (GPUs of a large job) are unreadable as lines: the least, mean and most at each x,
// over kMaxPoints buckets of the x range.
std::vector<Series> minMeanMax(const std::vector<Series>& series) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : series) {
    for (const auto& p : s.points) {
      lo = std::min(lo, p.x);
      hi = std::max(hi, p.x);
    }
  }
  struct Bucket {
    double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
    double sum = 0, xSum = 0;
    std::size_t n = 0;
  };
  std::vector<Bucket> buckets(kMaxPoints);
  const double width = hi > lo ? (hi - lo) / static_cast<double>(kMaxPoints) : 1.0;
  for (const auto& s : series) {
    for (const auto& p : s.points) {
      const auto i = std::min(kMaxPoints - 1, static_cast<std::size_t>((p.x - lo) / width));
      Bucket& b = buckets[i];
      b.lo = std::min(b.lo, p.y);
      b.hi = std::max(b.hi, p.y);
      b.sum += p.y;
      b.xSum += p.x;
      ++b.n;
    }
  }
  std::vector<Series> out = {{"min of " + std::to_string(series.size()), {}}, {"mean", {}}, {"max", {}}};
  for (const auto& b : buckets) {
    if (b.n == 0) continue;
    const double x = b.xSum / static_cast<double>(b.n);
    out[0].points.push_back({x, b.lo});
    out[1].points.push_back({x, b.sum / static_cast<double>(b.n)});
    out[2].points.push_back({x, b.hi});
  }
  return out;
}

class Canvas {
 public:
  Canvas(int width, int height) {
    out_ += "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.2\" baseProfile=\"tiny\" width=\"" +
            std::to_string(width) + "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " +
            std::to_string(width) + " " + std::to_string(height) + "\">\n";
    rect(0, 0, width, height, "#ffffff", "none");
  }

  void rect(double x, double y, double w, double h, std::string_view fill, std::string_view stroke) {
    out_ += "<rect x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(w) + "\" height=\"" + px(h) + "\" fill=\"" +
            std::string(fill) + "\" stroke=\"" + std::string(stroke) + "\"/>\n";
  }

  void line(double x1, double y1, double x2, double y2, std::string_view stroke) {
    out_ += "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" + px(y2) + "\" stroke=\"" +
            std::string(stroke) + "\" stroke-width=\"1\"/>\n";
  }

  // anchor: start, middle or end; `rotate` turns the text about its anchor point (degrees).
  void text(double x, double y, std::string_view content, std::string_view anchor, double size = kFontSize,
            bool bold = false, double rotate = 0, std::string_view fill = kTextColor) {
    out_ += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-family=\"sans-serif\" font-size=\"" + px(size) +
            "\" fill=\"" + std::string(fill) + "\" text-anchor=\"" + std::string(anchor) + "\"";
    if (bold) out_ += " font-weight=\"bold\"";
    if (rotate != 0) out_ += " transform=\"rotate(" + px(rotate) + " " + px(x) + " " + px(y) + ")\"";
    out_ += ">" + xmlEscape(content) + "</text>\n";
  }

  void polyline(const std::vector<std::pair<double, double>>& points, std::string_view stroke) {
    if (points.size() == 1) {
      out_ += "<circle cx=\"" + px(points[0].first) + "\" cy=\"" + px(points[0].second) + "\" r=\"2.5\" fill=\"" +
              std::string(stroke) + "\"/>\n";
      return;
    }
    out_ += "<polyline fill=\"none\" stroke=\"" + std::string(stroke) +
            "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"" + coordinates(points) + "\"/>\n";
  }

  void polygon(const std::vector<std::pair<double, double>>& points, std::string_view fill) {
    out_ += "<polygon fill=\"" + std::string(fill) + "\" fill-opacity=\"0.85\" stroke=\"none\" points=\"" +
            coordinates(points) + "\"/>\n";
  }

  std::string finish() && {
    out_ += "</svg>\n";
    return std::move(out_);
  }

 private:
  static std::string coordinates(const std::vector<std::pair<double, double>>& points) {
    std::string text;
    for (const auto& [x, y] : points) {
      if (!text.empty()) text += ' ';
      text += px(x) + "," + px(y);
    }
    return text;
  }

  std::string out_;
};

std::size_t longest(const std::vector<std::string>& labels) {
  std::size_t n = 0;
  for (const auto& l : labels) n = std::max(n, l.size());
  return n;
}

// Legend text is cut so that one long GPU name cannot squeeze the plot.
std::string legendName(const std::string& name) {
  constexpr std::size_t kMax = 24;
  return name.size() <= kMax ? name : name.substr(0, kMax - 1) + "…";
}

// At most `bytes` of `text`, not cutting a character in two.
std::string_view utf8Prefix(std::string_view text, std::size_t bytes) {
  if (text.size() <= bytes) return text;
  while (bytes > 0 && (static_cast<unsigned char>(text[bytes]) & 0xC0) == 0x80) --bytes;
  return text.substr(0, bytes);
}

// A lane's collectives over its boxes, as the app draws them (TimelineWidget): a strip along its top
// where they ran (boxes a pixel holds several of merged), a bar up from its bottom as tall as the
// share of a pixel's time the rank waited on one; a wide one outlined and labelled "all-gather 8.0 MiB".
void collectivesSvg(Canvas& canvas, const TimelineFigure& t, const std::vector<kpi::CollectiveBox>& collectives, double left,
                    double right, double y, double lane) {
  const std::string_view color = present::phaseColor(kpi::Phase::kCollective);
  const double span = static_cast<double>(std::max<std::int64_t>(1, t.toUs - t.fromUs));
  const auto toX = [&](std::int64_t us) { return left + static_cast<double>(us - t.fromUs) / span * (right - left); };
  std::vector<kpi::Box> ran, waited;
  for (const auto& c : collectives) {
    ran.push_back(c.box);
    if (c.exposedUs > 0) waited.push_back(c.exposed());
  }
  const auto columns = static_cast<std::size_t>(std::max(1.0, right - left));
  const double edge = std::max(1.0, lane / 7);
  for (const auto& run : kpi::mergedBoxes(std::move(ran), static_cast<std::int64_t>(span) / static_cast<std::int64_t>(columns) + 1)) {
    const double x0 = toX(run.startUs);
    canvas.rect(x0, y, std::max(0.5, toX(run.startUs + run.durationUs) - x0), edge, color, "none");
  }
  const auto heights = kpi::coverage(waited, t.fromUs, t.toUs, columns);
  for (std::size_t c = 0; c < columns;) {  // a rectangle for each run of columns of one height
    const double h = std::ceil(heights[c] * lane);
    std::size_t end = c + 1;
    while (end < columns && std::ceil(heights[end] * lane) == h) ++end;
    if (h > 0) canvas.rect(left + static_cast<double>(c), y + lane - h, static_cast<double>(end - c), h, color, "none");
    c = end;
  }
  std::vector<kpi::CollectiveBox> byStart = collectives;
  std::stable_sort(byStart.begin(), byStart.end(), [](const auto& a, const auto& b) { return a.box.startUs < b.box.startUs; });
  const auto labelEnds = kpi::labelEnds(byStart);
  for (std::size_t i = 0; i < byStart.size(); ++i) {
    const auto& c = byStart[i];
    const double x0 = toX(c.box.startUs), x1 = toX(c.box.startUs + c.box.durationUs);
    if (x1 - x0 < 6) continue;
    canvas.rect(x0, y, x1 - x0, lane, "none", color);
    const double fits = (toX(labelEnds[i]) - x0 - 6) / kCharWidth;
    // Its bytes where they fit, else its kind alone.
    std::string label = present::collectiveLabel(c.kind, c.bytes);
    if (static_cast<double>(label.size()) > fits) label = std::string(titleOf(c.kind));
    if (static_cast<double>(label.size()) > fits) label = std::string(utf8Prefix(label, static_cast<std::size_t>(std::max(1.0, fits - 1)))) + "\u2026";
    if (fits >= 3 && lane >= 9) canvas.text(x0 + 3, y + lane * 0.75, label, "start", std::min(kFontSize, lane), false, 0, "#ffffff");
  }
}

// Lanes of boxes against seconds since the first step, a legend of the phases below.
std::string timelineSvg(const Chart& chart, int width, int height) {
  const TimelineFigure& t = *chart.timeline;
  constexpr double kLane = 14, kGap = 3;
  std::vector<std::string> labels;
  for (const auto& lane : t.lanes) labels.push_back(lane.label);
  const double left = 12 + static_cast<double>(longest(labels)) * kCharWidth, right = width - 16.0;
  const double top = 34, bottom = height - 58.0;
  const double lane =
      std::max(1.0, std::min(kLane, (bottom - top) / static_cast<double>(std::max<std::size_t>(1, t.lanes.size())) - kGap));
  Canvas canvas(width, height);
  canvas.text(width / 2.0, 20, chart.title, "middle", 13, true);
  const double span = static_cast<double>(std::max<std::int64_t>(1, t.toUs - t.fromUs));
  const auto toX = [&](std::int64_t us) { return left + static_cast<double>(us - t.fromUs) / span * (right - left); };
  const double fromS = static_cast<double>(t.fromUs - t.zeroUs) / 1e6, toS = static_cast<double>(t.toUs - t.zeroUs) / 1e6;
  const Ticks ticks = niceTicks(fromS, toS, std::clamp(static_cast<int>((right - left) / 80), 2, 10));
  const std::vector<std::string> tickText = tickLabels(ticks);
  for (long i = 0; i < ticks.count; ++i) {
    const double s = static_cast<double>(ticks.first + i) * ticks.step;
    if (s < fromS || s > toS) continue;
    const double x = toX(t.zeroUs + static_cast<std::int64_t>(s * 1e6));
    canvas.line(x, top - 4, x, bottom, kGridColor);
    canvas.text(x, bottom + 16, tickText[static_cast<std::size_t>(i)], "middle");
  }
  for (std::size_t i = 0; i < t.lanes.size(); ++i) {
    const double y = top + static_cast<double>(i) * (lane + kGap);
    canvas.text(left - 6, y + lane * 0.75, t.lanes[i].label, "end", std::min(kFontSize, lane));
    // Boxes narrower than a tenth of a pixel merge into their neighbours' colour: skip them.
    double drawnTo = -1;
    for (const auto& box : t.lanes[i].boxes) {
      const double x0 = toX(box.startUs), x1 = toX(box.startUs + box.durationUs);
      if (x1 - x0 < 0.1 && x0 <= drawnTo) continue;
      canvas.rect(x0, y, std::max(0.1, x1 - x0), lane, present::phaseColor(box.phase), "none");
      drawnTo = x1;
    }
    for (const auto& [box, name] : t.lanes[i].phases) {
      const double x0 = toX(box.startUs), x1 = toX(box.startUs + box.durationUs);
      canvas.rect(x0, y, std::max(0.1, x1 - x0), lane, present::phaseColor(box.phase), "none");
      const double fits = (x1 - x0 - 6) / kCharWidth;
      if (fits >= 3 && lane >= 9) {
        canvas.text(x0 + 3, y + lane * 0.75, utf8Prefix(name, static_cast<std::size_t>(fits)), "start", std::min(kFontSize, lane), false, 0,
                    "#ffffff");
      }
    }
    collectivesSvg(canvas, t, t.lanes[i].collectives, left, right, y, lane);
  }
  canvas.text((left + right) / 2, height - 28.0, chart.xLabel, "middle");
  double x = 12;  // from the left edge: seven entries fill a report's width
  for (const auto phase : kpi::kEveryPhase) {
    if (phase == kpi::Phase::kCollective) {  // as it is drawn: outlined, where waited on filled
      canvas.rect(x, height - 14.0, 10, 10, "none", present::phaseColor(phase));
      canvas.rect(x + 5, height - 14.0, 5, 10, present::phaseColor(phase), "none");
    } else {
      canvas.rect(x, height - 14.0, 10, 10, present::phaseColor(phase), "none");
    }
    const std::string name(present::phaseLegend(phase));
    canvas.text(x + 14, height - 5.0, name, "start", 10);
    x += 26 + static_cast<double>(name.size()) * 5.8;  // at font size 10
  }
  return std::move(canvas).finish();
}

}  // namespace

std::string svg(const Chart& chart, int width, int height) {
  width = std::max(width, 160);
  height = std::max(height, 120);
  if (chart.kind == Chart::Kind::kTimeline && chart.timeline) return timelineSvg(chart, width, height);

  std::vector<Series> series;
  for (const auto& s : chart.series) series.push_back({s.name, finitePoints(s.points)});
  if (chart.kind == Chart::Kind::kLine && series.size() > kMaxLines) series = minMeanMax(series);

  // Stacked layers share x by index: cut to the shortest and thin them with one stride.
  std::vector<std::vector<double>> stackTops;
  if (chart.kind == Chart::Kind::kStackedArea && !series.empty()) {
    std::size_t n = series.front().points.size();
    for (const auto& s : series) n = std::min(n, s.points.size());
    const std::size_t stride = strideFor(n);
    for (auto& s : series) {
      std::vector<kpi::Point> kept;
      for (std::size_t i = 0; i < n; i += stride) kept.push_back(s.points[i]);
      if (n > 0 && (n - 1) % stride != 0) kept.push_back(s.points[n - 1]);
      s.points = std::move(kept);
    }
    std::vector<double> below(series.front().points.size(), 0.0);
    for (const auto& s : series) {
      for (std::size_t i = 0; i < below.size(); ++i) below[i] += std::max(0.0, s.points[i].y);
      stackTops.push_back(below);
    }
  } else if (chart.kind == Chart::Kind::kLine) {
    for (auto& s : series) s.points = thinned(s.points);
  }

  bool empty = true;
  double xLo = std::numeric_limits<double>::infinity(), xHi = -xLo, yLo = xLo, yHi = -xLo;
  for (const auto& s : series) {
    for (const auto& p : s.points) {
      empty = false;
      xLo = std::min(xLo, p.x);
      xHi = std::max(xHi, p.x);
      yLo = std::min(yLo, p.y);
      yHi = std::max(yHi, p.y);
    }
  }
  if (!stackTops.empty()) {
    yLo = 0;
    for (const double top : stackTops.back()) yHi = std::max(yHi, top);
  }
  if (empty) {
    xLo = 0, xHi = 1, yLo = 0, yHi = 1;
  } else if (chart.kind != Chart::Kind::kLine) {
    yLo = std::min(0.0, yLo);
    yHi = std::max(0.0, yHi);
  } else if (yLo >= 0 && chart.id != "loss") {
    yLo = 0;  // rates and percentages read against zero; a loss curve is read by its shape
  }
  if (chart.yMax) {
    yHi = std::max(yHi, *chart.yMax);
    yLo = std::min(yLo, 0.0);
  }

  // Layout: the title on top, y labels left, x labels and title below, the legend right.
  const bool hasTitle = !chart.title.empty();
  const double top = hasTitle ? 34 : 12;
  const double bottom = height - (chart.xLabel.empty() ? 26.0 : 44.0);
  const Ticks yTicks = niceTicks(yLo, yHi, std::clamp(static_cast<int>((bottom - top) / 45), 2, 8));
  const std::vector<std::string> yLabels = tickLabels(yTicks);
  const double left = (chart.yLabel.empty() ? 10 : 28) + static_cast<double>(longest(yLabels)) * kCharWidth + 8;

  std::vector<std::string> legend;
  if (chart.kind != Chart::Kind::kBars && series.size() > 1) {
    for (const auto& s : series) legend.push_back(legendName(s.name));
  }
  double legendWidth = 0;
  if (!legend.empty()) {
    legendWidth = std::min(static_cast<double>(width) / 3, 30 + static_cast<double>(longest(legend)) * kCharWidth);
  }
  const double right = width - 16 - legendWidth;
  const double plotWidth = std::max(1.0, right - left), plotHeight = std::max(1.0, bottom - top);

  Canvas canvas(width, height);
  if (hasTitle) canvas.text(width / 2.0, 20, chart.title, "middle", 13, true);

  // The y grid and labels.
  const auto toY = [&](double v) { return bottom - (v - yTicks.lo) / (yTicks.hi - yTicks.lo) * plotHeight; };
  // Without data, ticks would invent a scale: the frame alone says "no data".
  for (long i = 0; i < (empty ? 0 : yTicks.count); ++i) {
    const double y = toY(static_cast<double>(yTicks.first + i) * yTicks.step);
    canvas.line(left, y, right, y, kGridColor);
    canvas.text(left - 6, y + kFontSize * 0.35, yLabels[static_cast<std::size_t>(i)], "end");
  }
  if (!chart.yLabel.empty()) {
    const double y = (top + bottom) / 2;
    canvas.text(14, y, chart.yLabel, "middle", kFontSize, false, -90);
  }
  if (!chart.xLabel.empty()) canvas.text((left + right) / 2, height - 10.0, chart.xLabel, "middle");

  if (chart.kind == Chart::Kind::kBars) {
    const std::size_t n = std::max<std::size_t>(1, chart.categories.size());
    const double band = plotWidth / static_cast<double>(n);
    // Label every k-th category when they would overlap.
    const std::size_t every = std::max<std::size_t>(
        1,
        static_cast<std::size_t>(std::ceil((static_cast<double>(longest(chart.categories)) * kCharWidth + 6) / band)));
    for (std::size_t i = 0; i < chart.categories.size(); i += every) {
      canvas.text(left + (static_cast<double>(i) + 0.5) * band, bottom + 16, chart.categories[i], "middle");
    }
    if (!series.empty()) {
      for (const auto& p : series.front().points) {
        if (p.x < 0 || p.x >= static_cast<double>(n)) continue;
        const double x = left + (std::floor(p.x) + 0.15) * band;
        const double y0 = toY(0), y1 = toY(p.y);
        canvas.rect(x, std::min(y0, y1), band * 0.7, std::abs(y1 - y0), color(0), "none");
        if (n <= 24)
          canvas.text(x + band * 0.35, std::min(y0, y1) - 4, detail::number(p.y, std::min(yTicks.decimals + 1, 6)),
                      "middle", 10);
      }
    }
  } else {
    const Ticks xTicks = niceTicks(xLo, xHi, std::clamp(static_cast<int>(plotWidth / 80), 2, 10));
    const auto toX = [&](double v) { return left + (v - xTicks.lo) / (xTicks.hi - xTicks.lo) * plotWidth; };
    const std::vector<std::string> xLabels = tickLabels(xTicks);
    for (long i = 0; i < (empty ? 0 : xTicks.count); ++i) {
      const double x = toX(static_cast<double>(xTicks.first + i) * xTicks.step);
      canvas.line(x, bottom, x, bottom + 4, kAxisColor);
      canvas.text(x, bottom + 16, xLabels[static_cast<std::size_t>(i)], "middle");
    }
    if (!stackTops.empty()) {
      // Each layer fills the band between the layers below it and its own top.
      for (std::size_t k = 0; k < series.size(); ++k) {
        const auto& points = series[k].points;
        if (points.empty()) continue;
        std::vector<std::pair<double, double>> outline, edge;
        for (std::size_t i = 0; i < points.size(); ++i) outline.emplace_back(toX(points[i].x), toY(stackTops[k][i]));
        edge = outline;
        for (std::size_t i = points.size(); i-- > 0;) {
          outline.emplace_back(toX(points[i].x), toY(k == 0 ? 0.0 : stackTops[k - 1][i]));
        }
        canvas.polygon(outline, color(k));
        canvas.polyline(edge, color(k));
      }
    } else {
      for (std::size_t k = 0; k < series.size(); ++k) {
        if (series[k].points.empty()) continue;
        std::vector<std::pair<double, double>> points;
        for (const auto& p : series[k].points) points.emplace_back(toX(p.x), toY(p.y));
        canvas.polyline(points, color(k));
      }
    }
  }

  // The axes over the data.
  canvas.line(left, top, left, bottom, kAxisColor);
  canvas.line(left, bottom, right, bottom, kAxisColor);
  if (empty) canvas.text((left + right) / 2, (top + bottom) / 2 + 5, "no data", "middle", 14);

  for (std::size_t k = 0; k < legend.size(); ++k) {
    const double y = top + 4 + static_cast<double>(k) * 16;
    if (y + 12 > bottom) {
      canvas.text(right + 12, y + 9, "… " + std::to_string(legend.size() - k) + " more", "start", 10);
      break;
    }
    canvas.rect(right + 12, y, 10, 10, color(k), "none");
    canvas.text(right + 27, y + 9, legend[k], "start", 10);
  }
  return std::move(canvas).finish();
}

}  // namespace lockstep::report
