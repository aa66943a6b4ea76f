#pragma once
// How the agent starts one rank: its program, arguments, environment and working directory, for
// the built-in trainer and for a job's own program (docs/own-program.md says what a rank gets).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jobs/job_cgroup.h"
#include "lockstep/common/identity.h"
#include "lockstep/common/process.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

// What every rank of a job on this node shares.
struct NodeLaunch {
  const JobSpec* spec = nullptr;
  std::vector<RankPlacement> local;  // this node's ranks
  std::string program;               // resolved by the preflight checks
  std::string masterAddr;
  std::uint32_t masterPort = 0;
  std::string reportEndpoint;  // LOCKSTEP_REPORT
  std::uint32_t cpuCores = 1;
  std::string metricsPath;  // the trainer's JSON lines
  std::string jobDir;       // a command job's working directory when it names none
  std::string pythonPath;   // where `import lockstep` finds the package ("" when not found)
  std::string storeSecret;  // the trainer's rendezvous store's (LOCKSTEP_STORE_SECRET)
  std::string hide;         // the state directory when ranks must not see it (SpawnOptions::sandbox)
  bool privateTmp = false;  // with `hide`: the job's own /tmp and /dev/shm
  const Identity* owner = nullptr;  // who the ranks run as
  SpawnOptions::Join join;          // with `hide`: the job's namespaces, which its init made
  int agentFd = -1;                 // the agent's binary (the job's init and the ranks' keepers)
  PartLimits limits;                // what the job's part may take (its cgroups, job_cgroup.h)
  bool fenced = true;               // false: its cgroup2 cgroup only (job-fences = no)
  std::vector<int> cgroupProcsFds;  // the job's cgroups, open, while its processes are spawned
  std::vector<int> cpus;            // the cores given to the job's ranks here, cpusPerRank each in turn
  std::uint32_t cpusPerRank = 1;
};

// What a rank computes on: its GPU, else as many cores as it has threads.
struct RankHardware {
  std::optional<std::uint32_t> gpuIndex;
  std::uint32_t cores = 1;
};

// The cores of `placement` among the job's (empty: the node's); a node over-committed on purpose
// gave the job fewer than its ranks ask for, and they share them.
std::vector<int> rankCpus(const NodeLaunch& node, const RankPlacement& placement);
// A rank's compute threads: its own cores, else the node's divided among its local ranks (as
// torchrun does: no thread pools that overrun the cores).
std::uint32_t rankThreads(const NodeLaunch& node, const RankPlacement& placement);

// A rank's progress record (LOCKSTEP_PROGRESS, lockstep/common/progress.h) and the file its
// Python stacks are written to (LOCKSTEP_STACKS), in its job's directory.
std::string rankProgressPath(const std::string& jobDir, std::uint32_t rank);
std::string rankStacksPath(const std::string& jobDir, std::uint32_t rank);

// The node's index among the job's nodes (rank 0's node is 0) and how many nodes there are,
// torchrun's GROUP_RANK and GROUP_WORLD_SIZE.
std::pair<std::uint32_t, std::uint32_t> nodeRankOf(const JobSpec& spec, const std::string& node);

// How `placement` starts, its output going to logPath.
SpawnOptions rankSpawnOptions(const NodeLaunch& node, const std::string& nodeName, const RankPlacement& placement,
                              const std::string& logPath);

// How the job's init starts (process.h, runJobInit): the first process of the job's namespaces
// on this node, a private mount namespace where the state directory is hidden but for the job's
// own directory and the report socket's, and a PID namespace of its own. The ranks join them.
SpawnOptions jobInitSpawnOptions(const NodeLaunch& node);

// Where the `lockstep` Python package is, beside this agent: the build tree's python/ or the
// installed lib/lockstep/python (a directory of its own: not dist-packages, whose Debian torch
// would shadow a virtual environment's); "" when neither holds it.
std::string findPythonPackage();

}  // namespace lockstep::agent
