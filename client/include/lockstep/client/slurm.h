#pragma once
// Lockstep on a Slurm cluster (docs/cluster.md): a job's agents are started by Slurm, one per
// node of its allocation, in the submitting user's name, and found through files in that user's
// home directory, which the cluster's nodes share.
//
// Each Lockstep job started this way has a directory, ~/.lockstep/slurm/JOB (mode 700), while it
// runs: the batch script, Slurm's output, the Slurm job id (`slurm-job`), the client key the
// agents let in (`authorized_keys`), and, per node, the agent's state directory (`node-N/`) and
// what it announced (`node-N.agent`: `HOST:PORT PUBLIC-KEY`). Only the user can write there, so a
// key read from it is as trustworthy as one the user pinned by hand. When the job ends, the
// directory goes (its logs kept only where the user asked, AgentsLaunch::logsDir).
//
// The tools are Slurm's own (sbatch, srun, scontrol, scancel), run on this host: the login host.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep::slurm {

// What `lockstepctl start --slurm` asks Slurm for.
struct Allocation {
  std::uint32_t nodes = 1;
  std::uint32_t gpusPerNode = 0;
  std::string time;       // Slurm's --time (MINUTES, HH:MM:SS, D-HH:MM); empty: the partition's
  std::string partition;  // empty: the cluster's default
  std::string account;
  std::uint32_t cpusPerNode = 0;  // 0: whole nodes (--exclusive), the ranks' data loading wants the CPUs
};

// A Slurm job as `scontrol show job` tells it.
struct JobInfo {
  std::string id;
  std::string state;   // PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT, NODE_FAIL, ...
  std::string reason;  // Slurm's Reason (why pending, or why it ended); "None" when it gives none
  std::string exitCode;
  std::uint32_t nodes = 0;
  std::uint32_t gpus = 0;  // allocated (TRES gres/gpu)
  bool ended() const;
  bool ending() const { return state == "COMPLETING"; }
  bool pending() const { return state == "PENDING"; }
  // The state it ended in; for a job Slurm is ending (COMPLETING, as when its processes get
  // SIGTERM), the one its reason foretells: TIMEOUT for TimeLimit, CANCELLED for none (scancel).
  std::string endState() const;
  // "Slurm job 42: TIMEOUT (TimeLimit)"
  std::string describe() const;
};

// Reads one line of `scontrol show job -o` (Key=Value fields).
Result<JobInfo> parseJobInfo(const std::string& line);
Result<JobInfo> query(const std::string& slurmJobId, std::chrono::milliseconds timeout);
Result<void> cancel(const std::string& slurmJobId, std::chrono::milliseconds timeout);

// ~/.lockstep/slurm/JOB ($HOME's), while the job runs: when it ends, the batch script removes it
// and keeps the line naming its Slurm job in ~/.lockstep/slurm/ended/JOB (startedFor reads either).
std::string jobDirectory(const std::string& lockstepJobId);
std::string endedDirectory();
// ~/.lockstep/metrics: each agent names its metrics address there for Prometheus' file-based
// service discovery (JOB-node-N.json, removed when the agent exits; docs/cluster.md).
std::string metricsTargetsDirectory();

struct AgentsLaunch {
  Allocation allocation;
  std::string lockstepJobId;
  std::string agentProgram;     // lockstep-agent, on a path every node sees
  std::vector<std::string> clientPublicKeys;  // the keys the agents let in (clientKeys)
  std::uint32_t lingerS = 30;   // how long an agent waits, idle, for a job (or after it) before it exits
  // Where Slurm's output and, once the job ended, the ranks' logs are kept (absolute); empty: in
  // the job's directory, which goes when the job ends.
  std::string logsDir;
};

// What was started and how: inside an allocation (SLURM_JOB_ID set, as under salloc) the agents
// run as a step of it, which stopping the job does not cancel; otherwise a batch job of their own.
struct Started {
  std::string slurmJobId;
  bool submitted = false;  // a batch job of ours: stopping the Lockstep job cancels it
  int stepPid = -1;        // inside an allocation: the srun running the agents, a child of this process
  std::string outputDir;   // where Slurm's and srun's output go; empty: the job's directory
};

// The user's client keys in configDir, the app's and lockstepctl's, those that exist: a job
// started from either can be watched and stopped from the other.
std::vector<std::string> clientKeys(const std::string& configDir);

// Creates the job's directory and starts the agents: `sbatch`, or `srun` in the allocation.
Result<Started> startAgents(const AgentsLaunch& launch, std::chrono::milliseconds timeout);
// The Slurm job a Lockstep job's agents run in, as startAgents recorded it; kNotFound for a job
// not started through Slurm.
Result<Started> startedFor(const std::string& lockstepJobId);

struct Announced {
  std::string address;  // HOST:PORT
  std::string publicKey;
};
// The agents of the job's directory that announced themselves so far, by node number.
std::vector<Announced> announced(const std::string& lockstepJobId);
// Waits until `nodes` agents announced themselves; fails when the Slurm job (or the srun step that
// starts them) ends first (with its state and the end of its output) or the timeout passes (with why Slurm still holds it).
// `progress` hears what Slurm says of the job every couple of seconds; it returns false to give up
// (kCancelled).
Result<std::vector<Announced>> waitForAgents(const std::string& lockstepJobId, const Started& started,
                                             std::uint32_t nodes, std::chrono::milliseconds timeout,
                                             const std::function<bool(const JobInfo&)>& progress);
// startAgents, then waitForAgents, as lockstepctl and the app both do: `say` hears what happens
// (submitted, then each change of Slurm's state) and returns false to give up. A batch job whose
// agents never came is cancelled, so that nothing holds nodes for a job that will not run.
struct Agents {
  Started started;
  std::vector<Announced> announced;
  std::uint32_t allocatedGpus = 0;  // Slurm's count, or nodes × GPUs per node when it gives none
};
Result<Agents> launchAgents(const AgentsLaunch& launch, std::chrono::milliseconds toolTimeout,
                            std::chrono::milliseconds waitTimeout, const std::function<bool(const std::string&)>& say);
// After a Lockstep job was stopped: cancels the batch job started for it (never an allocation of
// the user's own). Returns the Slurm job id it cancelled, or nothing for a job not submitted so.
Result<std::optional<std::string>> cancelSubmitted(const std::string& lockstepJobId, std::chrono::milliseconds timeout);

}  // namespace lockstep::slurm
