#include "jobs/job_cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <functional>
#include <csignal>
#include <filesystem>
#include <sstream>

#include "base/host.h"
#include "lockstep/common/fd.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

bool writeTo(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  return fd.valid() && ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

// The cgroup2 hierarchy's mount point, from /proc/self/mountinfo.
std::string cgroup2Mount() {
  std::istringstream lines(readKernelFile("/proc/self/mountinfo").value_or(""));
  for (std::string line; std::getline(lines, line);) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line);
    std::string id, parent, device, root, mountPoint;
    fields >> id >> parent >> device >> root >> mountPoint;
    if (root == "/") return mountPoint;
  }
  return "";
}

}  // namespace

std::optional<std::string> jobCgroupBase(std::string* why) {
  const std::string mount = cgroup2Mount();
  if (mount.empty()) {
    *why = "no cgroup2 hierarchy is mounted";
    return std::nullopt;
  }
  std::istringstream lines(readKernelFile("/proc/self/cgroup").value_or(""));
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("0::", 0) != 0) continue;
    const std::string base = (fs::path(mount) / fs::path(line.substr(3)).relative_path()).lexically_normal().string();
    if (::access(base.c_str(), W_OK) != 0 || ::access((fs::path(base) / "cgroup.procs").c_str(), W_OK) != 0) {
      *why = "the agent's cgroup " + base + " is not delegated to it (a unit needs Delegate=yes)";
      return std::nullopt;
    }
    return base;
  }
  *why = "the agent is in no cgroup2 cgroup";
  return std::nullopt;
}

std::string jobCgroupPath(const std::string& base, const std::string& node, const std::string& stateDir,
                          const std::string& jobId, std::uint32_t attempt) {
  char digest[9];
  std::snprintf(digest, sizeof digest, "%08x", static_cast<unsigned>(std::hash<std::string>{}(stateDir) & 0xffffffffu));
  std::string name = "lockstep-" + node + "-" + digest + "-" + jobId + "-" + std::to_string(attempt);
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
  }
  return (fs::path(base) / name).string();
}

Result<void> makeJobCgroup(const std::string& path) {
  if (::rmdir(path.c_str()) != 0 && errno == EBUSY) {
    killJobCgroup(path);  // what an earlier run of this attempt left (the agent was away when it ended)
    for (int i = 0; i < 100 && ::rmdir(path.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(10000);
  }
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) return errnoError("cannot replace the job's cgroup " + path, errno);
  if (::mkdir(path.c_str(), 0755) != 0) return errnoError("cannot make the job's cgroup " + path, errno);
  return {};
}

void killJobCgroup(const std::string& path) {
  if (writeTo(path + "/cgroup.kill", "1")) return;
  std::istringstream pids(readKernelFile(path + "/cgroup.procs").value_or(""));
  for (pid_t pid; pids >> pid;) ::kill(pid, SIGKILL);
}

bool removeJobCgroup(const std::string& path) { return ::rmdir(path.c_str()) == 0 || errno == ENOENT; }

}  // namespace lockstep::agent
