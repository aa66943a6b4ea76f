#include "lockstep/client/launch.h"

#include <algorithm>
#include <set>

namespace lockstep {

Result<JobSpec> placeJob(const std::vector<AgentClient*>& agents, const std::vector<std::uint32_t>& ranksPerAgent,
                         JobSpec spec, std::chrono::milliseconds timeout) {
  if (agents.empty() || agents.size() != ranksPerAgent.size()) {
    return invalidArgument("give one rank count per agent (" + std::to_string(agents.size()) + " agents, " +
                           std::to_string(ranksPerAgent.size()) + " counts)");
  }
  spec.ranks.clear();
  std::set<std::string> nodes;
  std::uint32_t rank = 0;
  for (std::size_t a = 0; a < agents.size(); ++a) {
    const NodeHello& node = agents[a]->hello();
    if (!nodes.insert(node.nodeName).second) {
      return invalidArgument("two agents call their node " + node.nodeName + ": start them with different --name");
    }
    std::vector<std::uint32_t> freeGpus;
    if (spec.backend == Backend::kCuda) {
      LOCKSTEP_ASSIGN_OR_RETURN(const auto jobs, agents[a]->listJobs(timeout));
      std::set<std::uint32_t> busy;
      for (const auto& job : jobs.jobs) {
        for (const auto& r : job.ranks) {
          if (r.state == JobState::kRunning && r.gpuIndex) busy.insert(*r.gpuIndex);
        }
      }
      for (const auto& gpu : node.gpus) {
        if (!busy.count(gpu.index)) freeGpus.push_back(gpu.index);
      }
      if (freeGpus.size() < ranksPerAgent[a]) {
        return Error{ErrorCode::kResourceExhausted, "node " + node.nodeName + " has " + std::to_string(freeGpus.size()) +
                                                        " free GPU(s) for " + std::to_string(ranksPerAgent[a]) + " ranks"};
      }
    }
    for (std::uint32_t local = 0; local < ranksPerAgent[a]; ++local) {
      RankPlacement p{rank++, node.nodeName, local, std::nullopt};
      if (spec.backend == Backend::kCuda) p.gpuIndex = freeGpus[local];
      spec.ranks.push_back(p);
    }
  }
  spec.worldSize = rank;
  if (spec.worldSize == 0) return invalidArgument("the job has no ranks");
  // Ranks on other nodes reach rank 0's node by the address this client used.
  spec.rendezvousHost = agents.size() > 1 ? agents.front()->address().host : "";
  spec.rendezvousPort = 0;
  return spec;
}

Result<void> launchJob(const std::vector<AgentClient*>& agents, JobSpec spec, std::chrono::milliseconds timeout) {
  std::vector<AgentClient*> order;  // rank 0's agent first
  for (const auto& p : spec.ranks) {
    for (auto* agent : agents) {
      const bool runsHere = agent->hello().nodeName == p.node;
      if (runsHere && std::find(order.begin(), order.end(), agent) == order.end()) order.push_back(agent);
    }
  }
  if (order.empty()) return invalidArgument("no agent runs a rank of job " + spec.jobId);
  std::vector<AgentClient*> started;
  auto undo = [&](const Error& why, AgentClient* where) -> Error {
    for (auto* agent : started) (void)agent->stopJob(spec.jobId, 0, timeout);
    return why.withContext("starting job " + spec.jobId + " on " + where->address().text() + " (" +
                           where->hello().nodeName + ")" +
                           (started.empty() ? "" : "; stopped the parts already started"));
  };
  for (auto* agent : order) {
    auto reply = agent->startJob(spec, timeout);
    if (!reply) return undo(reply.error(), agent);
    started.push_back(agent);
    if (agent == order.front() && spec.worldSize > 1) {
      spec.rendezvousPort = reply->rendezvousPort;
      if (spec.rendezvousHost.empty()) spec.rendezvousHost = agent->address().host;
    }
  }
  return {};
}

}  // namespace lockstep
