#pragma once
// One core's fp32 GEMM peak on this node: the ceiling a CPU rank's model FLOPs utilization is taken
// against (docs/kpis.md, MFU), its cores' share of it. As configured (--cpu-peak GFLOPS), off, or
// measured once by the trainer (`lockstep-trainer --gemm-peak`, on every core at once, with the
// kernels the trainer computes with) on a thread of its own, and kept in STATE/cpu-peak.json for
// later starts while the CPU and its core count stay the same. Not thread-safe: the loop calls it.

#include <optional>
#include <string>

#include "base/log.h"
#include "base/off_loop.h"

namespace lockstep::agent {

struct CpuPeak {
  std::optional<double> perCore;  // FLOP/s
  std::string basis;              // where it came from, or why it is not known
};

struct CpuPeakSettings {
  std::string node;
  std::string stateDir;
  std::string trainer;
  std::optional<double> gflops;  // configured
  bool off = false;
};

class CpuPeakMeter {
 public:
  CpuPeakMeter(CpuPeakSettings settings, Log& log);

  // What is known now: configured, off, or kept from an earlier start; else not yet.
  CpuPeak now() const { return peak_; }
  // Whether it is still to be measured, or being measured.
  bool busy() const { return needed_ || measuring_; }
  // Called on each turn of the loop while busy(), with whether any job's rank runs here: starts
  // the measurement when none does (ranks would slow the cores and be slowed), and marks one that
  // a rank ran beside as disturbed.
  void tick(bool jobsRunning);
  int wakeFd() const { return running_.wakeFd(); }
  // A measurement that finished: the peak now known (or why not), once; nothing when it was
  // disturbed (then it is measured again when the node is idle).
  std::optional<CpuPeak> take();

  struct Measured {
    CpuPeak peak;
    std::string keep;  // what STATE/cpu-peak.json keeps; empty: nothing (a failed measurement)
  };

 private:
  std::string keptPath() const;
  std::optional<CpuPeak> kept() const;

  CpuPeakSettings settings_;
  Log& log_;
  CpuPeak peak_;
  bool needed_ = false;
  bool measuring_ = false;
  bool disturbed_ = false;
  OffLoop<Measured> running_{1};
};

}  // namespace lockstep::agent
