#include "jobs/job_membership.h"

#include <fcntl.h>
#include <linux/nsfs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>
#include <sstream>
#include <vector>

#include "base/host.h"
#include "jobs/job.h"
#include "lockstep/common/fd.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

std::string proc(pid_t pid, const char* what) { return "/proc/" + std::to_string(pid) + "/" + what; }

std::optional<NamespaceId> namespaceAt(const std::string& link) {
  struct stat st {};
  if (::stat(link.c_str(), &st) != 0) return std::nullopt;
  return NamespaceId{st.st_dev, st.st_ino};
}

// `path` without a trailing slash (but "/").
std::string trimmed(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::set<std::string> split(const std::string& text, char separator) {
  std::set<std::string> out;
  std::istringstream in(text);
  for (std::string word; std::getline(in, word, separator);) {
    if (!word.empty()) out.insert(word);
  }
  return out;
}

struct CgroupMount {
  std::string root, point;
  bool v2 = false;
  std::set<std::string> options;  // a v1 hierarchy's controllers among its super options
};

std::vector<CgroupMount> cgroupMounts() {
  std::vector<CgroupMount> mounts;
  std::istringstream lines(readKernelFile("/proc/self/mountinfo").value_or(""));
  for (std::string line; std::getline(lines, line);) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    CgroupMount m;
    std::string id, parent, device, type, source, superOptions;
    head >> id >> parent >> device >> m.root >> m.point;
    tail >> type >> source >> superOptions;
    if (type != "cgroup" && type != "cgroup2") continue;
    m.v2 = type == "cgroup2";
    m.options = split(superOptions, ',');
    mounts.push_back(std::move(m));
  }
  return mounts;
}

// Whether `inside` is `dir` or below it (both absolute, normalized, without trailing slashes).
bool within(const std::string& inside, const std::string& dir) {
  return inside == dir || dir == "/" || (inside.size() > dir.size() && inside.compare(0, dir.size(), dir) == 0 &&
                                         inside[dir.size()] == '/');
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

bool inCgroup(pid_t pid, const std::string& cgroup) {
  const auto lines = readKernelFile(proc(pid, "cgroup"));
  if (!lines || cgroup.empty()) return false;
  const std::string dir = trimmed(fs::path(cgroup).lexically_normal().string());
  for (const CgroupMount& m : cgroupMounts()) {
    const std::string relative = fs::path(dir).lexically_relative(m.point).string();
    if (relative.empty() || relative.rfind("..", 0) == 0) continue;
    // The cgroup as /proc/PID/cgroup names it in that hierarchy.
    const std::string wanted = trimmed((fs::path(m.root) / relative).lexically_normal().string());
    std::istringstream in(*lines);
    for (std::string line; std::getline(in, line);) {
      const auto first = line.find(':'), second = line.find(':', first + 1);
      if (first == std::string::npos || second == std::string::npos) continue;
      const std::string controllers = line.substr(first + 1, second - first - 1);
      bool hierarchy = m.v2 ? line.compare(0, first, "0") == 0 && controllers.empty() : !controllers.empty();
      for (const auto& c : split(controllers, ',')) hierarchy = hierarchy && m.options.count(c);
      if (hierarchy) return within(trimmed(fs::path(line.substr(second + 1)).lexically_normal().string()), wanted);
    }
    return false;
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
  for (const std::string& cgroup : job.cgroups.distinct()) {
    if (!inCgroup(pid, cgroup)) return false;
  }
  return true;
}

}  // namespace lockstep::agent
