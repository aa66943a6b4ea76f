#pragma once
// lockstep-agent's settings: command-line flags, over an optional config file of `key = value`
// lines (STATE/agent.conf unless --config names another).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep::agent {

struct AgentConfig {
  std::string listen = "tcp://127.0.0.1:7700";
  std::string stateDir;             // default: $XDG_STATE_HOME/lockstep-agent
  std::string name;                 // default: the host name
  std::string trainer;              // default: lockstep-trainer beside this program
  std::string authorizedKeys;       // default: STATE/authorized_keys
  std::uint32_t sampleHz = 5;       // 1 to 20
  std::uint32_t stopGraceMs = 10000;
  std::uint32_t replayMessages = 600000;
  std::string nvmlLibrary = "libnvidia-ml.so.1";
  bool commandJobs = true;          // jobs may run their own program (docs/own-program.md)
  bool jobSandbox = true;           // ranks cannot see the state directory (docs/security.md)
  // With the sandbox: a /tmp and /dev/shm per job. Unset: yes, but for an agent a Slurm job
  // started (one user's, in an allocation whose /tmp is Slurm's to make private).
  std::optional<bool> jobPrivateTmp;
  bool privateTmp() const { return jobSandbox && jobPrivateTmp.value_or(slurmJob.empty()); }
  std::uint32_t pathCheckTimeoutMs = 5000;  // how long a job's paths may take to check (preflight.h)
  std::string metricsListen;        // HOST:PORT for Prometheus (metrics.h); empty: off
  std::string announce;             // a file to write `HOST:PORT KEY` to once listening (docs/cluster.md)
  std::string metricsTargets;       // a Prometheus file_sd file naming the metrics address, while it serves
  std::string slurmJob;             // the Slurm job this agent runs in: SIGTERM ends its jobs, saying why
  std::uint32_t exitWhenIdleS = 0;  // exit after this long with no job running; 0: never
  std::uint32_t keepJobs = 100;     // jobs the table keeps, the newest; older ended ones are dropped
  std::string alertRules;           // every job's alert rules, one per line (docs/alerts.md)
  std::vector<std::string> notify;  // every job's webhooks
  std::uint32_t webhookTimeoutMs = 5000;  // each POST's
  std::uint32_t webhookAttempts = 5;      // before an alert counts as not delivered
  std::uint64_t memPerRank = 0;     // a job's --mem-per-rank when it gives none; 0: unbounded (docs/fences.md)
  bool cpuOvercommit = false;       // ranks share cores when too few are free, instead of a refusal
  bool jobFences = true;            // no: jobs get none of docs/fences.md (to measure what they cost)
  // One core's fp32 GEMM peak, the ceiling of a CPU job's MFU (docs/kpis.md), GFLOP/s; unset:
  // measured once (lockstep-trainer --gemm-peak) and kept; cpuPeakOff: not known, MFU not shown.
  std::optional<double> cpuPeakGflops;
  bool cpuPeakOff = false;
  std::string configFile;
  bool printKey = false;
  bool help = false;
  bool version = false;

  std::string listenHost() const;  // HOST of tcp://HOST:PORT
  std::string authorizedKeysPath() const;
  std::string logPath() const;
};

Result<AgentConfig> parseAgentArgs(const std::vector<std::string>& args);
std::string agentUsage();

}  // namespace lockstep::agent
