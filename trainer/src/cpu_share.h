#pragma once
// Each local rank of a CPU job computes on its own share of the CPUs the process may use: its BLAS
// threads and its communication thread together. An all-reduce then takes CPU time from its own
// rank's compute, never from another's; unpinned, it lands on whichever core is free and slows
// another rank at random, which the others then wait for in the next all-reduce (measured:
// docs/benchmarks.md, "Gradient buckets chosen by measurement").

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::trainer {

struct CpuShare {
  std::vector<int> cpus;  // this rank's; empty: not pinned (too few CPUs to share)
  std::uint32_t threads = 1;
  std::string describe() const;  // "CPUs 2-3"
};

// The share of local rank `localRank` among `localRanks`: the allowed CPUs (sched_getaffinity) cut
// into that many contiguous runs, the first ones one longer where they do not divide evenly.
CpuShare cpuShareOf(const std::vector<int>& allowed, std::uint32_t localRank, std::uint32_t localRanks);

std::vector<int> allowedCpus();
// Whether something bound this process to fewer CPUs than are online (Slurm, taskset, a cpuset):
// then that binding stands.
bool boundAlready(const std::vector<int>& allowed);
// Pins every thread of the process (and those it starts later) to the share; false when refused.
bool pinTo(const CpuShare& share);

}  // namespace lockstep::trainer
