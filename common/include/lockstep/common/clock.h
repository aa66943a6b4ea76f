#pragma once
// Wall-clock time as Lockstep's messages carry it: microseconds since the Unix epoch.

#include <chrono>
#include <cstdint>

namespace lockstep {

inline std::int64_t unixMicrosNow() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace lockstep
