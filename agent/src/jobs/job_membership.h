#pragma once
// Whether a process is one of a job's on this node: what the report socket asks of the process that
// sent a record (stream/rank_inbox.h, through JobManager::sentByJob; docs/security.md). A process
// is the job's when it has what all of the job's processes have and another job's cannot forge:
// - with the sandbox, the job's PID namespace (its init's: the one its ranks' keepers give their
//   programs), or one nested in it;
// - where the job has a cgroup, that cgroup or one below it;
// - when the agent is root, the job's user's uid.
// A process gone (or a zombie) by the time it is asked about has nothing left to show: it is the
// job's only when it was one of the job's ranks' programs itself (its pid, which the agent knows).
// Private to jobs/ (over job.h).

#include <sys/types.h>

#include <optional>
#include <string>

namespace lockstep::agent {

struct Job;

// A namespace, by its /proc/PID/ns link's device and inode.
struct NamespaceId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const NamespaceId&) const = default;
};

// The PID namespace the job's ranks run in here: what a running rank's keeper (the same process the
// agent started or adopted, by its start time) gives its children, else the job's init's keeper
// (while this agent runs it); nullopt when neither can be read. Without the sandbox it is the
// agent's own.
std::optional<NamespaceId> jobPidNamespace(const Job& job);

// Whether `pid`'s PID namespace is `ns` or one nested in it; false when it cannot be read.
bool inPidNamespace(pid_t pid, const NamespaceId& ns);

// Whether `pid`, running as `uid` (the agent's numbers, as SO_PEERCRED gives them), is one of the
// job's processes (above).
bool isJobProcess(const Job& job, pid_t pid, uid_t uid);

}  // namespace lockstep::agent
