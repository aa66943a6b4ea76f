#pragma once
// What the main thread is doing, for heartbeats: written by the main thread, read by the
// heartbeat thread (heartbeat.h). Under an agent it goes to the rank's progress record too
// (LOCKSTEP_PROGRESS), which the agent reads to see a stall; the reducer marks its collectives there.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

#include "lockstep/common/progress.h"
#include "lockstep/common/store.h"

namespace lockstep::trainer {

using Clock = std::chrono::steady_clock;
inline std::int64_t micros(Clock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }

class Progress {
 public:
  void enter(RankPhase phase) {
    phase_.store(phase);
    since_.store(Clock::now().time_since_epoch().count());
    record_.phase(recordPhase(phase), phase == RankPhase::kCheckpoint);
  }
  void completed(std::uint64_t step) {
    step_.store(static_cast<std::int64_t>(step));
    record_.stepDone(static_cast<std::int64_t>(step));
  }
  progress::Writer& record() { return record_; }
  std::int64_t step() const { return step_.load(); }
  RankPhase phase() const { return phase_.load(); }
  std::int64_t millisInPhase() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch() - Clock::duration(since_.load()))
        .count();
  }

 private:
  std::atomic<std::int64_t> step_{0};
  std::atomic<RankPhase> phase_{RankPhase::kStartup};
  std::atomic<Clock::rep> since_{Clock::now().time_since_epoch().count()};
  progress::Writer record_ = progress::Writer::fromEnvironment();

  static std::string_view recordPhase(RankPhase phase) {
    switch (phase) {
      case RankPhase::kStartup: return "start-up";
      case RankPhase::kCompute: return "compute";
      case RankPhase::kCommunicate: return "all-reduce";
      case RankPhase::kCheckpoint: return "checkpoint";
    }
    return "";
  }
};

}  // namespace lockstep::trainer
