#include "stalls/stall_watch.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "base/host.h"
#include "lockstep/common/clock.h"
#include "lockstep/kpi/stall.h"

namespace lockstep::agent {
namespace {

constexpr std::size_t kStepWindow = 256;  // the recent steps a rank's p99 is taken over
constexpr std::size_t kMaxPhases = 64;     // announced phases remembered per rank (a rank names them)

// When the rank last moved: the newest time its record holds, when that is what changed (a step, a
// phase, a collective begun: exact, whenever it is read), else the time the change was seen.
std::int64_t movedAt(const progress::Snapshot& s, std::int64_t before, std::int64_t nowUs) {
  const std::int64_t newest = std::max({s.stepBeganUs, s.phaseBeganUs, s.inCollective ? s.collectiveBeganUs : 0});
  return newest > before && newest <= nowUs ? newest : nowUs;
}

std::optional<std::int64_t> p99(const std::deque<std::int64_t>& values) {
  if (values.empty()) return std::nullopt;
  std::vector<std::int64_t> sorted(values.begin(), values.end());
  const auto k = static_cast<std::ptrdiff_t>((sorted.size() - 1) * 99 / 100);
  std::nth_element(sorted.begin(), sorted.begin() + k, sorted.end());
  return sorted[static_cast<std::size_t>(k)];
}

// Whether the rank did anything since the last read: a step, a phase, a collective.
bool moved(const progress::Snapshot& before, const progress::Snapshot& now) {
  return before.step != now.step || before.phaseBeganUs != now.phaseBeganUs || before.collectives != now.collectives ||
         before.inCollective != now.inCollective || before.phase != now.phase;
}

// A job's ranks are judged when they report steps (the trainer always does; a program of the
// user's own from its first lockstep.step on).
bool judged(const RankProgress& p, const WatchedJob& job) { return p.recorded && (p.reportsSteps || !job.command); }

}  // namespace

std::string processStateText(char state) {
  switch (state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "waiting on disk or a file system";
    case 'T': return "stopped by a signal";
    case 't': return "traced (by a debugger, or while Lockstep takes its backtrace)";
    case 'Z': return "exited, not yet reaped";
    case 'I': return "idle";
    default: return std::string("in state ") + state;
  }
}

pid_t workingProcess(const WatchedRank& rank, pid_t recordPid) {
  if (recordPid <= 0) return rank.pid;
  // The record says getpid(), the rank's PID namespace's number: the process it names is the one
  // of the rank's process group that calls itself so.
  const auto names = [&](pid_t pid) {
    const auto stat = readProcStat(pid);
    return stat && stat->processGroup == rank.group && ownPid(pid) == recordPid;
  };
  if (names(rank.pid)) return rank.pid;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    if (names(pid)) return pid;
  }
  return rank.pid;
}

std::string processStateOf(pid_t pid) {
  const auto stat = readProcStat(pid);
  return stat ? processStateText(stat->state) : "";
}

void StallWatch::noteStep(const std::string& jobId, std::uint32_t rank, std::int64_t stepTimeUs) {
  auto& steps = jobs_[jobId].ranks[rank].stepMs;
  steps.push_back(stepTimeUs / 1000);
  if (steps.size() > kStepWindow) steps.pop_front();
}

void StallWatch::observe(RankWatch& w, const WatchedRank& rank, const WatchedJob& job, std::int64_t nowUs) {
  auto read = progress::read(rank.progressPath);
  if (!read) {
    w.shown = RankProgress{};
    w.shown.rank = rank.rank;
    w.shown.processState = processStateOf(rank.pid);
    w.judged = false;
    return;
  }
  if (!w.last || moved(*w.last, *read)) {
    // An announced phase that ended: how long it took, for its next run's allowance.
    if (w.last && w.last->announced && w.last->phaseBeganUs != read->phaseBeganUs && !w.last->phase.empty() &&
        (w.phaseMaxMs.size() < kMaxPhases || w.phaseMaxMs.count(w.last->phase))) {
      auto& longest = w.phaseMaxMs[w.last->phase];
      longest = std::max(longest, std::max<std::int64_t>(0, read->phaseBeganUs - w.last->phaseBeganUs) / 1000);
    }
    w.movedAtUs = movedAt(*read, w.movedAtUs, nowUs);
  }
  w.last = *read;
  w.shown = agent::progressOf(rank.rank, *read, (nowUs - w.movedAtUs) / 1000);
  kpi::StallBasis basis{job.stallAfterS, read->step > 0 ? p99(w.stepMs) : std::nullopt, read->announced, std::nullopt};
  if (read->step > 0 && !basis.stepP99Ms) basis.stepP99Ms = 0;  // steps, but none reported here yet
  if (auto it = w.phaseMaxMs.find(read->phase); read->announced && it != w.phaseMaxMs.end()) basis.phaseMaxMs = it->second;
  w.shown.allowanceMs = kpi::stallAllowanceMs(basis);
  w.shown.processState = processStateOf(workingProcess(rank, read->pid));
  w.judged = judged(w.shown, job);
}

std::optional<StallWatch::Change> StallWatch::judge(JobWatch& watch, const WatchedJob& job) {
  std::vector<RankProgress> ranks;
  bool over = false;
  // The job stands still since its judged ranks' last move: the latest of them, as their records
  // stamped it (not now less a duration truncated to milliseconds and read on another clock reading).
  std::int64_t lastMovedUs = 0;
  for (const auto& [rank, w] : watch.ranks) {
    ranks.push_back(w.shown);
    if (!w.judged) continue;
    over = over || w.shown.stillMs > w.shown.allowanceMs;
    lastMovedUs = std::max(lastMovedUs, w.movedAtUs);
  }
  if (over && !watch.stall) {
    const auto diagnosis = kpi::diagnoseStall(ranks);
    Stall stall{lastMovedUs, diagnosis.message, diagnosis.behind};
    watch.stall = stall;
    return Change{job.jobId, true, std::move(stall), job.onStall, false};
  }
  if (!over && watch.stall) {
    // A rank moved again: the job goes on.
    Change ended{job.jobId, false, *watch.stall, job.onStall, false};
    watch.stall.reset();
    return ended;
  }
  if (watch.stall) watch.stall->message = kpi::diagnoseStall(ranks).message;  // durations grow
  return std::nullopt;
}

std::vector<StallWatch::Change> StallWatch::tick(const std::vector<WatchedJob>& jobs) {
  const std::int64_t nowUs = unixMicrosNow();
  std::vector<Change> changes;
  std::map<std::string, JobWatch> kept;
  for (const auto& job : jobs) {
    JobWatch watch = std::move(jobs_[job.jobId]);
    for (const auto& rank : job.ranks) observe(watch.ranks[rank.rank], rank, job, nowUs);
    std::erase_if(watch.ranks, [&](const auto& entry) {
      return std::none_of(job.ranks.begin(), job.ranks.end(), [&](const WatchedRank& r) { return r.rank == entry.first; });
    });
    if (auto change = judge(watch, job)) changes.push_back(std::move(*change));
    kept[job.jobId] = std::move(watch);
  }
  for (auto& [jobId, watch] : jobs_) {
    // A job that ended while stalled: its stall ends with it.
    if (watch.stall && !kept.count(jobId)) changes.push_back(Change{jobId, false, *watch.stall, OnStall::kReport, true});
  }
  jobs_ = std::move(kept);
  return changes;
}

std::int64_t StallWatch::dueUs() const {
  std::int64_t due = std::numeric_limits<std::int64_t>::max();
  for (const auto& [jobId, watch] : jobs_) {
    if (watch.stall) continue;
    for (const auto& [rank, w] : watch.ranks) {
      // Over it when stillMs > allowanceMs: a millisecond past.
      if (w.judged) due = std::min(due, w.movedAtUs + (w.shown.allowanceMs + 1) * 1000);
    }
  }
  return due;
}

std::vector<RankProgress> StallWatch::progressOf(const std::string& jobId) const {
  std::vector<RankProgress> out;
  auto it = jobs_.find(jobId);
  if (it == jobs_.end()) return out;
  for (const auto& [rank, w] : it->second.ranks) out.push_back(w.shown);
  return out;
}

std::optional<Stall> StallWatch::stallOf(const std::string& jobId) const {
  auto it = jobs_.find(jobId);
  return it == jobs_.end() ? std::nullopt : it->second.stall;
}

}  // namespace lockstep::agent
