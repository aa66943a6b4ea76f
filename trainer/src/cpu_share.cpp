#include "cpu_share.h"

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <algorithm>
#include <thread>

namespace lockstep::trainer {

std::string CpuShare::describe() const {
  if (cpus.empty()) return "all CPUs";
  const std::string first = std::to_string(cpus.front()), last = std::to_string(cpus.back());
  const bool run = cpus.back() - cpus.front() + 1 == static_cast<int>(cpus.size());
  if (cpus.size() == 1) return "CPU " + first;
  if (run) return "CPUs " + first + "-" + last;
  std::string text = "CPUs ";
  for (std::size_t i = 0; i < cpus.size(); ++i) text += (i ? "," : "") + std::to_string(cpus[i]);
  return text;
}

CpuShare cpuShareOf(const std::vector<int>& allowed, std::uint32_t localRank, std::uint32_t localRanks) {
  CpuShare share;
  if (localRanks == 0 || allowed.size() < localRanks || localRank >= localRanks) {
    share.threads = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(allowed.size()) / std::max(1u, localRanks));
    return share;
  }
  const std::size_t base = allowed.size() / localRanks, longer = allowed.size() % localRanks;
  const std::size_t begin = localRank * base + std::min<std::size_t>(localRank, longer);
  const std::size_t size = base + (localRank < longer ? 1 : 0);
  share.cpus.assign(allowed.begin() + static_cast<std::ptrdiff_t>(begin),
                    allowed.begin() + static_cast<std::ptrdiff_t>(begin + size));
  share.threads = static_cast<std::uint32_t>(size);
  return share;
}

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
    }
  }
  if (cpus.empty()) {
    for (unsigned cpu = 0; cpu < std::max(1u, std::thread::hardware_concurrency()); ++cpu) cpus.push_back(static_cast<int>(cpu));
  }
  return cpus;
}

bool boundAlready(const std::vector<int>& allowed) {
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 && static_cast<long>(allowed.size()) < online;
}

bool pinTo(const CpuShare& share) {
  if (share.cpus.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : share.cpus) CPU_SET(cpu, &set);
  // Every thread the process has (OpenBLAS starts its workers before main), then the threads to come.
  std::error_code error;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", error)) {
    const pid_t tid = static_cast<pid_t>(std::strtol(task.path().filename().c_str(), nullptr, 10));
    if (tid > 0) (void)::sched_setaffinity(tid, sizeof set, &set);
  }
  return ::sched_setaffinity(0, sizeof set, &set) == 0;
}

}  // namespace lockstep::trainer
