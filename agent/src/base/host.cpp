#include "base/host.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace lockstep::agent {

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

std::uint32_t cpuCores() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<std::uint32_t>(n) : 1;
}

std::uint64_t memoryTotalBytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(size) : 0;
}

long clockTicksPerSecond() {
  static const long ticks = ::sysconf(_SC_CLK_TCK);
  return ticks > 0 ? ticks : 100;
}

std::optional<std::string> readKernelFile(const std::string& path, std::size_t maxBytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string out;
  char buffer[4096];
  while (out.size() < maxBytes && in.read(buffer, sizeof buffer).gcount() > 0) {
    out.append(buffer, static_cast<std::size_t>(std::min<std::streamsize>(in.gcount(), static_cast<std::streamsize>(maxBytes - out.size()))));
  }
  if (in.bad()) return std::nullopt;
  return out;
}

std::optional<pid_t> ownPid(pid_t pid) {
  const auto status = readKernelFile("/proc/" + std::to_string(pid) + "/status", 16384);
  if (!status) return std::nullopt;
  const auto at = status->find("\nNSpid:");
  if (at == std::string::npos) return pid;  // a kernel without PID namespaces' lines
  const auto end = status->find('\n', at + 1);
  const std::string line = status->substr(at + 7, end == std::string::npos ? std::string::npos : end - at - 7);
  const auto last = line.find_last_of(" \t");
  try {
    return static_cast<pid_t>(std::stol(last == std::string::npos ? line : line.substr(last + 1)));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::optional<ProcStat> readProcStat(pid_t pid) {
  std::ifstream statFile("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(statFile, text)) return std::nullopt;
  // pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so parse after the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  ProcStat s;
  long long ppid = 0, pgrp = 0, skip = 0;
  unsigned long long utime = 0, stime = 0, start = 0;
  fields >> s.state >> ppid >> pgrp;
  for (int i = 0; i < 8; ++i) fields >> skip;  // session tty tpgid flags minflt cminflt majflt cmajflt
  fields >> utime >> stime;
  for (int i = 0; i < 6; ++i) fields >> skip;  // cutime cstime priority nice num_threads itrealvalue
  fields >> start;
  if (!fields) return std::nullopt;
  s.parent = static_cast<pid_t>(ppid);
  s.processGroup = static_cast<pid_t>(pgrp);
  s.cpuTicks = utime + stime;
  s.startTicks = start;
  std::ifstream statm("/proc/" + std::to_string(pid) + "/statm");
  unsigned long long sizePages = 0, residentPages = 0;
  if (statm >> sizePages >> residentPages) {
    s.rssBytes = residentPages * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  }
  return s;
}

}  // namespace lockstep::agent
