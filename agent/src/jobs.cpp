#include "jobs.h"

#include "job.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <set>

#include "host.h"
#include "job_cgroup.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"
#include "lockstep/common/npy.h"
#include "lockstep/common/progress.h"
#include "lockstep/kpi/stall.h"
#include "lockstep/protocol/codec.h"
#include "rank_launch.h"
#include "rank_processes.h"
#include "stalls.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kLogTailBytes = 4096;

}  // namespace

JobManager::JobManager(JobManagerOptions options, Emit emit)
    : options_(std::move(options)), emit_(std::move(emit)), agentFd_(::open(options_.keeperPath.c_str(), O_PATH | O_CLOEXEC)) {}

JobManager::~JobManager() = default;

JobEvent JobManager::event(const Job& job, JobEventKind kind, std::string message) const {
  JobEvent e;
  e.jobId = job.spec.jobId;
  e.kind = kind;
  e.timeUnixUs = unixMicrosNow();
  e.message = std::move(message);
  return e;
}

namespace {

// Where a restart resumes, as the ranks will find it: the newest step-NNNNNNNN.safetensors.
std::string resumePoint(const std::string& checkpointDir) {
  std::uint64_t newest = 0;
  bool found = false;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(checkpointDir, ec)) {
    const std::string name = entry.path().filename().string();
    unsigned long long step = 0;
    char tail[32] = {};
    if (std::sscanf(name.c_str(), "step-%llu.%31s", &step, tail) == 2 && std::string(tail) == "safetensors") {
      newest = std::max<std::uint64_t>(newest, step);
      found = true;
    }
  }
  return found ? "resuming after step " + std::to_string(newest) : "from the last checkpoint";
}

bool isWildcard(const std::string& host) { return host.empty() || host == "*" || host == "0.0.0.0"; }

// A TCP port free on `host` a moment ago, for a command job's own rendezvous (torch's c10d store
// binds it on rank 0), as torchrun picks one.
Result<std::uint32_t> freePortOn(const std::string& host) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errnoError("cannot make a socket to find a free port", errno);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = 0;
  if (::inet_pton(AF_INET, isWildcard(host) ? "0.0.0.0" : host.c_str(), &address.sin_addr) != 1) {
    address.sin_addr.s_addr = htonl(INADDR_ANY);  // a host name: any interface has it
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    return errnoError("cannot find a free port on " + host, errno);
  }
  socklen_t length = sizeof address;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return errnoError("cannot read the free port", errno);
  }
  return std::uint32_t{ntohs(address.sin_port)};
}

}  // namespace

Result<void> JobManager::checkFits(const JobSpec& spec, const std::vector<RankPlacement>& local) const {
  if (spec.backend == Backend::kCuda) {
    if (options_.node.gpuCount == 0) {
      return Error{ErrorCode::kFailedPrecondition, "node " + options_.node.name + " has no GPUs: use the CPU backend"};
    }
    const auto busy = busyGpus();
    std::set<std::uint32_t> mine;
    for (const auto& p : local) {
      const std::uint32_t gpu = *p.gpuIndex;
      if (gpu >= options_.node.gpuCount) {
        return invalidArgument("rank " + std::to_string(p.rank) + " wants GPU " + std::to_string(gpu) + " but node " +
                               options_.node.name + " has " + std::to_string(options_.node.gpuCount));
      }
      if (auto it = busy.find(gpu); it != busy.end()) {
        return Error{ErrorCode::kFailedPrecondition,
                     "GPU " + std::to_string(gpu) + " on " + options_.node.name + " is busy with job " + it->second};
      }
      mine.insert(gpu);
    }
  } else if (local.size() > options_.node.cpuCores) {
    return Error{ErrorCode::kResourceExhausted, "node " + options_.node.name + " has " +
                                                    std::to_string(options_.node.cpuCores) + " cores for " +
                                                    std::to_string(local.size()) + " CPU ranks: place fewer ranks here"};
  }
  return {};  // the files it names were checked off the event loop (preflight.h)
}

Result<StartJobReply> JobManager::start(const JobSpec& spec, const CheckedPaths& checked, const Identity& owner,
                                        const std::string& storeSecret) {
  if (auto existing = jobs_.find(spec.jobId); existing != jobs_.end()) {
    // A restart (a later attempt of a job that ended here) replaces the ended attempt's record.
    const Job& old = *existing->second;
    if (old.owner.user != owner.user) {
      // Not another user's: its directory, logs and stream would become this one's.
      return Error{ErrorCode::kAlreadyExists, "job " + spec.jobId + " on " + options_.node.name + " belongs to " +
                                                  old.owner.user + ": pick another job id"};
    }
    if (spec.attempt <= old.spec.attempt || old.running()) {
      return Error{ErrorCode::kAlreadyExists,
                   "job " + spec.jobId + " already exists on " + options_.node.name +
                       (old.running() ? " and is running" : "") + ": pick another job id"};
    }
    jobs_.erase(existing);
    order_.erase(std::remove(order_.begin(), order_.end(), spec.jobId), order_.end());
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const std::vector<RankPlacement> local, localRanks(spec));
  LOCKSTEP_TRY(checkFits(spec, local));

  auto job = std::make_unique<Job>();
  job->spec = spec;
  job->owner = owner;
  job->dir = jobDir(spec.jobId);
  job->storeSecret = storeSecret;
  NodeLaunch launch{&job->spec,       local,          checked.program,  spec.rendezvousHost, spec.rendezvousPort,
                    options_.reportEndpoint, options_.node.cpuCores, "", job->dir, options_.pythonPath,
                    "",               options_.sandbox ? options_.stateDir : "",
                    options_.sandbox && options_.privateTmp, &job->owner, {}, agentFd_.get(), -1};
  LOCKSTEP_TRY(rendezvous(*job, local, launch));

  // The job's directory and what its ranks write there belong to its user.
  LOCKSTEP_TRY(makeDirectories(job->dir, 0700));
  LOCKSTEP_TRY(giveToOwner(*job, job->dir));
  launch.metricsPath = (fs::path(job->dir) / "metrics.jsonl").string();
  if (!spec.command) {
    LOCKSTEP_TRY(writeFileAtomic(launch.metricsPath, "", 0600));
    LOCKSTEP_TRY(giveToOwner(*job, launch.metricsPath));
  }

  // Recorded before any rank exists: an agent killed from here on finds the job in its table when
  // it starts again, and adopts the ranks it had spawned (restore()).
  for (const auto& placement : local) {
    Rank rank;
    rank.placement = placement;
    rank.logPath = rankLogPath(job->dir, placement.rank);
    rank.state = JobState::kStarting;
    job->ranks.push_back(std::move(rank));
  }
  order_.push_back(spec.jobId);
  ++jobsVersion_;
  Job& started = *(jobs_[spec.jobId] = std::move(job));
  persist();
  if (auto spawned = spawnRanks(started, launch); !spawned) {
    endInit(started);
    jobs_.erase(spec.jobId);
    order_.erase(std::remove(order_.begin(), order_.end(), spec.jobId), order_.end());
    persist();
    return spawned.error();
  }
  // For the crash-window test: die where a crash would hurt most, ranks running and unanswered.
  if (const char* failpoint = std::getenv("LOCKSTEP_AGENT_FAILPOINT"); failpoint && std::string(failpoint) == "after-spawn") {
    ::raise(SIGKILL);
  }
  return announceStart(started);
}

Result<void> JobManager::giveToOwner(const Job& job, const std::string& path) const {
  if (::geteuid() != 0 || job.owner.uid == 0) return {};
  if (::lchown(path.c_str(), job.owner.uid, job.owner.gid) != 0) {
    return errnoError("cannot give " + path + " to " + job.owner.user, errno);
  }
  return {};
}

// The job's init, whose namespaces the ranks join (rank_launch.h): what they see of the node.
// Returns descriptors of its namespaces, which `launch` names until they close.
Result<std::vector<UniqueFd>> JobManager::startInit(Job& job, NodeLaunch& launch) {
  const Keeper keeper{options_.keeperPath, (fs::path(job.dir) / "init.exit").string(), agentFd_.get()};
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

// Ends the job's init and cgroup, and with them whatever the job left running.
void JobManager::endInit(Job& job) {
  if (job.initPidfd.valid()) {
    ::syscall(SYS_pidfd_send_signal, job.initPidfd.get(), SIGKILL, nullptr, 0);
    job.initPidfd.reset();
  }
  if (job.init.keeper > 0) initKeepers_.push_back(job.init.keeper);
  job.init = {};
  if (!job.cgroup.empty()) {
    killJobCgroup(job.cgroup);
    deadCgroups_.push_back(job.cgroup);
    job.cgroup.clear();
  }
}

// Every local rank, or none: a rank that cannot start takes the ones before it down.
Result<void> JobManager::spawnRanks(Job& job, NodeLaunch& launch) {
  auto spawned = spawnEachRank(job, launch);
  if (!spawned) {
    endInit(job);
    signalRanks(job, SIGKILL);
    for (auto& r : job.ranks) {
      if (r.state == JobState::kRunning) (void)waitProcess(r.pid, std::chrono::seconds(5));
    }
  }
  return spawned;
}

Result<void> JobManager::spawnEachRank(Job& job, NodeLaunch& launch) {
  UniqueFd cgroupProcs;
  if (!options_.cgroupBase.empty()) {
    job.cgroup = cgroupOf(job.spec);
    LOCKSTEP_TRY(makeJobCgroup(job.cgroup));
    cgroupProcs = UniqueFd(::open((job.cgroup + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!cgroupProcs.valid()) return errnoError("cannot open " + job.cgroup + "/cgroup.procs", errno);
    launch.cgroupProcsFd = cgroupProcs.get();
  }
  std::vector<UniqueFd> namespaces;
  if (!launch.hide.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(namespaces, startInit(job, launch));
  }
  for (auto& rank : job.ranks) {
    // Made by the agent (and emptied for a restart): a rank writes its progress and stacks there.
    const std::string progressPath = rankProgressPath(job.dir, rank.placement.rank);
    const std::string stacksPath = rankStacksPath(job.dir, rank.placement.rank);
    LOCKSTEP_TRY(progress::create(progressPath));
    LOCKSTEP_TRY(writeFileAtomic(stacksPath, "", 0600));
    LOCKSTEP_TRY(giveToOwner(job, progressPath));
    LOCKSTEP_TRY(giveToOwner(job, stacksPath));
    const Keeper keeper{options_.keeperPath, rankExitPath(job.dir, rank.placement.rank), agentFd_.get()};
    auto spawned = spawnKept(rankSpawnOptions(launch, options_.node.name, rank.placement, rank.logPath), keeper);
    if (!spawned) return spawned.error().withContext("cannot start rank " + std::to_string(rank.placement.rank));
    rank.pid = spawned->keeper;
    rank.programPid = spawned->program;
    rank.pidfd = UniqueFd(pidfdOpen(rank.pid));
    if (auto stat = readProcStat(rank.pid)) rank.startTicks = stat->startTicks;
    rank.state = JobState::kRunning;
  }
  launch.join = {};
  launch.cgroupProcsFd = -1;
  return {};
}

StartJobReply JobManager::announceStart(Job& job) {
  const JobSpec& spec = job.spec;
  job.state = JobState::kRunning;
  job.startedUnixUs = unixMicrosNow();
  StartJobReply reply{spec.jobId, job.storePort != 0 ? job.storePort : job.masterPort,
                      job.store ? job.storeSecret : std::string()};
  std::string pids;
  for (const auto& r : job.ranks) {
    pids += (pids.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r.placement.rank) + " pid " +
            std::to_string(r.programPid);
  }
  const std::string resumes = spec.command ? "its program resuming as it does" : resumePoint(spec.checkpointDir);
  emit_(event(job, JobEventKind::kStarted,
              spec.attempt == 0 ? "started on " + options_.node.name + ": " + pids
                                : "restart " + std::to_string(spec.attempt) + " started on " + options_.node.name +
                                      " with " + std::to_string(spec.worldSize) + " rank" +
                                      (spec.worldSize == 1 ? "" : "s") + " (" + pids + "), " + resumes +
                                      (spec.restartReason.empty() ? "" : "; " + spec.restartReason)));
  persist();
  return reply;
}

// The job's store, on the address the agent listens on (the wildcard only when the agent's is).
Result<std::unique_ptr<StoreServer>> JobManager::startStore(const Job& job, std::uint16_t port) const {
  StoreServerOptions store;
  store.secret = job.storeSecret;
  store.worldSize = job.spec.worldSize;
  return StoreServer::start(isWildcard(options_.listenHost) ? "0.0.0.0" : options_.listenHost, port, store);
}

Result<std::vector<RankPlacement>> JobManager::localRanks(const JobSpec& spec) const {
  std::vector<RankPlacement> local;
  if (spec.ranks.empty()) {
    for (std::uint32_t r = 0; r < spec.worldSize; ++r) local.push_back({r, options_.node.name, r, std::nullopt});
    return local;
  }
  std::string nodes;
  for (const auto& p : spec.ranks) {
    if (p.node == options_.node.name) local.push_back(p);
    if (nodes.find(p.node) == std::string::npos) nodes += (nodes.empty() ? "" : ", ") + p.node;
  }
  if (local.empty()) {
    return invalidArgument("job " + spec.jobId + " places no rank on node " + options_.node.name + " (it names " +
                           nodes + ")");
  }
  return local;
}

// Where the ranks meet: the trainer's store, hosted here when rank 0 runs here, or the free port
// a command job's own store binds on rank 0; else the host and port rank 0's agent gave.
Result<void> JobManager::rendezvous(Job& job, const std::vector<RankPlacement>& local, NodeLaunch& launch) const {
  const JobSpec& spec = job.spec;
  const bool runsRankZero = std::any_of(local.begin(), local.end(), [](const RankPlacement& p) { return p.rank == 0; });
  const bool wildcard = isWildcard(options_.listenHost);
  if (runsRankZero) {
    if (spec.command) {
      LOCKSTEP_ASSIGN_OR_RETURN(job.masterPort, freePortOn(options_.listenHost));
      launch.masterPort = job.masterPort;
    } else if (spec.worldSize > 1) {
      job.storeSecret = newStoreSecret();
      LOCKSTEP_ASSIGN_OR_RETURN(job.store, startStore(job, 0));
      job.storePort = job.store->port();
      launch.masterPort = job.storePort;
    }
    launch.storeSecret = job.storeSecret;
    if (launch.masterAddr.empty()) launch.masterAddr = wildcard ? "127.0.0.1" : options_.listenHost;
    return {};
  }
  if (launch.masterAddr.empty() || launch.masterPort == 0) {
    return invalidArgument("job " + spec.jobId + ": rank 0 runs on another node, so the job spec needs that node's "
                           "rendezvous host and port (start the job there first; lockstepctl does)");
  }
  if (!spec.command && job.storeSecret.empty()) {
    return invalidArgument("job " + spec.jobId + ": rank 0 runs on another node, so its store's secret is needed, "
                           "which that node's agent returned when the job started there (lockstepctl and the app "
                           "pass it on)");
  }
  launch.storeSecret = job.storeSecret;
  return {};
}

Result<StopJobReply> JobManager::stop(const std::string& jobId, std::uint32_t graceMs, std::string reason) {
  auto it = jobs_.find(jobId);
  if (it == jobs_.end()) {
    return Error{ErrorCode::kNotFound, "no job " + jobId + " on " + options_.node.name + " (lockstepctl status lists them)"};
  }
  Job& job = *it->second;
  if (job.running() && !job.stopRequested) {
    job.stopRequested = true;
    job.stopReason = std::move(reason);
    signalRanks(job, SIGTERM);
    job.killAt = Clock::now() + (graceMs > 0 ? std::chrono::milliseconds(graceMs) : options_.defaultStopGrace);
    persist();
  }
  return StopJobReply{jobId, job.state};
}

void JobManager::signalRanks(Job& job, int signal) {
  for (const auto& r : job.ranks) {
    if (r.state == JobState::kRunning && r.pid > 0) ::kill(-r.pid, signal);  // the rank's process group
  }
}

std::vector<int> JobManager::exitFds() const {
  std::vector<int> fds;
  for (const auto& [id, job] : jobs_) {
    for (const auto& r : job->ranks) {
      if (r.state == JobState::kRunning && r.pidfd.valid()) fds.push_back(r.pidfd.get());
    }
  }
  return fds;
}

void JobManager::poll() {
  std::erase_if(initKeepers_, [](pid_t keeper) { return ::waitpid(keeper, nullptr, WNOHANG) != 0; });
  std::erase_if(deadCgroups_, [](const std::string& cgroup) { return removeJobCgroup(cgroup); });
  for (auto& [id, job] : jobs_) {
    for (std::size_t i = 0; i < job->ranks.size(); ++i) {
      Rank& r = job->ranks[i];
      if (r.state != JobState::kRunning) continue;
      if (r.child) {
        // Not reaped yet (WNOWAIT): while the rank is a zombie its pid, and so its process group's
        // id, cannot be reused. Whatever it left in its group (DataLoader workers, a shell's
        // children) is killed before it is reaped: no orphans.
        siginfo_t info{};
        if (::waitid(P_PID, static_cast<id_t>(r.pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != r.pid) {
          continue;
        }
        ::kill(-r.pid, SIGKILL);
        int status = 0;
        if (::waitpid(r.pid, &status, WNOHANG) == r.pid) {
          // The keeper's record has the whole truth (a crash by signal it does not repeat).
          rankEnded(*job, i, exitRecorded(*job, r.placement.rank).value_or(exitStatusFromWait(status)));
        }
      } else {
        // Adopted: gone, a zombie awaiting its new parent, or the pid reused by another process.
        const auto stat = readProcStat(r.pid);
        if (!stat || stat->state == 'Z' || stat->startTicks != r.startTicks) {
          killLeftovers(r.pid, id);
          rankEnded(*job, i, exitRecorded(*job, r.placement.rank));
        }
      }
    }
    if (job->killAt && Clock::now() >= *job->killAt) {
      signalRanks(*job, SIGKILL);
      job->killAt.reset();
    }
  }
  if (Clock::now() >= nextTrim_) {
    trimLogs();
    nextTrim_ = Clock::now() + std::chrono::seconds(1);
  }
}

void JobManager::rankEnded(Job& job, std::size_t index, std::optional<ExitStatus> status) {
  Rank& r = job.ranks[index];
  r.pidfd.reset();
  r.exit = status;
  r.exitUnknown = !status.has_value();
  const std::string who = "rank " + std::to_string(r.placement.rank);
  const std::string how = status ? "exited with " + status->describe() : "ended while the agent was away: exit code unknown";
  if (job.store) job.store->noteRankExit(static_cast<int>(r.placement.rank), status ? "exited with " + status->describe() : how);
  const bool stoppedByUs = job.stopRequested || job.state == JobState::kFailed;
  if (stoppedByUs) {
    r.state = JobState::kStopped;
  } else if (!status) {
    // An adopted rank whose keeper left no record (it was killed too). Its reports while the
    // agent was away went nowhere, but the trainer's JSON lines kept them.
    // The trainer's last step says whether it got to the end; a program of the user's own has
    // no last step we know, and is not called failed (which would restart a job that may have
    // finished) on no evidence.
    if (!job.spec.isCommand()) r.lastStep = std::max(r.lastStep, lastStepInMetrics(job, r.placement.rank));
    const bool reachedEnd = job.spec.isCommand() || (job.spec.steps > 0 && r.lastStep >= job.spec.steps);
    r.state = reachedEnd ? JobState::kFinished : JobState::kFailed;
  } else {
    r.state = status->success() ? JobState::kFinished : JobState::kFailed;
  }
  JobEvent exited = event(job, JobEventKind::kRankExited, who + " " + how);
  exited.rank = r.placement.rank;
  if (status && status->signal == 0) exited.exitCode = status->exitCode;
  if (status && status->signal != 0) exited.signal = status->signal;
  emit_(exited);

  if (r.state == JobState::kFailed && job.state == JobState::kRunning) {
    // Fail fast: the others cannot finish without this rank. Where it was (its progress record)
    // tells its peers' users which collective it left them in.
    std::string message = who + " " + (status ? how : "ended before its last step; its exit code is unknown");
    if (auto last = progress::read(rankProgressPath(job.dir, r.placement.rank))) {
      message += ", in " + kpi::whereIs(progressOf(r.placement.rank, *last, 0));
    }
    JobEvent failed = event(job, JobEventKind::kFailed, "");
    failed.exitCode = exited.exitCode;
    failed.signal = exited.signal;
    failed.logTail = fileTail(r.logPath, kLogTailBytes, nullptr);
    failJob(job, std::move(message), r.placement.rank, std::move(failed));
  }
  finishIfDone(job);
  persist();
}

void JobManager::failJob(Job& job, std::string message, std::optional<std::uint32_t> rank, JobEvent failed) {
  job.state = JobState::kFailed;
  job.message = std::move(message);
  failed.message = job.message;
  failed.rank = rank;
  emit_(failed);
  signalRanks(job, SIGTERM);
  job.killAt = Clock::now() + options_.defaultStopGrace;
}

Result<void> JobManager::fail(const std::string& jobId, std::string message) {
  auto it = jobs_.find(jobId);
  if (it == jobs_.end() || !it->second->running()) return notFound("no running job " + jobId + " here");
  Job& job = *it->second;
  failJob(job, std::move(message), std::nullopt, event(job, JobEventKind::kFailed, ""));
  persist();
  return {};
}

std::vector<WatchedJob> JobManager::watched() const {
  std::vector<WatchedJob> out;
  for (const auto& id : order_) {
    if (jobs_.at(id)->running()) out.push_back(watched(id));
  }
  return out;
}

WatchedJob JobManager::watched(const std::string& jobId) const {
  WatchedJob w;
  w.jobId = jobId;
  auto it = jobs_.find(jobId);
  if (it == jobs_.end()) return w;
  const Job& job = *it->second;
  w.stallAfterS = job.spec.stallAfterS;
  w.onStall = job.spec.onStall;
  w.command = job.spec.isCommand();
  for (const auto& r : job.ranks) {
    if (r.state != JobState::kRunning || r.programPid <= 0) continue;
    w.ranks.push_back(WatchedRank{r.placement.rank, r.programPid, r.pid, rankProgressPath(job.dir, r.placement.rank),
                                  rankStacksPath(job.dir, r.placement.rank), r.logPath});
  }
  return w;
}

void JobManager::finishIfDone(Job& job) {
  if (!job.anyRankRunning()) endInit(job);
  if (job.anyRankRunning() || !job.running()) {
    if (!job.anyRankRunning() && job.endedUnixUs == 0) {
      job.endedUnixUs = unixMicrosNow();
      job.store.reset();
      job.killAt.reset();
    }
    return;
  }
  job.endedUnixUs = unixMicrosNow();
  job.store.reset();
  job.killAt.reset();
  if (job.stopRequested) {
    job.state = JobState::kStopped;
    job.message = job.stopReason.empty() ? "stopped on request" : job.stopReason;
    emit_(event(job, JobEventKind::kStopped, job.message));
    return;
  }
  job.state = JobState::kFinished;
  const bool unknown = std::any_of(job.ranks.begin(), job.ranks.end(), [](const Rank& r) { return r.exitUnknown; });
  job.message = unknown ? "finished (some ranks ended while the agent was away; their last steps were reported)" : "";
  emit_(event(job, JobEventKind::kFinished, job.message.empty() ? "finished" : job.message));
}

std::vector<JobStatus> JobManager::list() const {
  std::vector<JobStatus> out;
  for (const auto& id : order_) {
    const Job& job = *jobs_.at(id);
    JobStatus s{job.spec,     job.state, {}, job.startedUnixUs, job.endedUnixUs, job.message,
                job.storePort != 0 ? job.storePort : job.masterPort, {}, {}, std::nullopt, job.owner.user};
    for (const auto& r : job.ranks) {
      RankStatus rs{r.placement.rank, r.placement.localRank, r.placement.gpuIndex, static_cast<std::uint32_t>(r.programPid),
                    r.state, std::nullopt, std::nullopt, r.exitUnknown};
      if (r.exit && r.exit->signal == 0) rs.exitCode = r.exit->exitCode;
      if (r.exit && r.exit->signal != 0) rs.signal = r.exit->signal;
      s.ranks.push_back(rs);
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string JobManager::cgroupOf(const JobSpec& spec) const {
  return jobCgroupPath(options_.cgroupBase, options_.node.name, options_.stateDir, spec.jobId, spec.attempt);
}

std::string JobManager::launcherPath(const std::string& jobId) const {
  return (fs::path(options_.stateDir) / "launchers" / jobId).string();
}

std::optional<std::string> JobManager::ownerOf(const std::string& jobId) const {
  const auto it = jobs_.find(jobId);
  if (it == jobs_.end()) return std::nullopt;
  return it->second->owner.user;
}

Result<LogsReply> JobManager::logs(const std::string& jobId, std::uint32_t rank, std::uint32_t maxBytes) const {
  auto it = jobs_.find(jobId);
  if (it == jobs_.end()) return Error{ErrorCode::kNotFound, "no job " + jobId + " on " + options_.node.name};
  const auto r = std::find_if(it->second->ranks.begin(), it->second->ranks.end(),
                              [&](const Rank& x) { return x.placement.rank == rank; });
  if (r == it->second->ranks.end()) {
    return Error{ErrorCode::kNotFound, "job " + jobId + " runs no rank " + std::to_string(rank) + " on " + options_.node.name};
  }
  const std::uint64_t budget = std::min<std::uint64_t>(maxBytes > 0 ? maxBytes : 64u << 10, 4u << 20);
  bool more = false;
  std::string text = fileTail(r->logPath, budget, &more);
  if (!more && text.size() < budget) {
    bool olderMore = false;
    std::string older = fileTail(r->logPath + ".1", budget - text.size(), &olderMore);
    more = olderMore;
    text = older + text;
  }
  return LogsReply{jobId, rank, std::move(text), more};
}

bool JobManager::knowsRank(const std::string& jobId, std::uint32_t rank) const {
  auto it = jobs_.find(jobId);
  return it != jobs_.end() && std::any_of(it->second->ranks.begin(), it->second->ranks.end(),
                                          [&](const Rank& r) { return r.placement.rank == rank; });
}

void JobManager::noteStep(const std::string& jobId, std::uint32_t rank, std::uint64_t step) {
  auto it = jobs_.find(jobId);
  if (it == jobs_.end()) return;
  for (auto& r : it->second->ranks) {
    if (r.placement.rank == rank) r.lastStep = std::max(r.lastStep, step);
  }
}

std::vector<TrackedRank> JobManager::runningRanks() const {
  std::vector<TrackedRank> out;
  for (const auto& [id, job] : jobs_) {
    for (const auto& r : job->ranks) {
      if (r.state == JobState::kRunning) out.push_back({id, r.placement.rank, r.programPid});
    }
  }
  return out;
}

std::map<std::uint32_t, std::string> JobManager::busyGpus() const {
  std::map<std::uint32_t, std::string> out;
  for (const auto& [id, job] : jobs_) {
    for (const auto& r : job->ranks) {
      if (r.state == JobState::kRunning && r.placement.gpuIndex) out[*r.placement.gpuIndex] = id;
    }
  }
  return out;
}

void JobManager::trimLogs() {
  // copytruncate: the rank keeps appending to the same file (O_APPEND), now empty again.
  for (const auto& [id, job] : jobs_) {
    for (const auto& r : job->ranks) {
      if (r.state != JobState::kRunning) continue;
      // Through one descriptor of the file itself: a path the rank swapped for a symlink is not
      // followed (the agent would truncate what it points to).
      UniqueFd log = openJobFile(r.logPath, O_RDWR);
      struct stat st {};
      if (!log.valid() || ::fstat(log.get(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) <= options_.logCapBytes) {
        continue;
      }
      bool more = false;
      const std::string all = fileTail(log.get(), options_.logCapBytes * 2, &more, r.logPath);
      if (writeFileAtomic(r.logPath + ".1", all)) (void)::ftruncate(log.get(), 0);
    }
  }
}

std::string JobManager::jobDir(const std::string& jobId) const {
  return (fs::path(options_.stateDir) / "jobs" / jobId).string();
}

std::string JobManager::rankLogPath(const std::string& jobDir, std::uint32_t rank) {
  return (fs::path(jobDir) / ("rank-" + std::to_string(rank) + ".log")).string();
}

std::string JobManager::rankExitPath(const std::string& jobDir, std::uint32_t rank) {
  return (fs::path(jobDir) / ("rank-" + std::to_string(rank) + ".exit")).string();
}

}  // namespace lockstep::agent
