#include "stalls/evidence.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <mutex>
#include <thread>

#include "base/host.h"
#include "jobs/job_files.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/fd.h"
#include "lockstep/common/files.h"
#include "lockstep/common/process.h"
#include "stalls/stall_watch.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kStacksWait = std::chrono::seconds(2);
constexpr auto kStacksQuiet = std::chrono::milliseconds(200);  // no more bytes for this long: complete
constexpr auto kCpuWindow = std::chrono::milliseconds(500);
constexpr auto kGdbTimeout = std::chrono::seconds(10);
constexpr std::size_t kMaxGdbRanks = 4;
constexpr std::size_t kMaxThreads = 256;
constexpr std::size_t kMaxStacksBytes = 64 * 1024;
constexpr std::size_t kLogLines = 30;

std::uint64_t sizeOf(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? static_cast<std::uint64_t>(st.st_size) : 0;
}

// One line per thread: id, name, state, wait channel.
std::string threadsOf(pid_t pid) {
  std::vector<std::pair<long, std::string>> lines;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    if (lines.size() >= kMaxThreads) break;
    const std::string name = entry.path().filename().string();
    char* end = nullptr;
    const long tid = std::strtol(name.c_str(), &end, 10);
    if (*end != '\0' || tid <= 0) continue;
    const auto stat = readProcStat(static_cast<pid_t>(tid));
    const std::string comm = trim(readKernelFile(entry.path().string() + "/comm", 64).value_or("?"));
    std::string wchan = trim(readKernelFile(entry.path().string() + "/wchan", 128).value_or(""));
    if (wchan.empty() || wchan == "0") wchan = "-";
    lines.emplace_back(tid, std::to_string(tid) + "  " + comm + "  " +
                                (stat ? processStateText(stat->state) : std::string("gone")) + "  " + wchan);
  }
  std::sort(lines.begin(), lines.end());
  std::string out;
  for (const auto& [tid, line] : lines) out += line + "\n";
  return out;
}

// gdb's backtrace of every thread, without its chatter. gdb stops the process to attach; if it
// is killed at its deadline before it detached, the process stays stopped, so it is continued.
std::string gdbBacktrace(pid_t pid, std::string* note) {
  // The agent may be root and the process another user's: gdb loads nothing the process's files
  // could name (no init files, no auto-loaded scripts or libthread_db from the rank's directories).
  auto ran = runCommand({"gdb", "-p", std::to_string(pid), "-batch", "-nx", "-iex", "set auto-load off", "-ex",
                         "set pagination off", "-ex", "thread apply all bt 30"},
                        kGdbTimeout, 256 * 1024);
  if (!ran) {
    *note += (note->empty() ? "" : "; ") + std::string("no native backtrace: ") + ran.error().message;
    return "";
  }
  std::string out, line;
  for (char c : ran->out) {
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line.rfind("Thread ", 0) == 0 || line.rfind("#", 0) == 0) out += line + "\n";
    line.clear();
  }
  if (out.empty()) *note += (note->empty() ? "" : "; ") + std::string("gdb could not attach: ") + trim(ran->err).substr(0, 300);
  return out;
}

std::string backtraceOf(pid_t pid, std::string* note) {
  std::string out = gdbBacktrace(pid, note);
  if (const auto stat = readProcStat(pid); stat && (stat->state == 't' || stat->state == 'T')) ::kill(pid, SIGCONT);
  return out;
}

struct Taking {
  pid_t pid = 0;
  RankEvidence evidence;
  std::uint64_t cpuBefore = 0;
  std::uint64_t stacksFrom = 0;
  bool signalled = false;
  char state = '?';
};

void firstLook(Taking& t, const EvidenceTarget& target) {
  t.pid = workingProcess(target.rank, target.recordPid);
  t.evidence.pid = static_cast<std::uint32_t>(t.pid);
  const auto stat = readProcStat(t.pid);
  if (!stat) return;
  t.state = stat->state;
  t.cpuBefore = stat->cpuTicks;
  t.evidence.processState = std::string(1, stat->state) + " (" + processStateText(stat->state) + ")";
  t.evidence.threads = threadsOf(t.pid);
  if (target.stackSignal == 0) return;
  if (stat->state == 'T' || stat->state == 't') {
    t.evidence.note = "stopped by a signal: it writes its Python stacks once it continues (SIGCONT)";
    return;
  }
  if (!catchesSignal(t.pid, target.stackSignal)) {
    t.evidence.note = "process " + std::to_string(t.pid) + " does not handle signal " +
                      std::to_string(target.stackSignal) + ": no Python stacks asked of it";
    return;
  }
  t.stacksFrom = sizeOf(target.rank.stacksPath);
  t.signalled = ::kill(t.pid, target.stackSignal) == 0;
}

// Waits until every signalled rank's stacks came in (no new bytes for a moment) or the wait ran out.
void awaitStacks(std::vector<Taking>& takings, const std::vector<EvidenceTarget>& targets, Clock::time_point began) {
  std::vector<std::uint64_t> seen(takings.size(), 0);
  auto lastGrowth = Clock::now();
  while (Clock::now() - began < kStacksWait) {
    bool pending = false, grew = false;
    for (std::size_t i = 0; i < takings.size(); ++i) {
      if (!takings[i].signalled) continue;
      const auto size = sizeOf(targets[i].rank.stacksPath);
      grew = grew || size != seen[i];
      seen[i] = size;
      pending = pending || size <= takings[i].stacksFrom;
    }
    if (grew) lastGrowth = Clock::now();
    if (!pending && Clock::now() - lastGrowth >= kStacksQuiet && Clock::now() - began >= kCpuWindow) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void readStacks(Taking& t, const EvidenceTarget& target) {
  if (!t.signalled) return;
  UniqueFd fd = openJobFile(target.rank.stacksPath, O_RDONLY);
  const auto size = sizeOf(target.rank.stacksPath);
  if (fd.valid() && size > t.stacksFrom) {
    std::string text = fileTail(fd.get(), std::min<std::uint64_t>(size - t.stacksFrom, kMaxStacksBytes), nullptr,
                                target.rank.stacksPath);
    t.evidence.pythonStacks = text;
  } else {
    t.evidence.note = "asked for its Python stacks (signal " + std::to_string(target.stackSignal) +
                      "); none came within 2 s";
  }
}

}  // namespace

bool catchesSignal(pid_t pid, int signal) {
  if (signal < 1 || signal > 64) return false;
  const auto status = readKernelFile("/proc/" + std::to_string(pid) + "/status", 1 << 16);
  if (!status) return false;
  const auto at = status->find("\nSigCgt:");
  if (at == std::string::npos) return false;
  const std::uint64_t caught = std::strtoull(status->c_str() + at + 8, nullptr, 16);
  return (caught >> (signal - 1)) & 1u;
}

StacksReply takeEvidence(const std::string& jobId, const std::string& node, const std::vector<EvidenceTarget>& targets) {
  static std::mutex oneAtATime;
  std::lock_guard lock(oneAtATime);
  const auto began = Clock::now();
  std::vector<Taking> takings(targets.size());
  for (std::size_t i = 0; i < targets.size(); ++i) {
    Taking& t = takings[i];
    t.evidence.rank = targets[i].rank.rank;
    t.evidence.node = node;
    t.evidence.progress = targets[i].progress;
    firstLook(t, targets[i]);
  }
  awaitStacks(takings, targets, began);
  const auto left = kCpuWindow - (Clock::now() - began);
  if (left > Clock::duration::zero()) std::this_thread::sleep_for(left);
  std::size_t gdbRuns = 0;
  StacksReply reply{jobId, {}};
  for (std::size_t i = 0; i < targets.size(); ++i) {
    Taking& t = takings[i];
    readStacks(t, targets[i]);
    if (const auto stat = readProcStat(t.pid); stat && t.state != '?') t.evidence.cpuMoving = stat->cpuTicks > t.cpuBefore;
    if (t.state == 'T' || t.state == 't') {
      // gdb would resume it when it detaches: the stall's cause would vanish under the user's eyes.
      t.evidence.note += (t.evidence.note.empty() ? "" : "; ") +
                         std::string("no native backtrace: attaching gdb would resume a stopped process");
    } else if (t.state == 'D') {
      t.evidence.note += (t.evidence.note.empty() ? "" : "; ") +
                         std::string("no native backtrace: gdb cannot attach to a process waiting on disk");
    } else if (t.evidence.pythonStacks.empty() && t.state != '?' && t.state != 'Z') {
      if (gdbRuns++ < kMaxGdbRanks) {
        t.evidence.nativeBacktrace = backtraceOf(t.pid, &t.evidence.note);
      } else {
        t.evidence.note += (t.evidence.note.empty() ? "" : "; ") + std::string("no native backtrace: gdb ran for 4 ranks already");
      }
    }
    bool more = false;
    t.evidence.logTail = lastLines(fileTail(targets[i].rank.logPath, 8192, &more), kLogLines);
    t.evidence.timeUnixUs = unixMicrosNow();
    if (t.state == '?') t.evidence.note = "the process is gone";
    reply.ranks.push_back(std::move(t.evidence));
  }
  return reply;
}

Result<void> EvidenceTaker::submit(std::uint64_t id, std::string jobId, std::string node, std::vector<EvidenceTarget> ranks) {
  const Error busy{ErrorCode::kResourceExhausted, "node " + node + " is already taking the stacks of " +
                                                      std::to_string(kMaxInFlight) + " requests; try again in a minute"};
  return takings_.submit(
      id, [jobId = std::move(jobId), node, ranks = std::move(ranks)] { return takeEvidence(jobId, node, ranks); }, busy,
      "take stacks");
}

}  // namespace lockstep::agent
