#include "jobs/node_share.h"

#include <algorithm>
#include <map>

#include "lockstep/present/present.h"

namespace lockstep::agent {
namespace {

// How many running parts hold each of the node's cores.
std::map<int, int> holders(const NodeCapacity& node, const std::vector<Held>& held) {
  std::map<int, int> uses;
  for (int cpu : node.cpus) uses[cpu] = 0;
  for (const Held& part : held) {
    for (int cpu : part.cpus) {
      if (auto it = uses.find(cpu); it != uses.end()) ++it->second;
    }
  }
  return uses;
}

std::uint64_t memoryHeld(const std::vector<Held>& held) {
  std::uint64_t bytes = 0;
  for (const Held& part : held) bytes += part.memoryBytes;
  return bytes;
}

std::string refusal(const NodeCapacity& node, const NodeFree& free, const Ask& ask) {
  return node.node + " has " + std::to_string(free.cores) + " of " + std::to_string(node.cpus.size()) + " cores and " +
         present::bytes(static_cast<double>(free.memoryBytes)) + " of " +
         present::bytes(static_cast<double>(node.memoryBytes)) + " free; the job asks for " + std::to_string(ask.cores) +
         " cores" + (ask.memoryBytes > 0 ? " and " + present::bytes(static_cast<double>(ask.memoryBytes)) : "") +
         ": place fewer ranks here, ask for less (--cpus-per-rank, --mem-per-rank), or wait for a job to end";
}

}  // namespace

NodeFree freeOf(const NodeCapacity& node, const std::vector<Held>& held) {
  NodeFree free;
  for (const auto& [cpu, uses] : holders(node, held)) free.cores += uses == 0 ? 1 : 0;
  const std::uint64_t reserved = memoryHeld(held);
  free.memoryBytes = reserved < node.memoryBytes ? node.memoryBytes - reserved : 0;
  return free;
}

Result<std::vector<int>> coresFor(const NodeCapacity& node, const std::vector<Held>& held, const Ask& ask) {
  const NodeFree free = freeOf(node, held);
  const bool coresShort = ask.cores > free.cores && !node.overcommit;
  if (coresShort || ask.memoryBytes > free.memoryBytes || node.cpus.empty()) {
    return Error{ErrorCode::kResourceExhausted, refusal(node, free, ask)};
  }
  // The least-held cores first (free ones, when there are enough), in the node's order.
  std::vector<std::pair<int, int>> byUse;  // (holders, core)
  for (const auto& [cpu, uses] : holders(node, held)) byUse.emplace_back(uses, cpu);
  std::stable_sort(byUse.begin(), byUse.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<int> cores;
  for (std::size_t i = 0; i < std::min<std::size_t>(ask.cores, byUse.size()); ++i) cores.push_back(byUse[i].second);
  std::sort(cores.begin(), cores.end());
  return cores;
}

std::uint64_t memPerRank(const JobSpec& spec, std::uint64_t nodeMemPerRank) {
  return spec.memPerRank > 0 ? spec.memPerRank : nodeMemPerRank;
}

PartLimits partLimits(const JobSpec& spec, const std::vector<RankPlacement>& local, std::uint64_t nodeMemPerRank) {
  PartLimits limits;
  const std::uint64_t ranks = local.size();
  limits.memoryBytes = memPerRank(spec, nodeMemPerRank) * ranks;
  const std::uint32_t processes = spec.maxProcessesPerRank > 0 ? spec.maxProcessesPerRank : JobSpec::kDefaultProcessesPerRank;
  limits.processes = processes * ranks + partOwnProcesses(ranks);
  // Its GPUs' device nodes (their minors are NVML's indexes, as CUDA_DEVICE_ORDER=PCI_BUS_ID
  // numbers them), nvidia-modeset and nvidiactl; nvidia-uvm has a major of its own, left open.
  limits.devices.allowedMinors = {254, 255};
  for (const auto& p : local) {
    if (p.gpuIndex) limits.devices.allowedMinors.push_back(*p.gpuIndex);
  }
  return limits;
}

}  // namespace lockstep::agent
