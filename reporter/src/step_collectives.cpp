#include "step_collectives.h"

#include <algorithm>
#include <iterator>
#include <limits>

#include "lockstep/protocol/names.h"
#include "lockstep/protocol/validate.h"

namespace lockstep {
namespace {

static_assert(std::size(kCollectiveKindNames) == 12, "StepCollectives holds one entry per kind");

// validateStepReport's bounds (validate.h). Sums saturate at a week, so that a step's report is
// never refused for its collectives.
constexpr std::int64_t kWeekUs = kMaxStepTimeUs;

using Refused = StepCollectives::Refused;
using Refusal = StepCollectives::Refusal;

std::optional<Refused> checkKind(int kind) {
  if (kind >= 1 && kind <= static_cast<int>(std::size(kCollectiveKindNames))) return std::nullopt;
  return Refused{Refusal::kUnknownKind,
                 "collective kind " + std::to_string(kind) + " is unknown (LOCKSTEP_ALL_REDUCE .. LOCKSTEP_PULL)"};
}

std::optional<Refused> checkTime(const char* what, std::int64_t us) {
  if (us < 0)
    return Refused{Refusal::kNegative, std::string("collective ") + what + " " + std::to_string(us) + " is negative"};
  if (us > kWeekUs) {
    return Refused{Refusal::kOverAWeek,
                   std::string("collective ") + what + " " + std::to_string(us) + " us is over a week (nanoseconds?)"};
  }
  return std::nullopt;
}

std::optional<Refused> firstOf(std::initializer_list<std::optional<Refused>> checks) {
  for (const auto& c : checks) {
    if (c) return c;
  }
  return std::nullopt;
}

template <class T>
void addSaturating(T& sum, T value, T cap) {
  sum = value > cap - sum ? cap : sum + value;
}

std::int64_t microsBetween(StepCollectives::Clock::time_point from, StepCollectives::Clock::time_point to) {
  return std::max<std::int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(to - from).count());
}

}  // namespace

StepCollectives::StepCollectives() { spans_.reserve(kMaxCollectiveSpans); }

std::optional<Refused> StepCollectives::start(int kind, std::uint64_t bytes, Clock::time_point now,
                                              std::int64_t nowUnixUs) {
  if (auto bad = checkKind(kind)) return bad;
  if (started_) {
    return Refused{Refusal::kAlreadyStarted,
                   "a collective was started before the last one ended (lockstep_collective_end)"};
  }
  started_ = Started{static_cast<CollectiveKind>(kind), bytes, now, nowUnixUs};
  return std::nullopt;
}

void StepCollectives::end(Clock::time_point now) {
  if (!started_) return;  // lockstep_collective_begin's end, or a refused start
  const std::int64_t us = std::min(microsBetween(started_->at, now), kWeekUs);
  span(CollectiveSpan{started_->kind, started_->unixUs, us, us, started_->bytes});
  started_.reset();
}

std::optional<Refused> StepCollectives::timed(int kind, std::uint64_t bytes, std::int64_t startUnixUs,
                                              std::int64_t durationUs, std::int64_t exposedUs, std::int64_t nowUnixUs) {
  if (auto bad = firstOf({checkKind(kind), checkTime("duration", durationUs), checkTime("exposed time", exposedUs)}))
    return bad;
  const std::int64_t start = startUnixUs < 0 ? nowUnixUs - durationUs : startUnixUs;
  if (start < 0 || start > kMaxTimeUnixUs) {
    return Refused{Refusal::kNotUnixTime, "collective start " + std::to_string(startUnixUs) +
                                              " is not microseconds since 1970 (nanoseconds?)"};
  }
  span(CollectiveSpan{static_cast<CollectiveKind>(kind), start, durationUs, exposedUs, bytes});
  return std::nullopt;
}

std::optional<Refused> StepCollectives::totals(int kind, std::uint32_t n, std::int64_t timeUs, std::int64_t exposedUs,
                                               std::uint64_t bytes) {
  if (auto bad = firstOf({checkKind(kind), checkTime("time", timeUs), checkTime("exposed time", exposedUs)}))
    return bad;
  count(static_cast<CollectiveKind>(kind), n, timeUs, exposedUs, bytes);
  return std::nullopt;
}

void StepCollectives::span(const CollectiveSpan& s) {
  count(s.kind, 1, s.durationUs, s.exposedUs, s.bytes);
  if (spans_.size() < kMaxCollectiveSpans) spans_.push_back(s);
}

void StepCollectives::count(CollectiveKind kind, std::uint32_t n, std::int64_t timeUs, std::int64_t exposedUs,
                            std::uint64_t bytes) {
  const auto i = static_cast<std::size_t>(kind) - 1;
  CollectiveTimes& t = byKind_[i];
  t.kind = kind;
  addSaturating(t.count, n, std::numeric_limits<std::uint32_t>::max());
  addSaturating(t.timeUs, timeUs, kWeekUs);
  addSaturating(t.exposedUs, exposedUs, kWeekUs);
  addSaturating(t.bytes, bytes, std::numeric_limits<std::uint64_t>::max());
  seen_[i] = seen_[i] || n > 0 || timeUs > 0 || exposedUs > 0 || bytes > 0;
}

void StepCollectives::takeInto(StepReport& report) {
  std::int64_t exposedUs = 0;
  bool any = false;
  for (std::size_t i = 0; i < byKind_.size(); ++i) {
    if (!seen_[i]) continue;
    report.collectives.push_back(byKind_[i]);
    exposedUs += byKind_[i].exposedUs;
    any = true;
  }
  if (any && !report.exposedCommTimeUs) report.exposedCommTimeUs = std::min(exposedUs, report.stepTimeUs);
  report.collectiveSpans.assign(spans_.begin(), spans_.end());
  byKind_ = {};
  seen_ = {};
  spans_.clear();
}

}  // namespace lockstep
