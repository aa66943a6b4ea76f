#pragma once
// Starting one job across several agents: the client is the job's "main controller" (brief, step
// 3). It numbers the ranks agent by agent, gives CUDA ranks free GPUs, makes rank 0's node the
// rendezvous host, starts rank 0's agent first (it hosts the store and returns its port), then the
// others; when any part fails to start, the parts already started are stopped.

#include <chrono>
#include <cstdint>
#include <vector>

#include "lockstep/client/agent_client.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

// What placing ranks on a node needs to know about it.
struct PlacementNode {
  AgentAddress agent;  // how this client reaches the node's agent
  std::string publicKey;  // the agent's, as this client pinned it
  std::string nodeName;
  std::vector<std::uint32_t> freeGpus;  // GPU indexes no running job holds
};

// `total` ranks over `nodes` nodes, as evenly as they go, the first ones taking the remainder.
std::vector<std::uint32_t> spreadRanks(std::uint32_t total, std::size_t nodes);

// ranks[i] ranks on nodes[i], numbered node by node. Fills spec.ranks, worldSize and the rendezvous
// fields; CUDA ranks get free GPUs. A first attempt also gets its agents (rank 0's first: it
// supervises the job); a restart keeps the first attempt's.
Result<JobSpec> placeJob(const std::vector<PlacementNode>& nodes, const std::vector<std::uint32_t>& ranks, JobSpec spec);

// The same, asking each agent which of its GPUs are free.
Result<JobSpec> placeJob(const std::vector<AgentClient*>& agents, const std::vector<std::uint32_t>& ranksPerAgent,
                         JobSpec spec, std::chrono::milliseconds timeout);

// The GPUs of `hello` that no running job in `jobs` holds.
std::vector<std::uint32_t> freeGpus(const NodeHello& hello, const std::vector<JobStatus>& jobs);
// The cores and memory of a node that no running job of `jobs` (its agent's list) holds, nor any
// job the agent counted when the client connected (hello): what a start may ask for there
// (docs/fences.md). The agent's own refusal is the last word.
struct FreeShare {
  std::uint32_t cores = 0;
  std::uint64_t memoryBytes = 0;
};
FreeShare freeShare(const NodeHello& hello, const std::vector<JobStatus>& jobs);

// The job's agents from where its ranks are, rank 0's first.
std::vector<JobAgent> jobAgents(const std::vector<PlacementNode>& nodes, const std::vector<std::uint32_t>& ranks);

// Starts a placed job on every agent that runs a rank of it.
Result<void> launchJob(const std::vector<AgentClient*>& agents, JobSpec spec, std::chrono::milliseconds timeout);

}  // namespace lockstep
