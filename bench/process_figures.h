#pragma once
// What a benchmark reads of its own process (Linux /proc): its resident memory, and the CPU time
// of its threads by name.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

namespace lockstep::bench {

// Its resident memory, in MB.
inline double rssMegabytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "VmRSS:", 6) == 0) kb = std::atof(line + 6);
  }
  std::fclose(f);
  return kb / 1024;
}

// The CPU time of this process's threads named `name` (/proc/self/task/*/stat), in seconds.
inline double threadsCpuSeconds(const char* name) {
  double ticks = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm"), stat(task.path() / "stat");
    std::string threadName, line;
    std::getline(comm, threadName);
    std::getline(stat, line);
    if (threadName != name || line.rfind(')') == std::string::npos) continue;
    std::istringstream fields(line.substr(line.rfind(')') + 2));
    std::string field;
    for (int i = 0; i < 11 && fields >> field;) ++i;  // state ... cmajflt
    double utime = 0, stime = 0;
    fields >> utime >> stime;
    ticks += utime + stime;
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace lockstep::bench
