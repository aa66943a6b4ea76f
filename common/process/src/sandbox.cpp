#include "sandbox.h"

#include <fcntl.h>
#include <linux/securebits.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <set>

#include "lockstep/common/files.h"

namespace lockstep::sandbox {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kProcFd = "/proc/self/fd/";

// Absolute, normal, without a trailing separator.
fs::path clean(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty() && p.has_parent_path() && p != p.root_path()) p = p.parent_path();
  return p;
}

bool writeText(const char* path, const std::string& text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  errno = err;
  return n == static_cast<ssize_t>(text.size());
}

// Writes fd's number after "/proc/self/fd/" in the space plan() reserved, without allocating.
void fillFdPath(std::string& procPath, int fd) {
  char digits[12];
  int n = 0;
  auto v = static_cast<unsigned>(fd);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  for (int i = 0; i < n; ++i) procPath[kProcFd.size() + static_cast<size_t>(i)] = digits[n - 1 - i];
  procPath[kProcFd.size() + static_cast<size_t>(n)] = '\0';
}

// A bind mount made read-only, keeping the flags it has (a user namespace may not drop those it
// inherited locked: nosuid, nodev, noexec, the atime ones).
bool remountReadOnly(const char* path) {
  struct statvfs sv {};
  if (::statvfs(path, &sv) != 0) return false;
  unsigned long flags = MS_REMOUNT | MS_BIND | MS_RDONLY;
  if (sv.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (sv.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (sv.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  if (sv.f_flag & ST_NOATIME) flags |= MS_NOATIME;
  if (sv.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
  if (sv.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  return ::mount(nullptr, path, nullptr, flags, nullptr) == 0;
}

}  // namespace

bool dropCapabilities() {
  for (int cap = 0; cap < 64; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) return false;
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) return false;
  return ::prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED, 0, 0, 0) == 0;
}

Result<Plan> plan(const SpawnOptions::Sandbox& sandbox, bool newPidNamespace) {
  Plan p;
  p.newPid = newPidNamespace;
  p.privateTmp = sandbox.privateTmp;
  const fs::path hide = clean(sandbox.hide);
  if (!hide.is_absolute() || hide == hide.root_path()) {
    return invalidArgument("sandbox: " + sandbox.hide + " is not an absolute path below /");
  }
  struct stat st {};
  if (::stat(hide.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return invalidArgument("sandbox: " + sandbox.hide + " is not a directory");
  }
  p.hide = hide.string();
  if (const std::string shared = privateToJobs(p.hide); sandbox.privateTmp && !shared.empty()) {
    return invalidArgument("sandbox: " + p.hide + " is under " + shared + ", which the private one covers");
  }
  p.userNamespace = ::geteuid() != 0;
  p.uidMap = std::to_string(::geteuid()) + " " + std::to_string(::geteuid()) + " 1\n";
  p.gidMap = std::to_string(::getegid()) + " " + std::to_string(::getegid()) + " 1\n";
  std::set<std::string> made;
  for (const auto& kept : sandbox.keep) {
    const fs::path path = clean(kept);
    const fs::path relative = path.lexically_relative(hide);
    if (relative.empty() || relative == "." || *relative.begin() == "..") {
      return invalidArgument("sandbox: " + kept + " is not below " + p.hide);
    }
    if (::stat(path.c_str(), &st) != 0) return errnoError("sandbox: cannot look at " + kept, errno);
    fs::path at = hide;
    for (auto it = relative.begin(); std::next(it) != relative.end(); ++it) {
      at /= *it;
      if (made.insert(at.string()).second) p.dirsToMake.push_back(at.string());
    }
    const bool readOnly = std::find(sandbox.readOnly.begin(), sandbox.readOnly.end(), kept) != sandbox.readOnly.end();
    p.keep.push_back({path.string(), S_ISDIR(st.st_mode), readOnly, std::string(kProcFd) + std::string(12, '\0'), -1});
  }
  return p;
}

bool enter(Plan& p) {
  if (::unshare(CLONE_NEWNS | (p.userNamespace ? CLONE_NEWUSER : 0)) != 0) return false;
  if (p.userNamespace) {
    // The agent is not dumpable, so /proc/self/*_map would belong to root: become dumpable to
    // write them. Safe now: tracing this process takes CAP_SYS_PTRACE in its new namespace, which
    // only the agent's own namespace holds (other jobs' ranks live in namespaces of their own).
    if (::prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0) return false;
    if (!writeText("/proc/self/setgroups", "deny") || !writeText("/proc/self/uid_map", p.uidMap) ||
        !writeText("/proc/self/gid_map", p.gidMap)) {
      return false;
    }
    // Not dumpable again at once: until exec this process holds a copy of the agent's memory.
    if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) return false;
  }
  // Nothing mounted here reaches the agent's namespace, nor the other way round.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  for (auto& k : p.keep) {
    k.fd = ::open(k.path.c_str(), O_PATH | O_CLOEXEC);
    if (k.fd < 0) return false;
  }
  if (::mount("lockstep-hidden", p.hide.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755") != 0) {
    return false;
  }
  for (const auto& dir : p.dirsToMake) {
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  for (auto& k : p.keep) {
    if (k.directory) {
      if (::mkdir(k.path.c_str(), 0755) != 0 && errno != EEXIST) return false;
    } else {
      const int mountPoint = ::open(k.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
      if (mountPoint < 0) return false;
      ::close(mountPoint);
    }
    fillFdPath(k.procPath, k.fd);
    if (::mount(k.procPath.c_str(), k.path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) return false;
    ::close(k.fd);
    if (k.readOnly && !remountReadOnly(k.path.c_str())) return false;
  }
  for (const char* shared : kPrivateToJobs) {
    if (p.privateTmp && ::mount("lockstep-job", shared, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777") != 0) return false;
  }
  if (p.newPid && ::unshare(CLONE_NEWPID) != 0) return false;
  return p.userNamespace || dropCapabilities();
}

bool enterPidNamespace(const Plan& p) {
  if (!p.newPid) return true;
  return ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) == 0;
}

}  // namespace lockstep::sandbox
