#include "lockstep/common/process.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "lockstep/common/fd.h"
#include "lockstep/common/files.h"
#include "sandbox.h"

extern char** environ;

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Everything exec needs is built before fork: after fork only async-signal-safe calls are allowed.
struct ExecImage {
  std::vector<std::string> envStrings;
  std::vector<char*> argv;
  std::vector<char*> envp;
};

ExecImage buildImage(const SpawnOptions& options) {
  ExecImage image;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const auto name = entry.substr(0, entry.find('='));
    const bool overridden = std::any_of(options.env.begin(), options.env.end(),
                                        [&](const auto& kv) { return kv.first == name; });
    if (!overridden) image.envStrings.emplace_back(entry);
  }
  for (const auto& [name, value] : options.env) image.envStrings.push_back(name + "=" + value);
  for (const auto& arg : options.argv) image.argv.push_back(const_cast<char*>(arg.c_str()));
  image.argv.push_back(nullptr);
  for (auto& e : image.envStrings) image.envp.push_back(e.data());
  image.envp.push_back(nullptr);
  return image;
}

[[noreturn]] void childFail(int pipeFd, int stage) {
  const int report[2] = {stage, errno};
  [[maybe_unused]] ssize_t n = ::write(pipeFd, report, sizeof report);
  ::_exit(127);
}

bool redirect(const std::string& path, int targetFd) {
  if (path.empty()) return true;
  // O_APPEND: whoever trims the file later (copytruncate) does not leave the writer past its end.
  // O_NOFOLLOW: a rank's log lies in a directory the job's earlier ranks could write; a symlink
  // planted there must not make the agent truncate what it points to.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  if (::dup2(fd, targetFd) < 0) return false;  // dup2 clears O_CLOEXEC on the target
  ::close(fd);
  return true;
}

}  // namespace

std::string ExitStatus::describe() const {
  if (signal != 0) {
    const char* name = ::strsignal(signal);
    return "signal " + std::to_string(signal) + " (" + (name != nullptr ? name : "?") + ")";
  }
  return "exit code " + std::to_string(exitCode);
}

std::string ExitStatus::record() const {
  return signal != 0 ? "signal " + std::to_string(signal) + "\n" : "exit " + std::to_string(exitCode) + "\n";
}

std::optional<ExitStatus> ExitStatus::fromRecord(std::string_view record) {
  const auto number = [](std::string_view digits) -> std::optional<int> {
    int value = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec != std::errc() || end != digits.data() + digits.size() || value < 0 || value > 255) return std::nullopt;
    return value;
  };
  if (record.empty() || record.back() != '\n') return std::nullopt;
  record.remove_suffix(1);
  for (const std::string_view prefix : {"exit ", "signal "}) {
    if (record.substr(0, prefix.size()) != prefix) continue;
    const auto value = number(record.substr(prefix.size()));
    if (!value) return std::nullopt;
    return prefix == "exit " ? ExitStatus{*value, 0} : ExitStatus{0, *value};
  }
  return std::nullopt;
}

ExitStatus exitStatusFromWait(int waitStatus) {
  ExitStatus status;
  if (WIFSIGNALED(waitStatus)) {
    status.signal = WTERMSIG(waitStatus);
  } else if (WIFEXITED(waitStatus)) {
    status.exitCode = WEXITSTATUS(waitStatus);
  }
  return status;
}

namespace {

// execve, or execveat of a descriptor (AT_EMPTY_PATH) when there is one; with the open-files limit
// the program would have had (files.h).
void execute(int fd, const char* path, char* const* argv, char* const* envp) {
  restoreOpenFilesLimit();
  if (fd >= 0) {
    ::syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH);
  } else {
    ::execve(path, argv, envp);
  }
}

// Writes `value` in decimal into `out` (at least 12 bytes); async-signal-safe, unlike snprintf.
void formatInt(long value, char* out) {
  char digits[24];
  int n = 0;
  const bool negative = value < 0;
  unsigned long v = negative ? static_cast<unsigned long>(-value) : static_cast<unsigned long>(value);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  int i = 0;
  if (negative) out[i++] = '-';
  while (n > 0) out[i++] = digits[--n];
  out[i] = '\0';
}

// What the forked child needs to become a keeper, built before fork.
struct KeeperImage {
  UniqueFd record;
  std::string executable;
  int executableFd = -1;
  char pid[24] = {};
  char fd[24] = {};
};

Result<KeeperImage> buildKeeper(const Keeper& keeper) {
  KeeperImage image;
  // A new file, whatever was there: the record lies where the job's ranks can write, and a FIFO or
  // a symlink planted in its place must neither block the caller nor send the record elsewhere.
  if (::unlink(keeper.exitRecord.c_str()) != 0 && errno != ENOENT) {
    return errnoError("cannot replace the exit record " + keeper.exitRecord, errno);
  }
  image.record = UniqueFd(
      ::open(keeper.exitRecord.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
  if (!image.record.valid()) return errnoError("cannot create the exit record " + keeper.exitRecord, errno);
  image.executable = keeper.executable;
  image.executableFd = keeper.executableFd;
  formatInt(image.record.get(), image.fd);
  return image;
}

// In the forked child, with every signal blocked: forks the program's process (which returns from
// here to go on to exec) and becomes the keeper. Async-signal-safe calls only.
void forkKeeper(KeeperImage& keeper, int pipeFd) {
  const pid_t program = ::fork();
  if (program < 0) childFail(pipeFd, 9);
  if (program == 0) return;
  const int report[2] = {0, program};  // stage 0: not a failure, the program's pid
  [[maybe_unused]] ssize_t n = ::write(pipeFd, report, sizeof report);
  formatInt(program, keeper.pid);
  // The record must outlive exec (the program's copy closed at its own exec); the working
  // directory must not: a rank could reach what the sandbox hides through /proc/KEEPER/cwd.
  if (::fcntl(keeper.record.get(), F_SETFD, 0) != 0 || ::chdir("/") != 0) {
    ::kill(program, SIGKILL);
    childFail(pipeFd, 9);
  }
  static char arg0[] = "lockstep-keeper";
  char* argv[] = {arg0, const_cast<char*>(kKeeperArg), keeper.pid, keeper.fd, nullptr};
  char* envp[] = {nullptr};  // the keeper needs no environment, and shows none in /proc
  execute(keeper.executableFd, keeper.executable.c_str(), argv, envp);
  ::kill(program, SIGKILL);
  childFail(pipeFd, 9);
}

// What the child sends before exec: the program's pid (from a keeper) and why it failed.
struct ChildReport {
  bool timedOut = false;
  pid_t program = -1;
  int stage = 0;  // 0: exec'd
  int error = 0;
};

ChildReport readChildReport(int fd, std::chrono::milliseconds timeout) {
  ChildReport out;
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd ready{fd, POLLIN, 0};
    const int polled = left.count() > 0 ? ::poll(&ready, 1, static_cast<int>(left.count())) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled == 0) {
      out.timedOut = true;
      return out;
    }
    int report[2] = {0, 0};
    ssize_t n;
    do {
      n = ::read(fd, report, sizeof report);
    } while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(sizeof report)) return out;  // EOF: every process exec'd
    if (report[0] == 0) {
      out.program = report[1];
      continue;
    }
    out.stage = report[0];
    out.error = report[1];
    return out;
  }
}

std::string stageFailure(const SpawnOptions& options, int stage) {
  static constexpr const char* kStages[] = {"",
                                            "setpgid",
                                            "prctl",
                                            "open stdout file",
                                            "open stderr file",
                                            "execute",
                                            "enter the working directory",
                                            "open /dev/null as stdin",
                                            "hide",
                                            "start the keeper process",
                                            "join the job's namespaces",
                                            "become the job's user",
                                            "mount /proc for the job's PID namespace",
                                            "join the job's cgroup",
                                            "drop root's capabilities",
                                            "run on its cores"};
  const char* what = stage >= 1 && stage <= 15 ? kStages[stage] : "start";
  const std::string where = stage == 6   ? " " + options.workingDir
                            : stage == 8 ? " " + options.sandbox->hide + " (a private mount namespace" +
                                               (::geteuid() != 0 ? " in a user namespace" : "") +
                                               "; docs/security.md says what the kernel must allow)"
                                         : "";
  const std::string& program = options.executable.empty() ? options.argv[0] : options.executable;
  return std::string("cannot ") + what + where + " for " + program;
}

// In the child: joins the namespaces another process made (user first: it grants the rights to
// join the others). Async-signal-safe.
bool joinNamespaces(const SpawnOptions::Join& join) {
  for (const auto& [fd, type] : {std::pair{join.userNs, CLONE_NEWUSER}, {join.mountNs, CLONE_NEWNS}, {join.pidNs, CLONE_NEWPID}}) {
    if (fd >= 0 && ::setns(fd, type) != 0) return false;
  }
  // Root in the node's own user namespace: no capability survives exec (sandbox.h).
  return join.userNs >= 0 || ::geteuid() != 0 || sandbox::dropCapabilities();
}

// For good: supplementary groups, gid, uid (raw system calls: this process has one thread).
bool becomeUser(const SpawnOptions::Credentials& c) {
  return ::syscall(SYS_setgroups, c.groups.size(), c.groups.data()) == 0 &&
         ::syscall(SYS_setresgid, c.gid, c.gid, c.gid) == 0 && ::syscall(SYS_setresuid, c.uid, c.uid, c.uid) == 0;
}

// PR_SET_PDEATHSIG for the spawning thread's death (cleared by fork, and by a change of user).
void dieWithParent(const SpawnOptions& options, pid_t parent, int pipeFd) {
  if (options.parentDeathSignal == 0) return;
  if (::prctl(PR_SET_PDEATHSIG, options.parentDeathSignal) != 0) childFail(pipeFd, 2);
  // The parent may have died between fork and prctl.
  if (::getppid() != parent) ::_exit(127);
}

// In the child, past the keeper's fork (in the program): its own /proc, its user, its output files,
// stdin and working directory. Async-signal-safe; fails the spawn with the step that failed.
// parent: the caller, when this process is its child (no keeper between them); else 0.
void becomeProgram(const SpawnOptions& options, sandbox::Plan* plan, pid_t parent, int pipeFd) {
  if (plan != nullptr && !sandbox::enterPidNamespace(*plan)) childFail(pipeFd, 12);
  if (options.credentials && !becomeUser(*options.credentials)) childFail(pipeFd, 11);
  if (options.dropRootCapabilities && ::geteuid() == 0 && !sandbox::dropCapabilities()) childFail(pipeFd, 14);
  if (options.umask) ::umask(*options.umask);
  if (parent != 0) dieWithParent(options, parent, pipeFd);
  // As the user: the files are theirs, and they may not be what the user may not write.
  if (!redirect(options.stdoutPath, STDOUT_FILENO)) childFail(pipeFd, 3);
  if (!redirect(options.stderrPath, STDERR_FILENO)) childFail(pipeFd, 4);
  if (options.stdinFromDevNull) {
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null < 0 || ::dup2(null, STDIN_FILENO) < 0) childFail(pipeFd, 7);
    ::close(null);
  }
  if (!options.workingDir.empty() && ::chdir(options.workingDir.c_str()) != 0) childFail(pipeFd, 6);
  // Not the caller's: in a sandbox it may lie in what is hidden (and /proc/PID/cwd would show it).
  if (options.workingDir.empty() && (options.join || plan != nullptr) && ::chdir("/") != 0) childFail(pipeFd, 6);
}

Result<KeptProcess> spawn(const SpawnOptions& options, KeeperImage* keeper) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return invalidArgument("spawnProcess: no executable given");
  }
  ExecImage image = buildImage(options);
  std::optional<sandbox::Plan> sandboxPlan;
  if (options.newPidNamespace && (keeper == nullptr || !options.sandbox)) {
    return invalidArgument("spawnProcess: a new PID namespace needs a keeper and a sandbox");
  }
  if (options.sandbox) {
    LOCKSTEP_ASSIGN_OR_RETURN(sandboxPlan, sandbox::plan(*options.sandbox, options.newPidNamespace));
  }
  cpu_set_t cores;  // built here: the child makes no calls that are not async-signal-safe
  CPU_ZERO(&cores);
  for (int cpu : options.cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cores);
  }
  int errPipe[2];
  if (::pipe2(errPipe, O_CLOEXEC) != 0) return errnoError("pipe2", errno);
  const pid_t parent = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(errPipe[0]);
    ::close(errPipe[1]);
    return errnoError("fork", err);
  }
  if (pid == 0) {
    ::close(errPipe[0]);
    // A descriptor some library opened without O_CLOEXEC must not reach the program.
    ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
    if (options.newProcessGroup && ::setpgid(0, 0) != 0) childFail(errPipe[1], 1);
    for (int cgroupProcs : options.cgroupProcsFds) {
      if (::write(cgroupProcs, "0", 1) != 1) childFail(errPipe[1], 13);
    }
    if (!options.cpus.empty() && ::sched_setaffinity(0, sizeof cores, &cores) != 0) childFail(errPipe[1], 15);
    if (options.join && !joinNamespaces(*options.join)) childFail(errPipe[1], 10);
    // Before chdir: a working directory entered before the tmpfs covers it would still lead
    // (through "..") to what it hides.
    if (sandboxPlan && !sandbox::enter(*sandboxPlan)) childFail(errPipe[1], 8);
    sigset_t signals;
    if (keeper != nullptr) {
      // Blocked from here on in the keeper (a stop's SIGTERM to the group is for the program),
      // unblocked below in the program.
      sigfillset(&signals);
      ::sigprocmask(SIG_SETMASK, &signals, nullptr);
      dieWithParent(options, parent, errPipe[1]);  // the keeper does, not the program
      forkKeeper(*keeper, errPipe[1]);
    }
    becomeProgram(options, sandboxPlan ? &*sandboxPlan : nullptr, keeper == nullptr ? parent : 0, errPipe[1]);
    // Signals the parent ignored or blocked must not leak into the child.
    sigemptyset(&signals);
    ::sigprocmask(SIG_SETMASK, &signals, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    execute(options.executableFd, options.executable.empty() ? image.argv[0] : options.executable.c_str(),
            image.argv.data(), image.envp.data());
    childFail(errPipe[1], 5);
  }

  ::close(errPipe[1]);
  // The pipe closes at exec (O_CLOEXEC) or carries why the child failed; a child stuck before
  // exec (a hung mount) must not hold the caller, the agent's event loop among them.
  const ChildReport report = readChildReport(errPipe[0], options.startTimeout);
  ::close(errPipe[0]);
  if (report.timedOut) {
    ::kill(pid, SIGKILL);
    if (report.program > 0) ::kill(report.program, SIGKILL);
    // A child stuck in the kernel (D state) dies only when its system call returns: reap it if it
    // goes within a second, else leave it (it becomes a zombie of ours, not a hang).
    for (int i = 0; i < 100 && ::waitpid(pid, nullptr, WNOHANG) == 0; ++i) ::usleep(10000);
    return timeoutError(options.argv[0] + " did not start within " + std::to_string(options.startTimeout.count()) +
                        " ms (its working directory or program on a hung file system?)");
  }
  if (report.stage != 0) {
    int status = 0;
    ::waitpid(pid, &status, 0);  // a keeper whose program failed ends as soon as it has reaped it
    return errnoError(stageFailure(options, report.stage), report.error);
  }
  return KeptProcess{pid, keeper != nullptr ? report.program : pid};
}

}  // namespace

Result<pid_t> spawnProcess(const SpawnOptions& options) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto spawned, spawn(options, nullptr));
  return spawned.keeper;
}

Result<KeptProcess> spawnKept(const SpawnOptions& options, const Keeper& keeper) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto image, buildKeeper(keeper));
  return spawn(options, &image);
}

namespace {

bool dumpsCore(int signal) {
  for (const int s : {SIGQUIT, SIGILL, SIGTRAP, SIGABRT, SIGBUS, SIGFPE, SIGSEGV, SIGSYS, SIGXCPU, SIGXFSZ}) {
    if (s == signal) return true;
  }
  return false;
}

}  // namespace

int runKeeper(int argc, char** argv) {
  char* end = nullptr;
  const long program = argc == 4 ? std::strtol(argv[2], &end, 10) : 0;
  const long record = argc == 4 && end != nullptr && *end == '\0' ? std::strtol(argv[3], &end, 10) : -1;
  if (program <= 0 || record < 0 || *end != '\0' || std::string_view(argv[1]) != kKeeperArg) {
    std::fprintf(stderr, "%s PROGRAM_PID RECORD_FD: only the agent starts a keeper, for a rank it spawns\n", kKeeperArg);
    return 2;
  }
  int status = 0;
  pid_t reaped;
  while ((reaped = ::waitpid(static_cast<pid_t>(program), &status, 0)) < 0 && errno == EINTR) {
  }
  if (reaped != program) return 127;
  const ExitStatus how = exitStatusFromWait(status);
  const std::string line = how.record();
  [[maybe_unused]] ssize_t n = ::write(static_cast<int>(record), line.data(), line.size());
  ::close(static_cast<int>(record));
  // End the way the program did, so that the agent learns the same, except by a signal that dumps
  // core: a crash handler (systemd-coredump, apport) would report a second crash, of the agent's
  // binary. Then the exit code says 128 + signal, and the record the signal.
  if (how.signal != 0 && !dumpsCore(how.signal)) {
    ::signal(how.signal, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, how.signal);
    ::kill(::getpid(), how.signal);
    ::sigprocmask(SIG_UNBLOCK, &one, nullptr);
  }
  return how.shellCode();
}

Result<std::optional<std::pair<pid_t, ExitStatus>>> waitAnyProcess(
    const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<pollfd> fds;
  for (pid_t pid : pids) fds.push_back({pidfdOpen(pid), POLLIN, 0});
  const bool pidfdsWork =
      std::all_of(fds.begin(), fds.end(), [](const pollfd& p) { return p.fd >= 0; });
  auto closeAll = [&] {
    for (auto& p : fds)
      if (p.fd >= 0) ::close(p.fd);
  };
  while (true) {
    for (pid_t pid : pids) {
      int status = 0;
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r == pid) {
        closeAll();
        return std::optional{std::pair{pid, exitStatusFromWait(status)}};
      }
      if (r < 0 && errno != EINTR) {
        const int err = errno;
        closeAll();
        return errnoError("waitpid " + std::to_string(pid), err);
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      closeAll();
      return std::optional<std::pair<pid_t, ExitStatus>>{};
    }
    if (pidfdsWork) {
      ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(left.count(), 1000)));
    } else {
      // Kernels without pidfd_open (before 5.3): poll by sleeping briefly.
      std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(10)));
    }
  }
}

Result<std::optional<ExitStatus>> waitProcess(pid_t pid, std::chrono::milliseconds timeout) {
  auto r = waitAnyProcess({pid}, timeout);
  if (!r) return r.error();
  if (!r->has_value()) return std::optional<ExitStatus>{};
  return std::optional<ExitStatus>{(*r)->second};
}

Result<ExitStatus> terminateProcess(pid_t pid, std::chrono::milliseconds grace, bool wholeGroup) {
  const pid_t target = wholeGroup ? -pid : pid;
  ::kill(target, SIGTERM);
  if (auto r = waitProcess(pid, grace); r && r->has_value()) return **r;
  ::kill(target, SIGKILL);
  auto r = waitProcess(pid, std::chrono::seconds(10));
  if (!r) return r.error();
  if (!r->has_value()) {
    return timeoutError("process " + std::to_string(pid) +
                        " did not exit 10 s after SIGKILL (stuck in the kernel?)");
  }
  return **r;
}

}  // namespace lockstep
