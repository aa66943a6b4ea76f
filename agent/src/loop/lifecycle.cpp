#include "loop/lifecycle.h"

#include <unistd.h>

#include <algorithm>

#include "base/host.h"
#include "lockstep/client/slurm.h"
#include "lockstep/common/files.h"

namespace lockstep::agent {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kFirstJobWait{300};  // --exit-when-idle-s before the first job

}  // namespace

Lifecycle::Lifecycle(const AgentConfig& config, JobManager& jobs, Log& log) : config_(config), jobs_(jobs), log_(log) {}

// Where a client finds this agent when it cannot be told in advance (a Slurm job's agents,
// docs/cluster.md): the address it listens on, with this node's host name for a wildcard, and its
// public key, written once it listens.
Result<void> Lifecycle::announce(const std::string& listen, const std::string& publicKey) const {
  if (config_.announce.empty()) return {};
  const std::string port = listen.substr(listen.rfind(':') + 1);
  const std::string host = config_.listenHost();
  const bool wildcard = host == "0.0.0.0" || host == "*" || host == "[::]";
  const std::string address = (wildcard ? hostName() : host) + ":" + port;
  if (auto written = writeFileAtomic(config_.announce, address + " " + publicKey + "\n", 0600); !written) {
    return written.error().withContext("--announce");
  }
  log_.info("announced " + address + " in " + config_.announce);
  return {};
}

// Under Slurm, SIGTERM means the allocation is ending (scancel, its time limit, preemption): the
// agent stops its jobs with Slurm's reason and keeps serving until they ended and a client has
// fetched the last of the stream (or a few seconds passed), so that the reason reaches the
// dashboard and the history. Elsewhere it exits at once and leaves its jobs running.
bool Lifecycle::stillEnding(bool unfetched) {
  if (config_.slurmJob.empty()) return false;
  const auto now = Clock::now();
  if (!endingSince_) {
    endingSince_ = now;
    const std::string why = slurmEndReason();
    log_.info(why);
    for (const auto& job : jobs_.list()) {
      if (!jobStateEnded(job.state)) (void)jobs_.stop(job.spec.jobId, 2000, why);
    }
  }
  if (now - *endingSince_ > std::chrono::seconds(20)) return false;
  if (!jobs_.runningRanks().empty()) return true;
  // A second for a following client to list the ended jobs, three at most for one to fetch the rest.
  if (!endedAt_) endedAt_ = now;
  const auto since = now - *endedAt_;
  return since < std::chrono::seconds(1) || (unfetched && since < std::chrono::seconds(3));
}

std::string Lifecycle::slurmEndReason() const {
  auto info = slurm::query(config_.slurmJob, std::chrono::milliseconds(3000));
  if (!info)
    return "Slurm job " + config_.slurmJob + " is ending (the agent got SIGTERM; " + info.error().message + ")";
  if (info->ended() || info->ending()) return "ended by " + info->describe();
  return "the agent was told to stop (SIGTERM) while " + info->describe() + " runs";
}

// A job counts as work until it ended and its supervision (restarts) did too. Before its first
// job an agent waits at least kFirstJobWait: its client may still be waiting for the
// allocation's other nodes to start.
bool Lifecycle::idleTooLong(bool starting) {
  if (config_.exitWhenIdleS == 0) return false;
  const auto jobs = jobs_.list();
  const bool busy = starting || std::any_of(jobs.begin(), jobs.end(), [](const JobStatus& j) {
                      return !jobStateEnded(j.state) || j.supervision.state == SupervisionState::kFollowing ||
                             j.supervision.state == SupervisionState::kRestarting;
                    });
  hadJob_ = hadJob_ || !jobs.empty() || busy;
  if (busy) {
    idleSince_.reset();
    return false;
  }
  if (!idleSince_) idleSince_ = Clock::now();
  const auto limit = std::chrono::seconds(config_.exitWhenIdleS);
  if (Clock::now() - *idleSince_ < (hadJob_ ? limit : std::max<std::chrono::seconds>(limit, kFirstJobWait)))
    return false;
  log_.info("no job ran for " + std::to_string(config_.exitWhenIdleS) + " s: exiting (--exit-when-idle-s)");
  return true;
}

void Lifecycle::leave() const {
  if (!config_.announce.empty()) ::unlink(config_.announce.c_str());
  if (config_.slurmJob.empty())
    log_.info("stopping; running jobs keep running and are adopted when the agent starts again");
}

}  // namespace lockstep::agent
