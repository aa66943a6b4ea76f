#pragma once
// Facts about this machine and its processes, from the kernel.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace lockstep::agent {

std::string hostName();
std::uint32_t cpuCores();
std::uint64_t memoryTotalBytes();

// One process's line in /proc/PID/stat and its resident memory.
struct ProcStat {
  char state = '?';              // R, S, D, Z, ...
  pid_t parent = 0;
  pid_t processGroup = 0;
  std::uint64_t cpuTicks = 0;    // user + system, in clock ticks
  std::uint64_t startTicks = 0;  // when it started, in clock ticks after boot: with the pid, its identity
  std::uint64_t rssBytes = 0;
};
std::optional<ProcStat> readProcStat(pid_t pid);
long clockTicksPerSecond();
// The pid the process has in its own PID namespace (the last of NSpid in /proc/PID/status): what
// it calls itself, getpid(), which for a job's rank is not the agent's number for it.
std::optional<pid_t> ownPid(pid_t pid);

// A /proc or /sys file, read to its end (they say they are 0 or 4096 bytes long, whatever they
// hold), at most maxBytes; nothing when it cannot be opened.
std::optional<std::string> readKernelFile(const std::string& path, std::size_t maxBytes = 1u << 20);

}  // namespace lockstep::agent
