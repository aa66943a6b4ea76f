#pragma once
// The fences of a job's part on a node (docs/fences.md), as Slurm's task/cgroup sets them: a cgroup
// of its own in each hierarchy the agent may write, made and limited before any of its processes
// runs, which its init, keepers and ranks join first thing (process.h, cgroupProcsFds).
//
// - The cgroup2 hierarchy (root's, or a unit's with Delegate=yes): the part's own cgroup, so that
//   the agent kills exactly the job (cgroup.kill: whatever it forked, wherever it went).
// - memory (the part's ranks' memory.max, no swap), pids (pids.max: processes and threads) and
//   cpuset (the cores the agent gave its ranks): from the cgroup2 hierarchy where they are enabled
//   in the agent's subtree (the agent moves into a leaf of its own, lockstep-agent, when its cgroup
//   must be empty to enable them), else from their cgroup v1 hierarchies (a hybrid host).
// - devices: a rank opens only its own GPUs' device nodes (device_fence.h): the v1 devices
//   controller, else a BPF program on the part's cgroup2 cgroup.
// What a host cannot give is off, and the agent says once which and why (NodeCgroups::off).

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jobs/device_fence.h"
#include "lockstep/common/result.h"

namespace lockstep::agent {

// One hierarchy's cgroup of the agent: its jobs' cgroups go below it. Empty: not available.
struct CgroupHierarchy {
  std::string base;
  bool v2 = false;
  bool available() const { return !base.empty(); }
};

// What the agent found at start (probeCgroups).
struct NodeCgroups {
  CgroupHierarchy unified, memory, pids, cpuset, devices;
  std::vector<std::string> off;  // each fence that is off, and why: "memory: ..."
  std::vector<int> cpus;         // the cores the agent may give out (its cpuset's, else its affinity)
  std::string mems;              // its memory nodes, which a v1 cpuset must be given
};

// Finds the hierarchies and, with `enable`, enables the controllers it can (which may move the
// calling process into a leaf of its cgroup); without, says what is there.
NodeCgroups probeCgroups(bool enable = true);

// The agent's own cgroup in the cgroup2 hierarchy (its parent, once it moved into lockstep-agent),
// or nullopt and why there is none it may write.
std::optional<std::string> jobCgroupBase(std::string* why);

// What a job's part may take on this node.
struct PartLimits {
  std::uint64_t memoryBytes = 0;  // 0: unbounded
  std::uint64_t processes = 0;    // 0: unbounded
  std::vector<int> cpus;          // empty: the agent's
  DeviceFence devices;            // the GPUs its ranks may open
};

// A part's cgroups, one per hierarchy ("" where none; v2 controllers share `unified`).
struct PartCgroups {
  std::string unified, memory, pids, cpuset, devices;
  bool operator==(const PartCgroups&) const = default;
  bool empty() const { return distinct().empty(); }
  std::vector<std::string> distinct() const;
};

// lockstep-NODE-DIGEST-JOB-ATTEMPT: the cgroups' name for a job's attempt on the agent of node
// NODE whose state directory is `stateDir` (its digest: several agents may share a machine's
// hierarchies, and a restarted agent finds its jobs' again).
std::string partCgroupName(const std::string& node, const std::string& stateDir, const std::string& jobId,
                           std::uint32_t attempt);
// What every such name of that agent begins with.
std::string partCgroupPrefix(const std::string& node, const std::string& stateDir);
// Kills and removes the cgroups whose names begin with `prefix` under the caller's cgroup in each
// hierarchy (what an agent stopped with jobs running leaves, as it should: a test's fixture
// removes it). Enables nothing; returns how many remain.
int removeCgroupsNamed(const std::string& prefix);
PartCgroups partCgroups(const NodeCgroups& node, const std::string& name);

// Makes them anew (what an earlier run of the same attempt left is killed first) and sets `limits`.
Result<void> makePartCgroups(const NodeCgroups& node, const PartCgroups& part, const PartLimits& limits);

// What the kernel counted in a part: its processes killed at its memory limit (memory.events'
// oom_kill), forks refused at its process limit (pids.events' max).
struct PartEvents {
  std::uint64_t oomKills = 0, forksRefused = 0;
};
PartEvents partEvents(const PartCgroups& part);

// Whether process `pid` is in each of `dirs` (cgroup directories, in any hierarchy) or below it;
// false where its cgroups cannot be read.
bool inCgroups(pid_t pid, const std::vector<std::string>& dirs);

// Kills every process in it (cgroup.kill, Linux 5.14; before it, SIGKILL to each of cgroup.procs).
void killPart(const PartCgroups& part);
// Removes what is empty of it; true once nothing of it remains.
bool removePart(const PartCgroups& part);

// "0-3,8" and back.
std::string cpuListText(const std::vector<int>& cpus);
std::vector<int> parseCpuList(const std::string& text);

}  // namespace lockstep::agent
