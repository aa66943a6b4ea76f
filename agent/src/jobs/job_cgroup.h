#pragma once
// A cgroup of its own for each job's part on a node, where cgroup v2 is delegated to the agent
// (its own cgroup, in the cgroup2 hierarchy, is one it may write: root's, or a unit's with
// Delegate=yes). The job's init and ranks join it before they run anything, so that the agent
// kills exactly the job (cgroup.kill: whatever it forked, wherever it went, once its last rank
// ended). No controller is enabled: the agent's own cgroup may keep its processes.
// Elsewhere there are none, and the agent says so once.

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/common/result.h"

namespace lockstep::agent {

// Where the agent makes its jobs' cgroups: its own cgroup's directory, or nullopt (and why) when
// there is no cgroup2 hierarchy it may write.
std::optional<std::string> jobCgroupBase(std::string* why);

// `base`/lockstep-NODE-DIGEST-JOB-ATTEMPT: the cgroup of a job's attempt on the agent of node NODE
// whose state directory is `stateDir` (its digest: several agents may share a machine's
// hierarchy, and a restarted agent finds its jobs' again).
std::string jobCgroupPath(const std::string& base, const std::string& node, const std::string& stateDir,
                          const std::string& jobId, std::uint32_t attempt);
// `path` made anew: what an earlier run of the same attempt left there is killed first.
Result<void> makeJobCgroup(const std::string& path);
// Kills every process in it (cgroup.kill, Linux 5.14; before it, SIGKILL to each of cgroup.procs).
void killJobCgroup(const std::string& path);
// Removes it once it is empty; false while processes remain.
bool removeJobCgroup(const std::string& path);

}  // namespace lockstep::agent
