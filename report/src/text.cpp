#include "text.h"

#include <array>
#include <charconv>
#include <cmath>
#include <ctime>

namespace lockstep::report::detail {
namespace {

std::string utc(std::int64_t unixUs, const char* format) {
  const std::time_t seconds = static_cast<std::time_t>(unixUs / 1'000'000);
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  std::array<char, 64> text{};
  const std::size_t n = std::strftime(text.data(), text.size(), format, &parts);
  return std::string(text.data(), n);
}

}  // namespace



std::string shortest(double value) {
  std::array<char, 64> buffer{};
  const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return ec == std::errc() ? std::string(buffer.data(), end) : std::string();
}

std::string shortest(float value) {
  std::array<char, 64> buffer{};
  const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return ec == std::errc() ? std::string(buffer.data(), end) : std::string();
}

std::string xmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        // Control characters other than tab and newlines are not allowed in XML 1.0 at all.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string collectiveShares(const kpi::CollectiveKpis& c) {
  std::string text = percent(c.exposedShare) + " exposed";
  if (c.timeShare) text += " of " + percent(c.timeShare);
  return text;
}

std::string collectiveSizes(const kpi::CollectiveKpis& c) {
  const bool whole = std::abs(c.perStep - std::round(c.perStep)) < 0.05;
  std::string text = number(c.perStep, whole ? 0 : 1) + " per step";
  if (c.bytesPerStep && *c.bytesPerStep > 0) text += " · " + bytes(*c.bytesPerStep);
  if (c.busBandwidth) text += " · " + present::bandwidth(c.busBandwidth) + " bus";
  return text;
}

std::string isoTime(std::int64_t unixUs) { return utc(unixUs, "%Y-%m-%dT%H:%M:%SZ"); }

std::string displayTime(std::int64_t unixUs) { return utc(unixUs, "%Y-%m-%d %H:%M:%S UTC"); }




std::string compact(double value) {
  std::string text = shortest(value);
  return text.find('e') == std::string::npos ? text : number(value, 6);
}

}  // namespace lockstep::report::detail
