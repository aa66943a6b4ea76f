#pragma once
// When the agent comes and goes (docs/cluster.md): it announces where it listens once it does;
// under Slurm, SIGTERM means the allocation is ending, and the agent stops its jobs with Slurm's
// reason and serves until that reached a client; with --exit-when-idle-s it exits once no job ran
// for that long. Event loop only.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "base/log.h"
#include "jobs/jobs.h"
#include "lockstep/common/result.h"
#include "loop/config.h"

namespace lockstep::agent {

class Lifecycle {
 public:
  Lifecycle(const AgentConfig& config, JobManager& jobs, Log& log);

  // Writes `HOST:PORT KEY` to --announce's file: `listen` as bound, this agent's public key.
  Result<void> announce(const std::string& listen, const std::string& publicKey) const;
  // Asked once SIGTERM came: whether to serve on (under Slurm, until the jobs ended and, for a few
  // seconds, until a client fetched the stream's end: `unfetched` says it has not yet).
  bool stillEnding(bool unfetched);
  // Whether no job ran for --exit-when-idle-s; `starting`: a start waits for its checks.
  bool idleTooLong(bool starting);
  // Nobody is there any more: the announcement goes.
  void leave() const;

 private:
  std::string slurmEndReason() const;

  const AgentConfig& config_;
  JobManager& jobs_;
  Log& log_;
  std::optional<std::chrono::steady_clock::time_point> endingSince_, endedAt_, idleSince_;
  bool hadJob_ = false;
};

}  // namespace lockstep::agent
