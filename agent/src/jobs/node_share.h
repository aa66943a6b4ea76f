#pragma once
// What of a node's cores and memory its running jobs hold, and what a new job's part gets
// (docs/fences.md): cores of its own, from those no running job holds, and the memory its limit
// reserves. A start that asks for more than is free is refused with the figures, unless the node
// is over-committed on purpose (the agent's cpu-overcommit): then ranks share the least-held
// cores. Memory is never over-committed: a limit is a promise to the job and to its neighbours.

#include <cstdint>
#include <string>
#include <vector>

#include "jobs/job_cgroup.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct NodeCapacity {
  std::string node;
  std::vector<int> cpus;          // the cores the agent may give out
  std::uint64_t memoryBytes = 0;  // the node's memory
  bool overcommit = false;
};

// A running job's part here, or what a new one asks for.
struct Held {
  std::vector<int> cpus;
  std::uint64_t memoryBytes = 0;  // its ranks' limits together; 0: unbounded, nothing reserved
};
struct Ask {
  std::uint32_t cores = 0;
  std::uint64_t memoryBytes = 0;
};
struct NodeFree {
  std::uint32_t cores = 0;
  std::uint64_t memoryBytes = 0;
};

NodeFree freeOf(const NodeCapacity& node, const std::vector<Held>& held);

// The cores for `ask`, or why the node cannot give them and the memory: "node-a has 3 of 16
// cores and 20.0 GiB of 128.0 GiB free; the job asks for 8 cores and 64.0 GiB".
Result<std::vector<int>> coresFor(const NodeCapacity& node, const std::vector<Held>& held, const Ask& ask);

// The processes a part runs besides its ranks' own: its init and its keeper, each rank's keeper,
// and a margin.
inline constexpr std::uint64_t partOwnProcesses(std::uint64_t ranks) { return ranks + 16; }

// What the part of `spec` with ranks `local` may take here: memory (each rank's, the spec's or
// else `nodeMemPerRank`), processes and threads, the GPUs its ranks may open. Not the cores.
PartLimits partLimits(const JobSpec& spec, const std::vector<RankPlacement>& local, std::uint64_t nodeMemPerRank);
// The memory each rank of `spec` may use here; 0: unbounded.
std::uint64_t memPerRank(const JobSpec& spec, std::uint64_t nodeMemPerRank);

}  // namespace lockstep::agent
