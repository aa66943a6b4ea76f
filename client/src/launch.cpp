#include "lockstep/client/launch.h"

#include <algorithm>
#include <set>

#include "lockstep/client/launcher.h"

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

FreeShare freeShare(const NodeHello& hello, const std::vector<JobStatus>& jobs) {
  std::set<std::uint32_t> held;
  std::uint64_t reserved = 0;
  for (const auto& job : jobs) {
    if (std::none_of(job.ranks.begin(), job.ranks.end(), [](const RankStatus& r) { return r.state == JobState::kRunning; })) {
      continue;
    }
    held.insert(job.cpus.begin(), job.cpus.end());
    reserved += job.memoryLimitBytes;
  }
  const auto cores = static_cast<std::uint32_t>(held.size());
  FreeShare free{hello.cpuCores > cores ? hello.cpuCores - cores : 0,
                 hello.memoryTotalBytes > reserved ? hello.memoryTotalBytes - reserved : 0};
  // A user's key lists only its own jobs: what the agent said was free when the client connected
  // counts everyone's (an agent from before fences said nothing).
  if (hello.freeMemoryBytes > 0) {
    free.cores = std::min(free.cores, hello.freeCores);
    free.memoryBytes = std::min(free.memoryBytes, hello.freeMemoryBytes);
  }
  return free;
}

std::vector<std::uint32_t> spreadRanks(std::uint32_t total, std::size_t nodes) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < nodes; ++i) out.push_back(static_cast<std::uint32_t>(total / nodes + (i < total % nodes ? 1 : 0)));
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
  if (spec.agents.empty()) spec.agents = jobAgents(nodes, ranks);
  // Ranks on other nodes reach rank 0's node by the address this client used.
  std::size_t first = 0;
  while (ranks[first] == 0) ++first;
  spec.rendezvousHost = nodes.size() > 1 ? nodes[first].agent.host : "";
  spec.rendezvousPort = 0;
  return spec;
}

std::vector<JobAgent> jobAgents(const std::vector<PlacementNode>& nodes, const std::vector<std::uint32_t>& ranks) {
  std::vector<JobAgent> agents;
  for (std::size_t a = 0; a < nodes.size() && a < ranks.size(); ++a) {
    if (ranks[a] > 0) agents.push_back({nodes[a].nodeName, nodes[a].agent.text(), nodes[a].publicKey});
  }
  return agents;
}

Result<JobSpec> placeJob(const std::vector<AgentClient*>& agents, const std::vector<std::uint32_t>& ranksPerAgent,
                         JobSpec spec, std::chrono::milliseconds timeout) {
  std::vector<PlacementNode> nodes;
  for (auto* agent : agents) {
    PlacementNode node{agent->address(), agent->agentKey(), agent->hello().nodeName, {}};
    if (spec.backend == Backend::kCuda) {
      LOCKSTEP_ASSIGN_OR_RETURN(const auto jobs, agent->listJobs(timeout));
      node.freeGpus = freeGpus(agent->hello(), jobs.jobs);
    }
    nodes.push_back(std::move(node));
  }
  return placeJob(nodes, ranksPerAgent, std::move(spec));
}

Result<void> launchJob(const std::vector<AgentClient*>& agents, JobSpec spec, std::chrono::milliseconds timeout) {
  const auto agentOf = [&](const std::string& node) -> AgentClient* {
    for (auto* agent : agents) {
      if (agent->hello().nodeName == node) return agent;
    }
    return nullptr;
  };
  Launcher launcher(std::move(spec));
  // One start at a time: the others' wait is this client's, not the agents'.
  for (auto starts = launcher.next(); !starts.empty(); starts = launcher.next()) {
    for (const auto& start : starts) {
      if (launcher.error()) {  // another part failed: this one is not sent
        launcher.failed(start.node, Error{ErrorCode::kCancelled, "not started"});
        continue;
      }
      AgentClient* agent = agentOf(start.node);
      auto reply = agent ? agent->startJob(start.spec, start.storeSecret, timeout)
                         : Result<StartJobReply>(Error{ErrorCode::kUnavailable, "no agent of node " + start.node});
      if (reply) {
        launcher.started(start.node, *reply);
      } else {
        launcher.failed(start.node, reply.error().withContext(agent ? agent->address().text() : start.node));
      }
    }
  }
  std::vector<AgentClient*> started;
  for (const auto& node : launcher.toStop()) {
    if (AgentClient* agent = agentOf(node)) started.push_back(agent);
  }
  (void)stopJobOnEach(started, launcher.spec().jobId, 0, timeout);
  if (launcher.error()) return *launcher.error();
  return {};
}

}  // namespace lockstep
