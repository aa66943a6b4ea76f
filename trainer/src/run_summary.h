#pragma once
// What a rank's run came to, for its last log line and its exit code.

#include <cstdint>

namespace lockstep::trainer {

struct RunSummary {
  std::uint64_t firstStep = 0;  // 0, or the checkpoint's step when resumed
  std::uint64_t stepsDone = 0;  // the last completed step
  std::uint64_t totalSteps = 0;
  double finalLoss = 0;
  double seconds = 0;
  double samplesPerSecond = 0;
  double exposedCommFraction = 0;  // exposed all-reduce time / step time, this rank
  bool reachedTargetLoss = false;
  int stoppedBySignal = 0;  // the signal that stopped the run, or 0
  std::uint64_t droppedReports = 0;
};

}  // namespace lockstep::trainer
