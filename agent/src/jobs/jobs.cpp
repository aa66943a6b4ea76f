#include "jobs/jobs.h"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "jobs/job.h"
#include "jobs/job_files.h"
#include "jobs/job_membership.h"
#include "jobs/node_share.h"
#include "jobs/rank_launch.h"
#include "jobs/rank_progress.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"
#include "lockstep/common/progress.h"
#include "lockstep/kpi/stall.h"
#include "lockstep/present/present.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr std::size_t kLogTailBytes = 4096;

}  // namespace

JobManager::JobManager(JobManagerOptions options, Emit emit)
    : options_(std::move(options)),
      emit_(std::move(emit)),
      paths_{options_.stateDir, options_.node.name, options_.cgroups},
      table_(paths_),
      ranks_(paths_, options_.keeperPath, options_.logCapBytes),
      rendezvous_(options_.listenHost) {}

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

// The last step `rank` wrote to the job's metrics file (its last 1 MiB: every rank's final lines).
std::uint64_t lastStepInMetrics(const Job& job, std::uint32_t rank) {
  std::istringstream lines(fileTail((fs::path(job.dir) / "metrics.jsonl").string(), 1u << 20, nullptr));
  std::uint64_t last = 0;
  for (std::string line; std::getline(lines, line);) {
    const Json j = Json::parse(line, nullptr, false);  // the first line may be cut
    if (j.is_object() && j.value("rank", -1) == static_cast<int>(rank) && j.contains("step") && j["step"].is_number_unsigned()) {
      last = std::max(last, j["step"].get<std::uint64_t>());
    }
  }
  return last;
}

// The trainer's own stop: a rank given SIGTERM or SIGINT votes to stop in the next step's header,
// and every rank of the job ends after that same step with 128 + the signal (docs/trainer.md). A
// stop asked of one node's agent so reaches the other nodes' ranks through their peers, before
// their own agents are asked or without it: they stopped, and did not fail.
bool stoppedByVote(const Job& job, const ExitStatus& status) {
  return !job.spec.isCommand() && status.signal == 0 &&
         (status.exitCode == 128 + SIGTERM || status.exitCode == 128 + SIGINT);
}

// What a rank that ended is now. One the agent stopped is stopped. An adopted rank whose keeper
// left no record (it was killed too) has no exit status: its reports while the agent was away
// went nowhere, but the trainer's JSON lines kept them, and the trainer's last step says whether
// it got to the end; a program of the user's own has no last step we know, and is not called
// failed (which would restart a job that may have finished) on no evidence.
JobState stateAfterExit(const Job& job, Rank& r, const std::optional<ExitStatus>& status) {
  if (job.stopRequested || job.state == JobState::kFailed) return JobState::kStopped;
  if (status && stoppedByVote(job, *status)) return JobState::kStopped;
  if (status) return status->success() ? JobState::kFinished : JobState::kFailed;
  if (!job.spec.isCommand()) r.lastStep = std::max(r.lastStep, lastStepInMetrics(job, r.placement.rank));
  const bool reachedEnd = job.spec.isCommand() || (job.spec.steps > 0 && r.lastStep >= job.spec.steps);
  return reachedEnd ? JobState::kFinished : JobState::kFailed;
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
  }
  return {};  // the files it names were checked off the event loop (preflight.h); cores and memory: partOf
}

NodeCapacity JobManager::capacity() const {
  return {"node " + options_.node.name, options_.cgroups.cpus, options_.node.memoryBytes, options_.cpuOvercommit};
}

std::vector<Held> JobManager::held() const {
  std::vector<Held> parts;
  for (const auto& [id, job] : jobs_) {
    if (job->anyRankRunning()) parts.push_back({job->cpus, job->limits.memoryBytes});
  }
  return parts;
}

NodeFree JobManager::free() const { return freeOf(capacity(), held()); }

// What the part of `spec` with ranks `local` may take here: its limits and cores of its own, or
// why the node has not got them free (node_share.h).
Result<void> JobManager::fence(Job& job, const std::vector<RankPlacement>& local, NodeLaunch& launch) const {
  launch.fenced = options_.fences;
  if (!options_.fences) return {};
  job.limits = partLimits(job.spec, local, options_.memPerRank);
  launch.cpusPerRank = std::max(1u, job.spec.cpusPerRank);
  const Ask ask{static_cast<std::uint32_t>(local.size()) * launch.cpusPerRank, job.limits.memoryBytes};
  LOCKSTEP_ASSIGN_OR_RETURN(job.cpus, coresFor(capacity(), held(), ask));
  job.limits.cpus = job.cpus;
  launch.limits = job.limits;
  launch.cpus = job.cpus;
  return {};
}

Result<StartJobReply> JobManager::start(const JobSpec& spec, const CheckedPaths& checked, const Identity& owner,
                                        const std::string& storeSecret) {
  LOCKSTEP_TRY(replaceEnded(spec, owner));
  LOCKSTEP_ASSIGN_OR_RETURN(const std::vector<RankPlacement> local, localRanks(spec));
  LOCKSTEP_TRY(checkFits(spec, local));

  auto job = std::make_unique<Job>();
  job->spec = spec;
  job->owner = owner;
  job->dir = paths_.jobDir(spec.jobId);
  job->storeSecret = storeSecret;
  // The agent's binary (agentFd) is the rank processes's to give.
  NodeLaunch launch;
  launch.spec = &job->spec;
  launch.local = local;
  launch.program = checked.program;
  launch.masterAddr = spec.rendezvousHost;
  launch.masterPort = spec.rendezvousPort;
  launch.reportEndpoint = options_.reportEndpoint;
  launch.cpuCores = options_.node.cpuCores;
  launch.jobDir = job->dir;
  launch.pythonPath = options_.pythonPath;
  launch.hide = options_.sandbox ? options_.stateDir : "";
  launch.privateTmp = options_.sandbox && options_.privateTmp;
  launch.owner = &job->owner;
  LOCKSTEP_TRY(fence(*job, local, launch));
  LOCKSTEP_TRY(rendezvous_.prepare(*job, local, launch));
  LOCKSTEP_TRY(makeJobDir(*job, launch));

  Job& started = record(std::move(job), local);
  if (auto spawned = ranks_.spawn(started, launch); !spawned) {
    ranks_.endInit(started);
    forget(spec.jobId);
    persist();
    return spawned.error();
  }
  sayUnfenced(started);
  // For the crash-window test: die where a crash would hurt most, ranks running and unanswered.
  if (const char* failpoint = std::getenv("LOCKSTEP_AGENT_FAILPOINT"); failpoint && std::string(failpoint) == "after-spawn") {
    ::raise(SIGKILL);
  }
  return announceStart(started);
}

// A restart (a later attempt of a job that ended here) replaces the ended attempt's record.
Result<void> JobManager::replaceEnded(const JobSpec& spec, const Identity& owner) {
  const auto existing = jobs_.find(spec.jobId);
  if (existing == jobs_.end()) return {};
  Job& old = *existing->second;
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
  if (old.anyRankRunning()) ranks_.abandon(old);  // failed, its ranks still being stopped
  forget(spec.jobId);
  return {};
}

// The job's directory and what its ranks write there belong to its user.
Result<void> JobManager::makeJobDir(const Job& job, NodeLaunch& launch) const {
  LOCKSTEP_TRY(makeDirectories(job.dir, 0700));
  LOCKSTEP_TRY(giveToOwner(job.owner, job.dir));
  launch.metricsPath = (fs::path(job.dir) / "metrics.jsonl").string();
  if (!job.spec.command) {
    LOCKSTEP_TRY(writeFileAtomic(launch.metricsPath, "", 0600));
    LOCKSTEP_TRY(giveToOwner(job.owner, launch.metricsPath));
  }
  return {};
}

// Recorded before any rank exists: an agent killed from here on finds the job in its table when
// it starts again, and adopts the ranks it had spawned (restore()).
Job& JobManager::record(std::unique_ptr<Job> job, const std::vector<RankPlacement>& local) {
  for (const auto& placement : local) {
    Rank rank;
    rank.placement = placement;
    rank.logPath = JobPaths::rankLog(job->dir, placement.rank);
    rank.state = JobState::kStarting;
    job->ranks.push_back(std::move(rank));
  }
  const std::string id = job->spec.jobId;
  order_.push_back(id);
  ++jobsVersion_;
  Job& recorded = *(jobs_[id] = std::move(job));
  persist();
  return recorded;
}

void JobManager::forget(const std::string& jobId) {
  jobs_.erase(jobId);
  order_.erase(std::remove(order_.begin(), order_.end(), jobId), order_.end());
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

Result<std::vector<RankPlacement>> JobManager::localRanks(const JobSpec& spec) const {
  std::vector<RankPlacement> local;
  if (spec.ranks.empty()) {
    for (std::uint32_t r = 0; r < spec.worldSize; ++r) local.push_back({r, options_.node.name, r, std::nullopt});
    return local;
  }
  for (const auto& p : spec.ranks) {
    if (p.node == options_.node.name) local.push_back(p);
  }
  if (local.empty()) {
    std::set<std::string> named;  // once each, however many ranks
    for (const auto& p : spec.ranks) named.insert(p.node);
    std::string nodes;
    for (const auto& n : named) nodes += (nodes.empty() ? "" : ", ") + n;
    return invalidArgument("job " + spec.jobId + " places no rank on node " + options_.node.name + " (it names " +
                           nodes + ")");
  }
  return local;
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
    ranks_.terminate(job, graceMs > 0 ? std::chrono::milliseconds(graceMs) : options_.defaultStopGrace);
    persist();
  }
  return StopJobReply{jobId, job.state};
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
  ranks_.tidy();
  bool ended = false;
  for (auto& [id, job] : jobs_) {
    for (std::size_t i = 0; i < job->ranks.size(); ++i) {
      if (auto end = ranks_.reap(*job, job->ranks[i])) {
        rankEnded(*job, i, end->status);
        ended = true;
      }
    }
    ranks_.killIfDue(*job);
  }
  // Once, after the walk: persisting drops the oldest finished jobs, which may be the one whose
  // last rank just ended (erasing it inside the walk left the loop on a freed job).
  if (ended) persist();
  if (Clock::now() >= nextTrim_) {
    for (const auto& [id, job] : jobs_) ranks_.trimLogs(*job);
    nextTrim_ = Clock::now() + std::chrono::seconds(1);
  }
}

void JobManager::rankEnded(Job& job, std::size_t index, std::optional<ExitStatus> status) {
  Rank& r = job.ranks[index];
  r.pidfd.reset();
  r.exit = status;
  r.exitUnknown = !status.has_value();
  const std::string who = "rank " + std::to_string(r.placement.rank);
  std::string how = status ? "exited with " + status->describe() : "ended while the agent was away: exit code unknown";
  if (status) how = fenceVerdict(job, *status, how);
  if (job.store) job.store->noteRankExit(static_cast<int>(r.placement.rank), status ? "exited with " + status->describe() : how);
  r.state = stateAfterExit(job, r, status);
  JobEvent exited = event(job, JobEventKind::kRankExited, who + " " + how);
  exited.rank = r.placement.rank;
  if (status && status->signal == 0) exited.exitCode = status->exitCode;
  if (status && status->signal != 0) exited.signal = status->signal;
  emit_(exited);

  if (r.state == JobState::kFailed && job.state == JobState::kRunning) {
    failFast(job, r, who + " " + (status ? how : "ended before its last step; its exit code is unknown"), exited);
  }
  finishIfDone(job);
}

// A limit the job asked for that this node cannot fence is said in its events, with why.
void JobManager::sayUnfenced(const Job& job) {
  if (!options_.fences) return;
  const auto off = [&](const char* fence) {
    for (const auto& line : options_.cgroups.off) {
      if (line.rfind(std::string(fence) + ": ", 0) == 0) return line;
    }
    return std::string();
  };
  std::string unfenced;
  if (job.spec.memPerRank > 0 && !options_.cgroups.memory.available()) unfenced += "; " + off("memory");
  if (job.spec.maxProcessesPerRank > 0 && !options_.cgroups.pids.available()) unfenced += "; " + off("processes");
  if (job.spec.cpusPerRank > 0 && !options_.cgroups.cpuset.available()) unfenced += "; " + off("cores");
  if (!unfenced.empty()) {
    emit_(event(job, JobEventKind::kNote, "on " + options_.node.name + " some of what the job asked for is not fenced" + unfenced));
  }
}

// How the job's fences explain a rank's end (job_cgroup.h, the kernel's counts in its cgroups),
// each count said once: killed at the memory limit, a fork refused at the process limit.
std::string JobManager::fenceVerdict(Job& job, const ExitStatus& status, std::string how) {
  const PartEvents counted = partEvents(job.cgroups);
  const std::string node = " on " + options_.node.name;
  if (counted.oomKills > job.oomKillsSaid && job.limits.memoryBytes > 0) {
    // The limit it was given (the node's default may have changed since), each rank's share.
    const std::uint64_t perRank = job.limits.memoryBytes / std::max<std::size_t>(1, job.ranks.size());
    const std::string limit = "the job's memory limit of " + present::bytes(static_cast<double>(perRank)) + " per rank";
    // A rank killed outright is the kernel's victim; one that ended otherwise (a worker of its
    // was) is told of it, and the count waits for a victim.
    if (status.signal == SIGKILL) job.oomKillsSaid = counted.oomKills;
    how = status.signal == SIGKILL ? "on " + options_.node.name + " was killed by the kernel: " + limit + " was reached"
                                   : how + node + "; the kernel killed a process of the job at " + limit;
  }
  if (counted.forksRefused > job.forksRefusedSaid) {
    job.forksRefusedSaid = counted.forksRefused;
    how += node + "; the kernel refused it a new process at the job's limit of " +
           std::to_string(job.spec.maxProcessesPerRank > 0 ? job.spec.maxProcessesPerRank : JobSpec::kDefaultProcessesPerRank) +
           " processes and threads per rank (--max-processes-per-rank)";
  }
  return how;
}

// The others cannot finish without this rank. Where it was (its progress record) tells its peers'
// users which collective it left them in.
void JobManager::failFast(Job& job, const Rank& r, std::string message, const JobEvent& exited) {
  if (auto last = progress::read(rankProgressPath(job.dir, r.placement.rank))) {
    message += ", in " + kpi::whereIs(progressOf(r.placement.rank, *last, 0));
  }
  JobEvent failed = event(job, JobEventKind::kFailed, "");
  failed.exitCode = exited.exitCode;
  failed.signal = exited.signal;
  failed.logTail = fileTail(r.logPath, kLogTailBytes, nullptr);
  failJob(job, std::move(message), r.placement.rank, std::move(failed));
}

void JobManager::failJob(Job& job, std::string message, std::optional<std::uint32_t> rank, JobEvent failed) {
  job.state = JobState::kFailed;
  job.message = std::move(message);
  failed.message = job.message;
  failed.rank = rank;
  emit_(failed);
  ranks_.terminate(job, options_.defaultStopGrace);
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
  if (!job.anyRankRunning()) ranks_.endInit(job);
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
  const bool voted = std::any_of(job.ranks.begin(), job.ranks.end(), [](const Rank& r) { return r.state == JobState::kStopped; });
  if (job.stopRequested || voted) {
    job.state = JobState::kStopped;
    job.message = job.stopRequested ? (job.stopReason.empty() ? "stopped on request" : job.stopReason)
                                     : "stopped: a rank of the job was given SIGTERM or SIGINT, and its ranks stopped "
                                       "together after that step (exit code 128 + the signal) before node " +
                                           options_.node.name + "'s agent was asked to stop them";
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
    s.cpus.assign(job.cpus.begin(), job.cpus.end());
    s.memoryLimitBytes = job.limits.memoryBytes;
    s.stopAsked = job.stopRequested;
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

std::string JobManager::launcherPath(const std::string& jobId) const { return paths_.launcher(jobId); }

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

std::optional<RankHardware> JobManager::hardwareOf(const std::string& jobId, std::uint32_t rank) const {
  const auto it = jobs_.find(jobId);
  if (it == jobs_.end()) return std::nullopt;
  const Job& job = *it->second;
  NodeLaunch launch;
  launch.cpuCores = options_.node.cpuCores;
  launch.cpus = job.cpus;
  launch.cpusPerRank = std::max(1u, job.spec.cpusPerRank);
  for (const auto& r : job.ranks) launch.local.push_back(r.placement);
  for (const auto& p : launch.local) {
    if (p.rank == rank) return RankHardware{p.gpuIndex, rankThreads(launch, p)};
  }
  return std::nullopt;
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


Result<void> JobManager::restore() {
  if (!table_.exists()) return {};
  LOCKSTEP_TRY(table_.restore([this](std::unique_ptr<Job> job, bool everyRankFound) { adopt(std::move(job), everyRankFound); }));
  restartStores();
  poll();  // ranks that ended while the agent was away
  for (auto& [id, job] : jobs_) {
    if (!job->anyRankRunning()) ranks_.endInit(*job);  // its cgroup, with what the job left there
  }
  return {};
}

void JobManager::adopt(std::unique_ptr<Job> job, bool everyRankFound) {
  if (job->state == JobState::kStarting) startInterrupted(*job, everyRankFound);
  const std::string id = job->spec.jobId;
  if (jobs_.count(id)) return;
  order_.push_back(id);
  ++jobsVersion_;
  jobs_[id] = std::move(job);
}

// The agent stopped between recording the job and answering its start; if it had not spawned
// every rank (everyRankFound), the job cannot run, and fails.
void JobManager::startInterrupted(Job& job, bool everyRankFound) {
  job.startedUnixUs = unixMicrosNow();
  if (everyRankFound) {
    job.state = JobState::kRunning;
    emit_(event(job, JobEventKind::kStarted, "started on " + options_.node.name + "; the agent stopped before it "
                                             "answered, and adopted the ranks when it started again"));
    return;
  }
  job.state = JobState::kFailed;
  job.message = "the agent on " + options_.node.name + " stopped while starting the job, before every rank was started";
  emit_(event(job, JobEventKind::kFailed, job.message));
  ranks_.terminate(job, options_.defaultStopGrace);
}

void JobManager::restartStores() {
  for (auto& [id, job] : jobs_) {
    // Never an open store for a job that had a secret: one restored without it (a damaged or
    // older table) is not served, and its ranks fail on their own.
    if (job->anyRankRunning() && job->storePort != 0 && !job->storeSecret.empty()) {
      // The ranks' store clients reconnect to the same port and register again.
      auto store = rendezvous_.startStore(*job, static_cast<std::uint16_t>(job->storePort));
      if (store) job->store = std::move(store).value();
    }
  }
}

void JobManager::persist() {
  dropOldJobs();
  std::vector<const Job*> table;
  for (const auto& id : order_) table.push_back(jobs_.at(id).get());
  table_.save(table);
}

// Keeps the newest finished jobs only.
void JobManager::dropOldJobs() {
  while (order_.size() > options_.keepFinishedJobs) {
    const auto oldest = std::find_if(order_.begin(), order_.end(), [&](const std::string& id) {
      return !jobs_.at(id)->running() && !jobs_.at(id)->anyRankRunning() &&
             !(options_.stillNeeded && options_.stillNeeded(id));
    });
    if (oldest == order_.end()) break;
    std::error_code ec;
    fs::remove_all(jobs_.at(*oldest)->dir, ec);
    fs::remove(paths_.launcher(*oldest), ec);
    jobs_.erase(*oldest);
    order_.erase(oldest);
  }
}

bool JobManager::sentByJob(const std::string& jobId, pid_t pid, uid_t uid) const {
  const auto it = jobs_.find(jobId);
  return it != jobs_.end() && isJobProcess(*it->second, pid, uid);
}

}  // namespace lockstep::agent
