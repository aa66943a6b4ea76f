#include "lockstep/kpi/network.h"

#include <algorithm>
#include <cstdio>

namespace lockstep::kpi {
namespace {

std::uint64_t grew(const std::optional<std::uint64_t>& before, const std::optional<std::uint64_t>& after) {
  return before && after && *after >= *before ? *after - *before : 0;
}

}  // namespace

std::optional<double> linkUse(double rxBytesPerSecond, double txBytesPerSecond, std::optional<std::uint64_t> linkBitsPerSecond) {
  if (!linkBitsPerSecond || *linkBitsPerSecond == 0) return std::nullopt;
  return 8.0 * std::max(rxBytesPerSecond, txBytesPerSecond) / static_cast<double>(*linkBitsPerSecond);
}

std::optional<NetRate> netRate(const NetSample& before, const NetSample& after) {
  if (before.node != after.node || before.interface != after.interface) return std::nullopt;
  if (after.timeUnixUs <= before.timeUnixUs) return std::nullopt;
  if (after.rxBytes < before.rxBytes || after.txBytes < before.txBytes) return std::nullopt;
  const double seconds = static_cast<double>(after.timeUnixUs - before.timeUnixUs) / 1e6;
  NetRate r;
  r.interface = after.interface;
  r.timeUnixUs = after.timeUnixUs;
  r.rxBytesPerSecond = static_cast<double>(after.rxBytes - before.rxBytes) / seconds;
  r.txBytesPerSecond = static_cast<double>(after.txBytes - before.txBytes) / seconds;
  r.linkBitsPerSecond = after.linkBitsPerSecond;
  r.linkUse = linkUse(r.rxBytesPerSecond, r.txBytesPerSecond, r.linkBitsPerSecond);
  r.newErrors = grew(before.rxErrors, after.rxErrors) + grew(before.txErrors, after.txErrors) +
                grew(before.rxDrops, after.rxDrops) + grew(before.txDrops, after.txDrops);
  return r;
}

std::string formatBitsPerSecond(double bitsPerSecond) {
  const char* units[] = {"b/s", "kb/s", "Mb/s", "Gb/s", "Tb/s"};
  int u = 0;
  while (bitsPerSecond >= 1000 && u < 4) {
    bitsPerSecond /= 1000;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, bitsPerSecond < 10 && u > 0 ? "%.2f %s" : "%.0f %s", bitsPerSecond, units[u]);
  return text;
}

}  // namespace lockstep::kpi
