#pragma once
// A job's ranks on this node as processes: spawned with their cgroup and the job's init (every
// rank or none), reaped when they exit, stopped with SIGTERM and then SIGKILL after a grace
// period; their log files kept bounded. Each rank runs under a keeper (lockstep/common/process.h)
// that leads its process group and records how it ended; what a rank leaves in its group is
// killed when it ends. The job manager (jobs.h) owns it and decides what an exit means for the
// job. Not thread-safe: the agent's event loop owns it. Private to jobs/.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jobs/job_paths.h"
#include "lockstep/common/fd.h"
#include "lockstep/common/process.h"
#include "lockstep/common/result.h"

namespace lockstep::agent {

struct Job;  // job.h
struct Rank;
struct NodeLaunch;  // rank_launch.h

// How a rank ended: nullopt status when it is unknown (an adopted rank whose keeper left no record).
struct RankEnd {
  std::optional<ExitStatus> status;
};

class RankProcesses {
 public:
  // keeperPath: what keeps each rank, the agent itself (JobManagerOptions::keeperPath).
  RankProcesses(JobPaths paths, std::string keeperPath, std::uint64_t logCapBytes);
  ~RankProcesses();

  // Spawns every rank of `job` as `launch` says (in the job's cgroup and init, where it has
  // them), or none: a rank that cannot start takes the ones before it down.
  Result<void> spawn(Job& job, NodeLaunch& launch);
  // Ends the job's init and cgroup, and with them whatever the job left running.
  void endInit(Job& job);
  // A job the manager forgets while ranks of it still run (a restart replacing an attempt still
  // being stopped): they are killed with its cgroups, and reaped here once they end.
  void abandon(Job& job);
  // `rank`, running, reaped if it ended (and what it left in its process group killed); nullopt
  // while it runs.
  std::optional<RankEnd> reap(const Job& job, Rank& rank);
  // Sends `signal` to the process group of each running rank.
  void signal(Job& job, int signal);
  // SIGTERM to the running ranks now, SIGKILL once `grace` has passed (killIfDue).
  void terminate(Job& job, std::chrono::milliseconds grace);
  void killIfDue(Job& job);
  // Reaps ended jobs' init keepers and removes their cgroups once empty.
  void tidy();
  // Keeps each running rank's log under the cap (one rotated copy beside it).
  void trimLogs(const Job& job) const;

 private:
  Result<void> spawnEachRank(Job& job, NodeLaunch& launch);
  Result<void> spawnRank(Job& job, Rank& rank, NodeLaunch& launch);
  Result<std::vector<UniqueFd>> startInit(Job& job, NodeLaunch& launch);
  std::optional<RankEnd> reapChild(const Job& job, Rank& rank);
  std::optional<RankEnd> reapAdopted(const Job& job, Rank& rank);
  std::optional<ExitStatus> exitRecorded(const Job& job, std::uint32_t rank) const;

  JobPaths paths_;
  std::string keeperPath_;
  std::uint64_t logCapBytes_;
  UniqueFd agentFd_;  // keeperPath_, run by descriptor where it may not be visible
  std::vector<pid_t> initKeepers_;  // keepers to reap once they end: jobs' inits, abandoned ranks
  std::vector<PartCgroups> deadCgroups_;  // ended jobs' cgroups, removed once empty
};

}  // namespace lockstep::agent
