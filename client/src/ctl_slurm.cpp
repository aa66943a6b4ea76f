// lockstepctl on a Slurm cluster (docs/cluster.md): the agents of `start --slurm`, found again by
// the job's id for status, stop, logs and watch, and the Slurm job ended with the Lockstep one.

#include <cstdio>
#include <string>

#include "ctl.h"
#include "lockstep/client/slurm.h"
#include "lockstep/common/files.h"
#include "lockstep/net/keys.h"

namespace lockstep::ctl {
namespace {

Result<Connected> connectAnnounced(const Globals& g, const std::vector<slurm::Announced>& announced) {
  auto keys = loadKeyPair(g.configDir, "client");
  if (!keys) return Error{ErrorCode::kPermissionDenied, keys.error().message + " (run `lockstepctl keygen` first)"};
  Connected out;
  for (const auto& a : announced) {
    LOCKSTEP_ASSIGN_OR_RETURN(const AgentAddress address, parseAgentAddress(a.address));
    LOCKSTEP_ASSIGN_OR_RETURN(auto client, AgentClient::connect(address, *keys, a.publicKey, g.timeout));
    out.clients.push_back(std::move(client));
  }
  return out;
}

}  // namespace

Result<Connected> startSlurmAgents(const Globals& g, const SlurmStart& s, JobSpec& spec) {
  auto keys = loadKeyPair(g.configDir, "client");
  if (!keys) return Error{ErrorCode::kPermissionDenied, keys.error().message + " (run `lockstepctl keygen` first)"};
  slurm::AgentsLaunch launch{s.allocation, spec.jobId, besideThisProgram("lockstep-agent"), keys->publicKey, s.lingerS};
  LOCKSTEP_ASSIGN_OR_RETURN(const auto started, slurm::startAgents(launch, g.timeout));
  if (!g.json) {
    std::printf("%s Slurm job %s for job %s; waiting for its %u agent%s\n", started.submitted ? "submitted" : "in allocation,",
                started.slurmJobId.c_str(), spec.jobId.c_str(), s.allocation.nodes, s.allocation.nodes == 1 ? "" : "s");
    std::fflush(stdout);
  }
  std::string said;  // what was printed last: each change of state once
  const auto progress = [&](const slurm::JobInfo& info) {
    if (g.json || !info.pending() || info.describe() == said) return g_interrupted.load() == 0;
    said = info.describe();
    std::printf("%s\n", said.c_str());
    std::fflush(stdout);
    return g_interrupted.load() == 0;
  };
  auto agents = slurm::waitForAgents(spec.jobId, started.slurmJobId, s.allocation.nodes,
                                     std::chrono::seconds(s.waitS), progress);
  if (!agents) {
    // Nothing is left holding the allocation for a job that will never launch.
    if (started.submitted) (void)slurm::cancel(started.slurmJobId, g.timeout);
    return agents.error().withContext(started.submitted ? "cancelled it" : "");
  }
  spec.slurmJobId = started.slurmJobId;
  if (auto info = slurm::query(started.slurmJobId, g.timeout)) spec.allocatedGpus = info->gpus;
  if (spec.allocatedGpus == 0) spec.allocatedGpus = s.allocation.nodes * s.allocation.gpusPerNode;
  return connectAnnounced(g, *agents);
}

Result<Connected> connectAgentsFor(const Globals& g, const std::string& jobId) {
  auto started = g.agents.empty() ? slurm::startedFor(jobId) : Result<slurm::Started>(Error{ErrorCode::kNotFound, ""});
  if (!started) return connectAgents(g);
  const auto announced = slurm::announced(jobId);
  auto info = slurm::query(started->slurmJobId, g.timeout);
  if (announced.empty() || (info && info->ended())) {
    return Error{ErrorCode::kNotFound, "job " + jobId + " ran in " +
                                           (info ? info->describe() : "Slurm job " + started->slurmJobId) +
                                           ", whose agents are gone (`lockstepctl report " + jobId + " --out FILE" +
                                           "` has what was recorded)"};
  }
  return connectAnnounced(g, announced);
}

Error withSlurmState(const Globals& g, const std::string& slurmJobId, Error e) {
  if (slurmJobId.empty()) return e;
  auto info = slurm::query(slurmJobId, g.timeout);
  e.message += info ? "; " + info->describe() : "; Slurm job " + slurmJobId + ": " + info.error().message;
  return e;
}

void endSlurmJob(const Globals& g, const std::string& jobId) {
  auto cancelled = slurm::cancelSubmitted(jobId, g.timeout);
  if (!cancelled) {
    std::fprintf(stderr, "lockstepctl: could not cancel job %s's Slurm job: %s\n", jobId.c_str(),
                 cancelled.error().message.c_str());
  } else if (*cancelled && !g.json) {
    std::printf("cancelled Slurm job %s\n", (*cancelled)->c_str());
  }
}

}  // namespace lockstep::ctl
