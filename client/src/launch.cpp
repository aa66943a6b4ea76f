#include "lockstep/client/launch.h"

#include <algorithm>
#include <set>

namespace lockstep {

std::vector<std::uint32_t> freeGpus(const NodeHello& hello, const std::vector<JobStatus>& jobs) {
  std::set<std::uint32_t> busy;
  for (const auto& job : jobs) {
    for (const auto& r : job.ranks) {
      if (r.state == JobState::kRunning && r.gpuIndex) busy.insert(*r.gpuIndex);
    }
  }
  std::vector<std::uint32_t> out;
  for (const auto& gpu : hello.gpus) {
    if (!busy.count(gpu.index)) out.push_back(gpu.index);
  }
  return out;
}

Result<JobSpec> placeJob(const std::vector<PlacementNode>& nodes, const std::vector<std::uint32_t>& ranks, JobSpec spec) {
  if (nodes.empty() || nodes.size() != ranks.size()) {
    return invalidArgument("give one rank count per agent (" + std::to_string(nodes.size()) + " agents, " +
                           std::to_string(ranks.size()) + " counts)");
  }
  spec.ranks.clear();
  std::set<std::string> names;
  std::uint32_t rank = 0;
  for (std::size_t a = 0; a < nodes.size(); ++a) {
    const PlacementNode& node = nodes[a];
    if (!names.insert(node.nodeName).second) {
      return invalidArgument("two agents call their node " + node.nodeName + ": start them with different --name");
    }
    if (spec.backend == Backend::kCuda && node.freeGpus.size() < ranks[a]) {
      return Error{ErrorCode::kResourceExhausted, "node " + node.nodeName + " has " +
                                                      std::to_string(node.freeGpus.size()) + " free GPU(s) for " +
                                                      std::to_string(ranks[a]) + " ranks"};
    }
    for (std::uint32_t local = 0; local < ranks[a]; ++local) {
      RankPlacement p{rank++, node.nodeName, local, std::nullopt};
      if (spec.backend == Backend::kCuda) p.gpuIndex = node.freeGpus[local];
      spec.ranks.push_back(p);
    }
  }
  spec.worldSize = rank;
  if (spec.worldSize == 0) return invalidArgument("the job has no ranks");
  // Ranks on other nodes reach rank 0's node by the address this client used.
  spec.rendezvousHost = nodes.size() > 1 ? nodes.front().host : "";
  spec.rendezvousPort = 0;
  return spec;
}

Result<JobSpec> placeJob(const std::vector<AgentClient*>& agents, const std::vector<std::uint32_t>& ranksPerAgent,
                         JobSpec spec, std::chrono::milliseconds timeout) {
  std::vector<PlacementNode> nodes;
  for (auto* agent : agents) {
    PlacementNode node{agent->address().host, agent->hello().nodeName, {}};
    if (spec.backend == Backend::kCuda) {
      LOCKSTEP_ASSIGN_OR_RETURN(const auto jobs, agent->listJobs(timeout));
      node.freeGpus = freeGpus(agent->hello(), jobs.jobs);
    }
    nodes.push_back(std::move(node));
  }
  return placeJob(nodes, ranksPerAgent, std::move(spec));
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
    // An agent whose answer did not come in time may still start its part (it checks the job's
    // paths first): it is stopped too, which cancels a start still under way.
    if (why.code == ErrorCode::kTimeout || why.code == ErrorCode::kUnavailable) started.push_back(where);
    for (auto* agent : started) (void)agent->stopJob(spec.jobId, 0, timeout);
    return why.withContext("starting job " + spec.jobId + " on " + where->address().text() + " (" +
                           where->hello().nodeName + ")" +
                           (started.empty() ? "" : "; stopped the parts already started"));
  };
  std::string storeSecret;  // rank 0's agent's store's, which the other agents' ranks need
  for (auto* agent : order) {
    auto reply = agent->startJob(spec, storeSecret, timeout);
    if (!reply) return undo(reply.error(), agent);
    started.push_back(agent);
    if (agent == order.front() && spec.worldSize > 1) {
      spec.rendezvousPort = reply->rendezvousPort;
      storeSecret = reply->storeSecret;
      if (spec.rendezvousHost.empty()) spec.rendezvousHost = agent->address().host;
    }
  }
  return {};
}

}  // namespace lockstep
