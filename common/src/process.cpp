#include "lockstep/common/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

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

ExitStatus exitStatusFromWait(int waitStatus) {
  ExitStatus status;
  if (WIFSIGNALED(waitStatus)) {
    status.signal = WTERMSIG(waitStatus);
  } else if (WIFEXITED(waitStatus)) {
    status.exitCode = WEXITSTATUS(waitStatus);
  }
  return status;
}

Result<pid_t> spawnProcess(const SpawnOptions& options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return invalidArgument("spawnProcess: no executable given");
  }
  ExecImage image = buildImage(options);
  std::optional<sandbox::Plan> sandboxPlan;
  if (options.sandbox) {
    LOCKSTEP_ASSIGN_OR_RETURN(sandboxPlan, sandbox::plan(*options.sandbox));
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
    if (options.newProcessGroup && ::setpgid(0, 0) != 0) childFail(errPipe[1], 1);
    if (options.parentDeathSignal != 0) {
      if (::prctl(PR_SET_PDEATHSIG, options.parentDeathSignal) != 0) childFail(errPipe[1], 2);
      // The parent may have died between fork and prctl.
      if (::getppid() != parent) ::_exit(127);
    }
    if (!redirect(options.stdoutPath, STDOUT_FILENO)) childFail(errPipe[1], 3);
    if (!redirect(options.stderrPath, STDERR_FILENO)) childFail(errPipe[1], 4);
    // Before chdir: a working directory entered before the tmpfs covers it would still lead
    // (through "..") to what it hides.
    if (sandboxPlan && !sandbox::enter(*sandboxPlan)) childFail(errPipe[1], 8);
    if (!options.workingDir.empty() && ::chdir(options.workingDir.c_str()) != 0) childFail(errPipe[1], 6);
    if (options.stdinFromDevNull) {
      const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null < 0 || ::dup2(null, STDIN_FILENO) < 0) childFail(errPipe[1], 7);
      ::close(null);
    }
    // Signals the parent ignored or blocked must not leak into the child.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::execve(options.executable.empty() ? image.argv[0] : options.executable.c_str(), image.argv.data(), image.envp.data());
    childFail(errPipe[1], 5);
  }

  ::close(errPipe[1]);
  // The pipe closes at exec (O_CLOEXEC) or carries why the child failed; a child stuck before
  // exec (a hung mount) must not hold the caller, the agent's event loop among them.
  pollfd ready{errPipe[0], POLLIN, 0};
  int polled;
  do {
    polled = ::poll(&ready, 1, static_cast<int>(options.startTimeout.count()));
  } while (polled < 0 && errno == EINTR);
  if (polled == 0) {
    ::close(errPipe[0]);
    ::kill(pid, SIGKILL);
    // A child stuck in the kernel (D state) dies only when its system call returns: reap it if it
    // goes within a second, else leave it (it becomes a zombie of ours, not a hang).
    for (int i = 0; i < 100 && ::waitpid(pid, nullptr, WNOHANG) == 0; ++i) ::usleep(10000);
    return timeoutError(options.argv[0] + " did not start within " + std::to_string(options.startTimeout.count()) +
                        " ms (its working directory or program on a hung file system?)");
  }
  int report[2] = {0, 0};
  ssize_t n;
  do {
    n = ::read(errPipe[0], report, sizeof report);
  } while (n < 0 && errno == EINTR);
  ::close(errPipe[0]);
  if (n == static_cast<ssize_t>(sizeof report)) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    static constexpr const char* kStages[] = {"", "setpgid", "prctl", "open stdout file", "open stderr file",
                                              "execute", "enter the working directory", "open /dev/null as stdin",
                                              "hide"};
    const char* stage = report[0] >= 1 && report[0] <= 8 ? kStages[report[0]] : "start";
    const std::string where = report[0] == 6   ? " " + options.workingDir
                              : report[0] == 8 ? " " + options.sandbox->hide + " (a private mount namespace" +
                                                     (::geteuid() != 0 ? " in a user namespace" : "") +
                                                     "; docs/security.md says what the kernel must allow)"
                                               : "";
    const std::string& program = options.executable.empty() ? options.argv[0] : options.executable;
    return errnoError(std::string("cannot ") + stage + where + " for " + program, report[1]);
  }
  return pid;
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
