#include "jobs/rank_processes.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>

#include "base/host.h"
#include "jobs/job.h"
#include "jobs/job_cgroup.h"
#include "jobs/job_files.h"
#include "jobs/rank_launch.h"
#include "jobs/proc_scan.h"
#include "lockstep/common/progress.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

}  // namespace

RankProcesses::RankProcesses(JobPaths paths, std::string keeperPath, std::uint64_t logCapBytes)
    : paths_(std::move(paths)),
      keeperPath_(std::move(keeperPath)),
      logCapBytes_(logCapBytes),
      agentFd_(::open(keeperPath_.c_str(), O_PATH | O_CLOEXEC)) {}

// An agent that exits (its jobs run on without it) removes the cgroups of the jobs that ended.
RankProcesses::~RankProcesses() {
  for (int i = 0; i < 100 && !deadCgroups_.empty(); ++i) {
    if (i > 0) ::usleep(10000);
    tidy();
  }
}

Result<void> RankProcesses::spawn(Job& job, NodeLaunch& launch) {
  launch.agentFd = agentFd_.get();
  auto spawned = spawnEachRank(job, launch);
  if (!spawned) {
    endInit(job);
    signal(job, SIGKILL);
    for (auto& r : job.ranks) {
      if (r.state == JobState::kRunning) (void)waitProcess(r.pid, std::chrono::seconds(5));
    }
  }
  return spawned;
}

// The job's init, whose namespaces the ranks join (rank_launch.h): what they see of the node.
// Returns descriptors of its namespaces, which `launch` names until they close.
Result<std::vector<UniqueFd>> RankProcesses::startInit(Job& job, NodeLaunch& launch) {
  const Keeper keeper{keeperPath_, (fs::path(job.dir) / "init.exit").string(), agentFd_.get()};
  LOCKSTEP_ASSIGN_OR_RETURN(job.init, spawnKept(jobInitSpawnOptions(launch), keeper));
  job.initPidfd = UniqueFd(pidfdOpen(job.init.program));  // signalled through: its pid may be reused
  std::vector<UniqueFd> namespaces;
  for (const char* name : {"user", "mnt", "pid"}) {
    namespaces.emplace_back(::open(("/proc/" + std::to_string(job.init.program) + "/ns/" + name).c_str(), O_RDONLY | O_CLOEXEC));
  }
  const bool inUserNamespace = ::geteuid() != 0;  // root's jobs stay in the node's
  if (!job.initPidfd.valid() || !namespaces[1].valid() || !namespaces[2].valid() ||
      (inUserNamespace && !namespaces[0].valid())) {
    return errnoError("cannot open the namespaces of job " + job.spec.jobId + "'s init", errno);
  }
  launch.join = SpawnOptions::Join{inUserNamespace ? namespaces[0].get() : -1, namespaces[1].get(), namespaces[2].get()};
  return namespaces;
}

void RankProcesses::endInit(Job& job) {
  if (job.initPidfd.valid()) {
    ::syscall(SYS_pidfd_send_signal, job.initPidfd.get(), SIGKILL, nullptr, 0);
    job.initPidfd.reset();
  }
  if (job.init.keeper > 0) initKeepers_.push_back(job.init.keeper);
  job.init = {};
  if (!job.cgroups.empty()) {
    killPart(job.cgroups);
    deadCgroups_.push_back(job.cgroups);
    job.cgroups = {};
  }
}

void RankProcesses::abandon(Job& job) {
  signal(job, SIGKILL);
  for (const auto& r : job.ranks) {
    if (r.state == JobState::kRunning && r.child && r.pid > 0) initKeepers_.push_back(r.pid);
  }
  endInit(job);
}

Result<void> RankProcesses::spawnEachRank(Job& job, NodeLaunch& launch) {
  // Made and limited before anything of the job runs (job_cgroup.h).
  std::vector<UniqueFd> cgroupProcs;
  job.cgroups = paths_.jobCgroups(job.spec);
  if (!launch.fenced) job.cgroups = PartCgroups{job.cgroups.unified};
  LOCKSTEP_TRY(makePartCgroups(paths_.cgroups, job.cgroups, launch.limits));
  for (const auto& dir : job.cgroups.distinct()) {
    cgroupProcs.emplace_back(::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!cgroupProcs.back().valid()) return errnoError("cannot open " + dir + "/cgroup.procs", errno);
    launch.cgroupProcsFds.push_back(cgroupProcs.back().get());
  }
  std::vector<UniqueFd> namespaces;
  if (!launch.hide.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(namespaces, startInit(job, launch));
  }
  for (auto& rank : job.ranks) LOCKSTEP_TRY(spawnRank(job, rank, launch));
  launch.join = {};
  launch.cgroupProcsFds.clear();
  return {};
}

Result<void> RankProcesses::spawnRank(Job& job, Rank& rank, NodeLaunch& launch) {
  // Made by the agent (and emptied for a restart): a rank writes its progress and stacks there.
  const std::string progressPath = rankProgressPath(job.dir, rank.placement.rank);
  const std::string stacksPath = rankStacksPath(job.dir, rank.placement.rank);
  LOCKSTEP_TRY(progress::create(progressPath));
  LOCKSTEP_TRY(writeFileAtomic(stacksPath, "", 0600));
  LOCKSTEP_TRY(giveToOwner(job.owner, progressPath));
  LOCKSTEP_TRY(giveToOwner(job.owner, stacksPath));
  const Keeper keeper{keeperPath_, JobPaths::rankExit(job.dir, rank.placement.rank), agentFd_.get()};
  auto spawned = spawnKept(rankSpawnOptions(launch, paths_.node, rank.placement, rank.logPath), keeper);
  if (!spawned) return spawned.error().withContext("cannot start rank " + std::to_string(rank.placement.rank));
  rank.pid = spawned->keeper;
  rank.programPid = spawned->program;
  rank.pidfd = UniqueFd(pidfdOpen(rank.pid));
  if (auto stat = readProcStat(rank.pid)) rank.startTicks = stat->startTicks;
  rank.state = JobState::kRunning;
  return {};
}

void RankProcesses::signal(Job& job, int signal) {
  for (const auto& r : job.ranks) {
    if (r.state == JobState::kRunning && r.pid > 0) ::kill(-r.pid, signal);  // the rank's process group
  }
}

void RankProcesses::terminate(Job& job, std::chrono::milliseconds grace) {
  signal(job, SIGTERM);
  job.killAt = Clock::now() + grace;
}

void RankProcesses::killIfDue(Job& job) {
  if (job.killAt && Clock::now() >= *job.killAt) {
    signal(job, SIGKILL);
    job.killAt.reset();
  }
}

std::optional<RankEnd> RankProcesses::reap(const Job& job, Rank& rank) {
  if (rank.state != JobState::kRunning) return std::nullopt;
  return rank.child ? reapChild(job, rank) : reapAdopted(job, rank);
}

std::optional<RankEnd> RankProcesses::reapChild(const Job& job, Rank& r) {
  // Not reaped yet (WNOWAIT): while the rank is a zombie its pid, and so its process group's id,
  // cannot be reused. Whatever it left in its group (DataLoader workers, a shell's children) is
  // killed before it is reaped: no orphans.
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != r.pid) {
    return std::nullopt;
  }
  ::kill(-r.pid, SIGKILL);
  int status = 0;
  if (::waitpid(r.pid, &status, WNOHANG) != r.pid) return std::nullopt;
  // The keeper's record has the whole truth (a crash by signal it does not repeat).
  return RankEnd{exitRecorded(job, r.placement.rank).value_or(exitStatusFromWait(status))};
}

std::optional<RankEnd> RankProcesses::reapAdopted(const Job& job, Rank& r) {
  // Gone, a zombie awaiting its new parent, or the pid reused by another process.
  const auto stat = readProcStat(r.pid);
  if (stat && stat->state != 'Z' && stat->startTicks == r.startTicks) return std::nullopt;
  killLeftovers(r.pid, job.spec.jobId);
  return RankEnd{exitRecorded(job, r.placement.rank)};
}

// How a rank ended, as its keeper wrote it; nullopt when the keeper did not (it was killed, or
// the rank was never kept).
std::optional<ExitStatus> RankProcesses::exitRecorded(const Job& job, std::uint32_t rank) const {
  const std::string path = JobPaths::rankExit(job.dir, rank);
  UniqueFd fd = openJobFile(path, O_RDONLY);
  if (!fd.valid()) return std::nullopt;
  auto text = readOpenFile(fd.get(), path, 64);
  return text ? ExitStatus::fromRecord(*text) : std::nullopt;
}

void RankProcesses::tidy() {
  std::erase_if(initKeepers_, [](pid_t keeper) { return ::waitpid(keeper, nullptr, WNOHANG) != 0; });
  std::erase_if(deadCgroups_, [](const PartCgroups& cgroups) { return removePart(cgroups); });
}

void RankProcesses::trimLogs(const Job& job) const {
  // copytruncate: the rank keeps appending to the same file (O_APPEND), now empty again.
  for (const auto& r : job.ranks) {
    if (r.state != JobState::kRunning) continue;
    // Through one descriptor of the file itself: a path the rank swapped for a symlink is not
    // followed (the agent would truncate what it points to).
    UniqueFd log = openJobFile(r.logPath, O_RDWR);
    struct stat st {};
    if (!log.valid() || ::fstat(log.get(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) <= logCapBytes_) {
      continue;
    }
    bool more = false;
    const std::string all = fileTail(log.get(), logCapBytes_ * 2, &more, r.logPath);
    if (writeFileAtomic(r.logPath + ".1", all)) (void)::ftruncate(log.get(), 0);
  }
}

}  // namespace lockstep::agent
