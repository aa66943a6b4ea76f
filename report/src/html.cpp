// One self-contained HTML5 file: inline CSS, charts as inline SVG, no scripts, nothing fetched.

#include <cctype>
#include <string_view>

#include "lockstep/report/report.h"
#include "text.h"

namespace lockstep::report {
namespace {

using detail::xmlEscape;

constexpr int kChartWidth = 760;
constexpr int kChartHeight = 320;

constexpr std::string_view kStyle = R"(
pre { font-size: 0.8em; background: #f6f6f6; padding: 0.6em; overflow-x: auto; white-space: pre-wrap; }
body { font-family: sans-serif; color: #222; background: #fff; max-width: 1100px; margin: 2em auto; padding: 0 1em; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
.subtitle { color: #555; margin-top: 0; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 1.8em; }
h3 { font-size: 1em; color: #444; margin-bottom: 0.4em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #eef1f5; }
tbody tr:nth-child(even) { background: #f7f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
figure { margin: 1em 0; page-break-inside: avoid; break-inside: avoid; }
figure svg { max-width: 100%; height: auto; }
ul { padding-left: 1.4em; }
li { margin: 0.3em 0; }
@media print {
  body { margin: 0; max-width: none; font-size: 10pt; }
  h2 { page-break-after: avoid; break-after: avoid; }
  table, tr { page-break-inside: avoid; break-inside: avoid; }
}
)";

// A cell that reads as one figure with an optional unit ("12,400 samples/s", "41.2%", "1.32×", "–")
// is right-aligned; dates, lists and sentences are not.
bool numeric(std::string_view cell) {
  if (cell == detail::kDash) return true;
  if (!cell.empty() && (cell.front() == '-' || cell.front() == '+')) cell.remove_prefix(1);
  if (cell.empty() || !std::isdigit(static_cast<unsigned char>(cell.front()))) return false;
  const std::size_t space = cell.find(' ');
  const std::string_view figure = cell.substr(0, space);
  const std::string_view unit = space == std::string_view::npos ? std::string_view() : cell.substr(space + 1);
  int dots = 0;
  for (const char ch : figure) {
    const auto c = static_cast<unsigned char>(ch);
    dots += c == '.';
    if (std::isdigit(c) || c == ',' || c == '.' || c == '%' || c >= 0x80) continue;  // 0x80+: the × sign
    return false;
  }
  if (dots > 1) return false;  // a version, not a figure
  for (const char c : unit) {
    if (std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

void table(std::string& out, const Table& t) {
  if (!t.title.empty()) out += "<h3>" + xmlEscape(t.title) + "</h3>\n";
  out += "<table>\n";
  if (!t.header.empty()) {
    out += "<thead><tr>";
    for (const auto& h : t.header) out += "<th>" + xmlEscape(h) + "</th>";
    out += "</tr></thead>\n";
  }
  out += "<tbody>\n";
  for (const auto& row : t.rows) {
    out += "<tr>";
    for (const auto& cell : row) out += (numeric(cell) ? "<td class=\"num\">" : "<td>") + xmlEscape(cell) + "</td>";
    out += "</tr>\n";
  }
  out += "</tbody>\n</table>\n";
}

}  // namespace

std::string html(const Document& document) {
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  out += "<meta name=\"generator\" content=\"Lockstep\">\n";
  out += "<title>" + xmlEscape(document.title) + "</title>\n<style>" + std::string(kStyle) + "</style>\n";
  out += "</head>\n<body>\n";
  out += "<h1>" + xmlEscape(document.title) + "</h1>\n";
  if (!document.subtitle.empty()) out += "<p class=\"subtitle\">" + xmlEscape(document.subtitle) + "</p>\n";
  for (const auto& section : document.sections) {
    out += "<section>\n<h2>" + xmlEscape(section.heading) + "</h2>\n";
    for (const auto& p : section.paragraphs) out += "<p>" + xmlEscape(p) + "</p>\n";
    if (!section.bullets.empty()) {
      out += "<ul>\n";
      for (const auto& b : section.bullets) out += "<li>" + xmlEscape(b) + "</li>\n";
      out += "</ul>\n";
    }
    for (const auto& t : section.tables) table(out, t);
    for (const auto& c : section.code) out += "<pre>" + xmlEscape(c) + "</pre>\n";
    for (const auto& chart : section.charts) {
      out +=
          "<figure id=\"chart-" + xmlEscape(chart.id) + "\">\n" + svg(chart, kChartWidth, kChartHeight) + "</figure>\n";
    }
    out += "</section>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace lockstep::report
