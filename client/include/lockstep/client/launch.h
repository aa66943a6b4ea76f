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

// ranksPerAgent[i] ranks on agents[i]. Fills spec.ranks, worldSize and the rendezvous fields.
Result<JobSpec> placeJob(const std::vector<AgentClient*>& agents, const std::vector<std::uint32_t>& ranksPerAgent,
                         JobSpec spec, std::chrono::milliseconds timeout);

// Starts a placed job on every agent that runs a rank of it.
Result<void> launchJob(const std::vector<AgentClient*>& agents, JobSpec spec, std::chrono::milliseconds timeout);

}  // namespace lockstep
