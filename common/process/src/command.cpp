// runCommand (lockstep/common/process.h): a tool's output, bounded in time and size.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "lockstep/common/fd.h"
#include "lockstep/common/process.h"

namespace lockstep {

std::string findOnPath(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : std::string();
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string d; std::getline(dirs, d, ':');) {
    const std::string candidate = (d.empty() ? std::string(".") : d) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

namespace {

// A tool past its time: its whole group killed, and reaped unless it hangs in the kernel (a dead
// file system) even so; then it is left, rather than the caller with it.
void killAndReap(pid_t pid) {
  ::kill(-pid, SIGKILL);
  (void)waitProcess(pid, std::chrono::seconds(5));
}

}  // namespace

Result<CommandOutput> runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                                 std::size_t maxBytes) {
  if (argv.empty()) return invalidArgument("runCommand: no program");
  // Found before fork: between fork and exec a threaded caller's child may only make system calls.
  const std::string program = findOnPath(argv[0]);
  if (program.empty()) return Error{ErrorCode::kNotFound, argv[0] + " is not on PATH"};
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return ioError(std::string("pipe: ") + std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    return ioError(std::string("pipe: ") + std::strerror(errno));
  }
  UniqueFd outRead(out[0]), errRead(err[0]);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out[1]);
    ::close(err[1]);
    return ioError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    // A SIGTERM meant for the caller's whole process tree (Slurm ending a job step) must not cut
    // short the query the caller makes about it; the timeout's SIGKILL still ends it.
    ::signal(SIGTERM, SIG_IGN);
    const int null = ::open("/dev/null", O_RDONLY);
    ::dup2(null, 0);
    if (null > 2) ::close(null);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execv(program.c_str(), args.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  CommandOutput result;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool outOpen = true, errOpen = true;
  while (outOpen || errOpen) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd fds[2] = {{outOpen ? outRead.get() : -1, POLLIN, 0}, {errOpen ? errRead.get() : -1, POLLIN, 0}};
    if (::poll(fds, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof buffer);
      std::string& into = i == 0 ? result.out : result.err;
      if (n > 0) {
        into.append(buffer, std::min(static_cast<std::size_t>(n), maxBytes - std::min(maxBytes, into.size())));
      } else if (n == 0 || errno != EINTR) {
        (i == 0 ? outOpen : errOpen) = false;
      }
    }
  }
  if (outOpen || errOpen) {
    killAndReap(pid);
    return timeoutError(argv[0] + " did not finish within " + std::to_string(timeout.count() / 1000) + " s");
  }
  // Both pipes closed: the tool is exiting (a child it left holding them would have kept them open).
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  LOCKSTEP_ASSIGN_OR_RETURN(const auto status, waitProcess(pid, std::max(left, std::chrono::milliseconds(0)) +
                                                                   std::chrono::milliseconds(100)));
  if (!status) {
    killAndReap(pid);
    return timeoutError(argv[0] + " did not finish within " + std::to_string(timeout.count() / 1000) + " s");
  }
  result.status = *status;
  return result;
}

}  // namespace lockstep
