#pragma once
// The jobs this agent runs: starting a job's local ranks, watching them, stopping them, and
// remembering all of it across agent restarts.
//
// Each rank is lockstep-trainer (the configured executable) or the job's own program (a command
// job), never a shell, in its own process group, with torchrun's environment, its GPUs in
// CUDA_VISIBLE_DEVICES, LOCKSTEP_REPORT pointing at the agent, and stdout/stderr in a log file the
// agent keeps bounded (rank_launch.h). A rank that fails stops the job's other ranks here (fail
// fast); what a rank leaves behind in its process group (DataLoader workers) is killed when it
// ends. The agent that runs rank 0 hosts the trainer's rendezvous store, or picks the free port a
// command job's own store (torch's c10d) listens on (job_rendezvous.h).
//
// JobManager keeps the book of jobs (what runs, whose it is, what happened to it: the events) and
// decides; its parts do the rest: the job table on disk, written on every change and read back by
// a restarted agent, which re-adopts the ranks still running (job_table.h), the ranks as
// processes, spawned, reaped and stopped (rank_processes.h), and where they meet (job_rendezvous.h).
//
// Not thread-safe: the agent's event loop owns it.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "jobs/job_paths.h"
#include "jobs/job_rendezvous.h"
#include "jobs/job_table.h"
#include "jobs/node_share.h"
#include "jobs/preflight.h"
#include "jobs/rank_launch.h"
#include "jobs/rank_processes.h"
#include "lockstep/common/fd.h"
#include "lockstep/common/identity.h"
#include "lockstep/common/process.h"
#include "lockstep/common/result.h"
#include "lockstep/common/store.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct NodeLaunch;
struct Job;  // job.h
struct Rank;

struct NodeFacts {
  std::string name;
  std::uint32_t cpuCores = 1;
  std::uint32_t gpuCount = 0;
  std::uint64_t memoryBytes = 0;
};

struct JobManagerOptions {
  NodeFacts node;
  std::string stateDir;
  std::string trainerPath;
  // What keeps each rank (a program whose main runs lockstep::runKeeper): the agent itself.
  std::string keeperPath = "/proc/self/exe";
  std::string listenHost;        // the interface the agent listens on: stores bind there too
  std::string reportEndpoint;    // what ranks get as LOCKSTEP_REPORT
  std::string pythonPath;        // where command jobs' ranks import the lockstep package from
  bool sandbox = true;           // ranks see the state directory as empty but for their job's
  bool privateTmp = true;        // with the sandbox: each job's /tmp and /dev/shm are its own
  NodeCgroups cgroups;           // where jobs' cgroups are made and what they fence (job_cgroup.h)
  std::uint64_t memPerRank = 0;  // a job's --mem-per-rank when it gives none; 0: unbounded
  bool cpuOvercommit = false;    // ranks share cores when too few are free, instead of being refused
  bool fences = true;            // false: jobs get no cores of their own and no limits
  std::chrono::milliseconds defaultStopGrace{10000};
  std::uint64_t logCapBytes = 8u << 20;  // per rank log file, plus one rotated copy
  std::size_t keepFinishedJobs = 100;
  // An ended job this says is still needed is kept however old: one whose supervision goes on here.
  std::function<bool(const std::string& jobId)> stillNeeded;
};

// A job's running ranks here, for the stall watch and the evidence taker (stalls/stall_watch.h, stalls/evidence.h).
struct WatchedRank {
  std::uint32_t rank = 0;
  pid_t pid = 0;    // the program, not its keeper
  pid_t group = 0;  // its process group (the keeper's pid): what a wrapper's children share
  std::string progressPath, stacksPath, logPath;
};
struct WatchedJob {
  std::string jobId;
  std::uint32_t stallAfterS = 0;
  OnStall onStall = OnStall::kReport;
  bool command = false;
  std::vector<WatchedRank> ranks;
};

// A running rank, for sampling.
struct TrackedRank {
  std::string jobId;
  std::uint32_t rank = 0;
  pid_t pid = 0;  // the program, not its keeper
};

class JobManager {
 public:
  using Emit = std::function<void(JobEvent)>;

  JobManager(JobManagerOptions options, Emit emit);
  ~JobManager();

  // Loads the persisted job table and re-adopts ranks that still run.
  Result<void> restore();

  // Starts this node's ranks of `spec`, whose paths the preflight checked (preflight.h).
  // storeSecret: the job's store's, from rank 0's agent; this agent makes one when it hosts the
  // store, and replies with it.
  // `owner`: who the ranks run as (owners.h).
  Result<StartJobReply> start(const JobSpec& spec, const CheckedPaths& checked, const Identity& owner,
                              const std::string& storeSecret = {});
  // The user a job here runs as; nullopt for a job this agent does not know.
  std::optional<std::string> ownerOf(const std::string& jobId) const;
  bool holds(const std::string& jobId) const { return jobs_.count(jobId) != 0; }
  // Where the key that launched a job here is kept, for its restarts: outside the job's directory,
  // which its user's ranks may write (removed with the job).
  std::string launcherPath(const std::string& jobId) const;
  // `reason`: what the job's "stopped" event says (default: stopped on request).
  Result<StopJobReply> stop(const std::string& jobId, std::uint32_t graceMs, std::string reason = {});
  std::vector<JobStatus> list() const;
  // Counts the jobs this manager took on (started or re-adopted): fetch replies carry it, so that a
  // client lists the jobs again when it changes.
  std::uint64_t jobsVersion() const { return jobsVersion_; }
  Result<LogsReply> logs(const std::string& jobId, std::uint32_t rank, std::uint32_t maxBytes) const;

  // A step report arrived for this job and rank (to judge ranks whose exit code is unknown).
  bool knowsRank(const std::string& jobId, std::uint32_t rank) const;
  void noteStep(const std::string& jobId, std::uint32_t rank, std::uint64_t step);
  // What a rank here computes on (its MFU's peak, stream/peaks.h); nullopt for a rank not here.
  std::optional<RankHardware> hardwareOf(const std::string& jobId, std::uint32_t rank) const;

  // Event loop: file descriptors that become readable when a rank exits.
  std::vector<int> exitFds() const;
  // Reaps ranks that exited, then acts on deadlines (kills after the grace period), trims logs.
  void poll();

  std::vector<TrackedRank> runningRanks() const;
  // The running jobs' running ranks; one job's (empty when it is not here or has none running).
  std::vector<WatchedJob> watched() const;
  WatchedJob watched(const std::string& jobId) const;
  // Fails a running job with `message` (a stall with --on-stall stop or restart) and stops its
  // ranks as a failed rank's would be.
  Result<void> fail(const std::string& jobId, std::string message);
  std::map<std::uint32_t, std::string> busyGpus() const;  // gpu index -> job id
  // The cores and memory no running job here holds (node_share.h).
  NodeFree free() const;
  // Whether the process `pid`, running as `uid` (the report socket's peer, as SO_PEERCRED gives
  // it), is one of the job's here: its PID namespace, cgroup and user (job_membership.h).
  bool sentByJob(const std::string& jobId, pid_t pid, uid_t uid) const;

 private:
  // Admitting a job: the attempt it replaces, its ranks here, that they fit.
  Result<void> replaceEnded(const JobSpec& spec, const Identity& owner);
  Result<std::vector<RankPlacement>> localRanks(const JobSpec& spec) const;
  Result<void> checkFits(const JobSpec& spec, const std::vector<RankPlacement>& local) const;
  NodeCapacity capacity() const;
  std::vector<Held> held() const;
  Result<void> fence(Job& job, const std::vector<RankPlacement>& local, NodeLaunch& launch) const;
  std::string fenceVerdict(Job& job, const ExitStatus& status, std::string how);
  void sayUnfenced(const Job& job);
  Result<void> makeJobDir(const Job& job, NodeLaunch& launch) const;
  Job& record(std::unique_ptr<Job> job, const std::vector<RankPlacement>& local);
  void forget(const std::string& jobId);
  StartJobReply announceStart(Job& job);
  // A job read back from the table (restore()).
  void adopt(std::unique_ptr<Job> job, bool everyRankFound);
  void startInterrupted(Job& job, bool everyRankFound);
  void restartStores();
  // What happens to a job as its ranks end.
  void rankEnded(Job& job, std::size_t index, std::optional<ExitStatus> status);
  void failFast(Job& job, const Rank& rank, std::string message, const JobEvent& exited);
  void finishIfDone(Job& job);
  void failJob(Job& job, std::string message, std::optional<std::uint32_t> rank, JobEvent base);
  JobEvent event(const Job& job, JobEventKind kind, std::string message) const;
  // The table on disk, after the oldest finished jobs beyond keepFinishedJobs are dropped.
  void persist();
  void dropOldJobs();

  JobManagerOptions options_;
  Emit emit_;
  JobPaths paths_;
  JobTableFile table_;
  RankProcesses ranks_;
  JobRendezvous rendezvous_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::vector<std::string> order_;  // job ids, oldest first
  std::uint64_t jobsVersion_ = 0;
  std::chrono::steady_clock::time_point nextTrim_{};
};

}  // namespace lockstep::agent
