#pragma once
// A network interface's throughput from two of its samples (issue 19; docs/kpis.md): bytes per
// second each way, against the link's speed where the driver gives it.

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/protocol/types.h"

namespace lockstep::kpi {

struct NetRate {
  std::string interface;
  std::int64_t timeUnixUs = 0;  // of the later sample
  double rxBytesPerSecond = 0;
  double txBytesPerSecond = 0;
  std::optional<std::uint64_t> linkBitsPerSecond;
  // The busier direction over the link's speed, 0 to 1 (a link carries its speed each way).
  std::optional<double> linkUse;
  std::uint64_t newErrors = 0;  // errors and drops, both ways, between the samples
};

// The busier of two directions over the link's speed, 0 to 1 (a link carries its speed each way);
// nothing where the speed is not known.
std::optional<double> linkUse(double rxBytesPerSecond, double txBytesPerSecond, std::optional<std::uint64_t> linkBitsPerSecond);

// Nothing when the two are not of one interface, out of order, or the counters went back (the
// interface was recreated): no rate is better than a wrong one.
std::optional<NetRate> netRate(const NetSample& before, const NetSample& after);

// "1.25 Gb/s": network rates the way links are sold, in bits.
std::string formatBitsPerSecond(double bitsPerSecond);

}  // namespace lockstep::kpi
