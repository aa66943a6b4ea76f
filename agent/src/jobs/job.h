#pragma once
// A job's part on this node as the job manager (jobs.h) holds it: its spec, owner, ranks, store,
// init and cgroup. The manager keeps its record and events; its rank processes (rank_processes.h)
// spawns, reaps and stops its ranks; its job table (job_table.h) keeps it on disk and re-adopts
// its ranks. Private to jobs/.

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "jobs/job_cgroup.h"
#include "lockstep/common/fd.h"
#include "lockstep/common/identity.h"
#include "lockstep/common/process.h"
#include "lockstep/common/store.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct Rank {
  RankPlacement placement;
  pid_t pid = -1;  // the rank's keeper: the process group's leader, what the agent waits for
  pid_t programPid = -1;
  std::uint64_t startTicks = 0;
  bool child = true;  // false once adopted by a restarted agent: its exit status is not ours to read
  UniqueFd pidfd;
  JobState state = JobState::kRunning;
  std::optional<ExitStatus> exit;
  bool exitUnknown = false;
  std::string logPath;
  std::uint64_t lastStep = 0;
};

struct Job {
  JobSpec spec;
  Identity owner;  // who its ranks run as
  JobState state = JobState::kStarting;
  std::vector<Rank> ranks;
  std::int64_t startedUnixUs = 0;
  std::int64_t endedUnixUs = 0;
  std::string message;
  std::string dir;
  std::unique_ptr<StoreServer> store;
  std::uint32_t storePort = 0;   // the trainer's rendezvous store, when rank 0 runs here
  std::string storeSecret;       // its secret (docs/security.md), which the job's ranks get
  std::uint32_t masterPort = 0;  // a command job's MASTER_PORT, when rank 0 runs here
  bool stopRequested = false;
  std::string stopReason;  // empty: stopped on request
  std::optional<std::chrono::steady_clock::time_point> killAt;
  KeptProcess init;  // the job's init on this node (rank_launch.h), while this agent runs it
  UniqueFd initPidfd;
  PartCgroups cgroups;    // its cgroups (job_cgroup.h), while it has them
  PartLimits limits;      // what its part here may take (the memory and processes of all its ranks here)
  std::vector<int> cpus;  // the cores its ranks here were given
  std::uint64_t oomKillsSaid = 0, forksRefusedSaid = 0;  // the kernel's counts its events told

  bool running() const { return state == JobState::kStarting || state == JobState::kRunning; }
  bool anyRankRunning() const {
    return std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.state == JobState::kRunning; });
  }
};

}  // namespace lockstep::agent
