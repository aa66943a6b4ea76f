// runJobInit (process.h): pid 1 of a job's PID namespace on a node.

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "lockstep/common/process.h"

namespace lockstep {
namespace {

// Processes in this namespace other than this one (its /proc is the namespace's own).
int othersRunning() {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = ::readdir(proc)) {
    const char* name = entry->d_name;
    if (name[0] >= '1' && name[0] <= '9' && std::strcmp(name, "1") != 0) ++count;
  }
  ::closedir(proc);
  return count;
}

}  // namespace

int runJobInit(int argc, char** argv) {
  if (argc != 2 || std::strcmp(argv[1], kJobInitArg) != 0 || ::getpid() != 1) {
    std::fprintf(stderr, "%s: only the agent starts a job's init, as pid 1 of the job's PID namespace\n", kJobInitArg);
    return 2;
  }
  // Signals from the job's own processes do not reach pid 1 unless it handles them; from the
  // agent's namespace only SIGKILL does, which ends the namespace.
  using namespace std::chrono;
  const auto started = steady_clock::now();
  bool seen = false;
  int quietTicks = 0;
  while (true) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    const int others = othersRunning();
    if (others < 0) return 1;
    if (others > 0) {
      seen = true;
      quietTicks = 0;
    } else if (seen && ++quietTicks >= 40) {  // 10 s: the agent may still be starting the next rank
      return 0;
    } else if (!seen && steady_clock::now() - started > minutes(2)) {
      return 0;
    }
    std::this_thread::sleep_for(milliseconds(250));
  }
}

}  // namespace lockstep
