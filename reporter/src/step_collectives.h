#pragma once
// The collectives a native program reports between two steps (lockstep_collective_start/end,
// _timed, _totals): totals by kind and the first kMaxCollectiveSpans one by one, in fixed memory,
// until the next step report takes them. Used by one thread, as its reporter is.

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep {

class StepCollectives {
 public:
  using Clock = std::chrono::steady_clock;

  // Why a call was refused; each is said once per reporter (a bit of a mask).
  enum class Refusal : std::uint32_t {
    kUnknownKind = 1,
    kNegative = 2,
    kOverAWeek = 4,
    kNotUnixTime = 8,
    kAlreadyStarted = 16,
  };
  struct Refused {
    Refusal reason;
    std::string message;
  };

  StepCollectives();

  // A blocking collective begins now; end() closes it, all of its time exposed.
  std::optional<Refused> start(int kind, std::uint64_t bytes, Clock::time_point now, std::int64_t nowUnixUs);
  void end(Clock::time_point now);
  // One the program timed itself; startUnixUs < 0: it ended at nowUnixUs.
  std::optional<Refused> timed(int kind, std::uint64_t bytes, std::int64_t startUnixUs, std::int64_t durationUs,
                               std::int64_t exposedUs, std::int64_t nowUnixUs);
  // Adds to a kind's totals without a span.
  std::optional<Refused> totals(int kind, std::uint32_t count, std::int64_t timeUs, std::int64_t exposedUs,
                                std::uint64_t bytes);

  // Moves the step's collectives into `report` (setting exposedCommTimeUs, capped at its step
  // time, when it is unknown) and starts over; a started collective stays open for the next step.
  void takeInto(StepReport& report);

 private:
  struct Started {
    CollectiveKind kind;
    std::uint64_t bytes;
    Clock::time_point at;
    std::int64_t unixUs;
  };
  void count(CollectiveKind kind, std::uint32_t n, std::int64_t timeUs, std::int64_t exposedUs, std::uint64_t bytes);
  void span(const CollectiveSpan& s);

  std::array<CollectiveTimes, 12> byKind_{};  // index kind - 1; count 0 and nothing else: none
  std::array<bool, 12> seen_{};
  std::vector<CollectiveSpan> spans_;  // at most kMaxCollectiveSpans, reserved once
  std::optional<Started> started_;
};

}  // namespace lockstep
