#include "jobs/proc_scan.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <vector>

#include "base/host.h"
#include "lockstep/common/fd.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

// A process's environment variables. /proc files report a size of 0, so this reads to the end;
// none when it cannot be read.
std::vector<std::string> environmentOf(pid_t pid) {
  UniqueFd fd(::open(("/proc/" + std::to_string(pid) + "/environ").c_str(), O_RDONLY | O_CLOEXEC));
  std::string text;
  char buf[16384];
  ssize_t n;
  while (fd.valid() && (n = ::read(fd.get(), buf, sizeof buf)) > 0 && text.size() < (1u << 20)) {
    text.append(buf, static_cast<size_t>(n));
  }
  std::vector<std::string> variables;
  std::istringstream in(text);
  for (std::string variable; std::getline(in, variable, '\0');) variables.push_back(std::move(variable));
  return variables;
}

// The processes that `picked` chooses by their /proc/PID/stat (checked first: it is cheap) and whose
// environment holds every one of `variables`.
std::vector<pid_t> processesWith(const std::function<bool(pid_t pid, const ProcStat&)>& picked,
                                 const std::set<std::string>& variables) {
  std::vector<pid_t> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    const auto stat = readProcStat(pid);
    if (!stat || !picked(pid, *stat)) continue;
    std::size_t matched = 0;
    for (const auto& variable : environmentOf(pid)) matched += variables.count(variable);
    if (matched == variables.size()) found.push_back(pid);
  }
  return found;
}

}  // namespace

FoundRank findRankProcess(const JobSpec& spec, std::uint32_t rank) {
  const std::set<std::string> wanted = {"LOCKSTEP_JOB_ID=" + spec.jobId, "LOCKSTEP_ATTEMPT=" + std::to_string(spec.attempt),
                                        "RANK=" + std::to_string(rank)};
  // The program's own children (DataLoader workers) carry the same variables; their parent is it.
  const auto kept = [](pid_t, const ProcStat& s) { return s.parent == s.processGroup; };
  const auto programs = processesWith(kept, wanted);
  if (programs.empty()) return {};
  const auto stat = readProcStat(programs.front());
  return stat ? FoundRank{stat->processGroup, programs.front()} : FoundRank{};
}

void killLeftovers(pid_t processGroup, const std::string& jobId) {
  const auto members = [processGroup](pid_t, const ProcStat& s) { return s.processGroup == processGroup; };
  for (pid_t pid : processesWith(members, {"LOCKSTEP_JOB_ID=" + jobId})) ::kill(pid, SIGKILL);
}

}  // namespace lockstep::agent
