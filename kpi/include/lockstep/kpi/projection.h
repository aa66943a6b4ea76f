#pragma once
// What more (or fewer) ranks would buy (docs/kpis.md, "Projecting to other rank counts"): from a
// job's measured step (data + compute time, the rest of the step, exposed communication), the
// bytes it all-reduces and its bus bandwidth, the step time, throughput, scaling efficiency and
// cost per job at other rank counts. Data parallel with the per-rank batch kept. Each rank keeps
// its compute time where it has its own GPU (or node); ranks that share one node's CPU cores
// share its compute, so theirs grows with their number. The all-reduce's bus bandwidth is taken
// to stay (nccl-tests' premise), so its time grows with 2(m-1)/m; what of it hid behind compute
// at the measured count hides at any.

#include <cstdint>
#include <optional>
#include <vector>

#include "lockstep/kpi/kpi.h"

namespace lockstep::kpi {

struct ScalingInputs {
  std::uint32_t ranks = 0;        // measured at
  double samplesPerRankStep = 0;  // a rank's samples per step
  double busyUs = 0;              // data + compute per step
  double otherUs = 0;             // the rest of the step beyond busy and exposed (optimizer, ...)
  double exposedUs = 0;           // exposed communication per step, as measured
  Maybe bytesPerStep;             // all-reduced per rank per step
  Maybe busBandwidth;             // bytes/s
  Maybe aloneUs;                  // a 1-rank run's measured step: the 1-rank point, where there is one
  bool sharedNode = false;        // the ranks run on one node's CPU cores and share them
  std::uint32_t nodeCores = 0;    // that node's cores; 0: unknown
  std::uint32_t threadsPerRank = 0;  // a rank's BLAS threads; 0: the trainer's default, cores / ranks
  Maybe costPerRankSecond;        // the job's cost so far over its rank-seconds
  Maybe jobSamples;               // the whole job's samples (its steps x global batch), for cost per job
};

struct Projected {
  std::uint32_t ranks = 0;
  double stepUs = 0;
  double exposedUs = 0;
  double samplesPerSecond = 0;
  double efficiency = 0;  // throughput / (ranks x one rank alone)
  Maybe costPerJob;       // the job's samples at this throughput, m ranks at the measured cost rate
};

// A CPU job whose ranks are all placed on one node.
bool sharesOneNode(const JobSpec& spec);
// From a snapshot; empty without a timed step split. `nodeCores`: the cores of the node a
// one-node CPU job shares (0: unknown).
std::optional<ScalingInputs> scalingInputs(const JobKpis& k, const JobSpec& spec, std::uint32_t nodeCores = 0);
// A many-rank job's inputs with a 1-rank job's step as the 1-rank point (that run has no
// all-reduce in its step; the many-rank run has the only bandwidth measured).
ScalingInputs withStepOf(ScalingInputs many, const ScalingInputs& one);
// Half, 1x, 2x, 4x and 8x the measured ranks (half only from 2 up).
std::vector<std::uint32_t> projectionRanks(std::uint32_t measured);
// At each rank count; a count above 1 needs bytes and bus bandwidth (else it is left out).
std::vector<Projected> project(const ScalingInputs& in, const std::vector<std::uint32_t>& ranks);

}  // namespace lockstep::kpi
