#include "jobs/job_membership.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "base/host.h"
#include "jobs/job.h"
#include "jobs/job_cgroup.h"
#include "lockstep/common/fd.h"

namespace lockstep::agent {
namespace {

std::string proc(pid_t pid, const char* what) { return "/proc/" + std::to_string(pid) + "/" + what; }

std::optional<NamespaceId> namespaceAt(const std::string& link) {
  struct stat st {};
  if (::stat(link.c_str(), &st) != 0) return std::nullopt;
  return NamespaceId{st.st_dev, st.st_ino};
}

}  // namespace

std::optional<NamespaceId> jobPidNamespace(const Job& job) {
  for (const Rank& r : job.ranks) {
    if (r.state != JobState::kRunning || r.pid <= 0) continue;
    // The keeper joined the job's PID namespace for its children (process.h, SpawnOptions::Join);
    // it is the rank's keeper still when its start time is the one the agent keeps, before and after.
    const auto same = [&] {
      const auto stat = readProcStat(r.pid);
      return stat && stat->state != 'Z' && stat->startTicks == r.startTicks;
    };
    if (!same()) continue;
    const auto ns = namespaceAt(proc(r.pid, "ns/pid_for_children"));
    if (ns && same()) return ns;
  }
  // No rank runs (what the last ones sent is read after they ended): the init's keeper, which made
  // the namespace for its child, the init, while this agent runs it (its child: not reaped, its
  // pid is not reused).
  if (job.init.keeper > 0) {
    const auto stat = readProcStat(job.init.keeper);
    if (stat && stat->state != 'Z') return namespaceAt(proc(job.init.keeper, "ns/pid_for_children"));
  }
  return std::nullopt;
}

bool inPidNamespace(pid_t pid, const NamespaceId& ns) {
  UniqueFd at(::open(proc(pid, "ns/pid").c_str(), O_RDONLY | O_CLOEXEC));
  // A rank may make PID namespaces of its own below its job's (one nested in another of the job's
  // is still the job's): up to the agent's, whose parent the kernel does not give it.
  for (int depth = 0; at.valid() && depth < 32; ++depth) {
    struct stat st {};
    if (::fstat(at.get(), &st) != 0) return false;
    if (NamespaceId{st.st_dev, st.st_ino} == ns) return true;
    at = UniqueFd(::ioctl(at.get(), NS_GET_PARENT));
  }
  return false;
}

bool isJobProcess(const Job& job, pid_t pid, uid_t uid) {
  if (pid <= 0) return false;
  // A root agent runs each job as its user: a process of another user is not the job's.
  if (::geteuid() == 0 && uid != job.owner.uid) return false;
  // A rank's own program is the job's, and the agent knows its pid: also while it is ending,
  // gone, or a zombie (a program that reports and ends at once, read after it ended), when its
  // namespaces can no longer be read.
  if (std::any_of(job.ranks.begin(), job.ranks.end(), [&](const Rank& r) { return r.programPid == pid; })) return true;
  const auto stat = readProcStat(pid);
  if (!stat || stat->state == 'Z' || stat->state == 'X') return false;
  const auto ns = jobPidNamespace(job);
  if (!ns) return false;  // nothing of the job runs to tell its processes by
  if (ns != namespaceAt("/proc/self/ns/pid") && !inPidNamespace(pid, *ns)) return false;
  return inCgroups(pid, job.cgroups.distinct());
}

}  // namespace lockstep::agent
