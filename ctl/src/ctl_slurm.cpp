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
  LOCKSTEP_ASSIGN_OR_RETURN(const CurveKeyPair keys, ownKeyPair(g));
  Connected out;
  for (const auto& a : announced) {
    LOCKSTEP_ASSIGN_OR_RETURN(const AgentAddress address, parseAgentAddress(a.address));
    LOCKSTEP_ASSIGN_OR_RETURN(auto client, AgentClient::connect(address, keys, a.publicKey, g.timeout));
    out.clients.push_back(std::move(client));
  }
  return out;
}

}  // namespace

Result<Connected> startSlurmAgents(const Globals& g, const SlurmStart& s, JobSpec& spec) {
  LOCKSTEP_TRY(ownKeyPair(g));  // before anything is submitted
  const slurm::AgentsLaunch launch{s.allocation, spec.jobId, besideThisProgram("lockstep-agent"),
                                   slurm::clientKeys(g.configDir), s.lingerS, s.logsDir};
  const auto say = [&](const std::string& what) {
    if (!g.json) {
      std::printf("%s\n", what.c_str());
      std::fflush(stdout);
    }
    return g_interrupted.load() == 0;
  };
  LOCKSTEP_ASSIGN_OR_RETURN(const auto agents, slurm::launchAgents(launch, g.timeout, std::chrono::seconds(s.waitS), say));
  spec.slurmJobId = agents.started.slurmJobId;
  spec.allocatedGpus = agents.allocatedGpus;
  auto connected = connectAnnounced(g, agents.announced);
  if (!connected) endSlurmJob(g, spec.jobId);  // agents that cannot be reached hold nodes for nothing
  return connected;
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
