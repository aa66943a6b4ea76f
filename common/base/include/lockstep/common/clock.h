#pragma once
// Wall-clock time as Lockstep's messages carry it: microseconds since the Unix epoch.

#include <chrono>
#include <cstdint>

namespace lockstep {

inline std::int64_t unixMicrosNow() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// How far another machine's clock is from this one's, as NTP estimates it: from an exchange
// timed on this clock (sent, received) that carried the other's time. The other's time was read
// somewhere within the round trip, so the true offset lies within `uncertaintyUs` of `offsetUs`
// (half the round trip). A record stamped by that machine at t happened at t - offsetUs here.
struct ClockOffset {
  std::int64_t offsetUs = 0;        // the other clock minus this one
  std::int64_t uncertaintyUs = 0;   // the true offset is within offsetUs ± uncertaintyUs
  std::int64_t measuredUnixUs = 0;  // when, on this clock

  static ClockOffset of(std::int64_t sentUs, std::int64_t theirsUs, std::int64_t receivedUs) {
    const std::int64_t middle = sentUs + (receivedUs - sentUs) / 2;
    return {theirsUs - middle, (receivedUs - sentUs + 1) / 2, receivedUs};
  }
  std::int64_t toLocal(std::int64_t theirUs) const { return theirUs - offsetUs; }
};

}  // namespace lockstep
