#include "FanIn.h"

#include <unordered_set>

namespace lockstep::app {

bool FanInRule::fannedIn(const JobSpec& spec) const {
  if (spec.agents.empty()) return false;  // no agent supervises it: nobody makes its frames
  if (spec.ranks.size() <= nodesOver) return false;  // cannot span more nodes than it has ranks
  std::unordered_set<std::string_view> nodes;
  for (const auto& placement : spec.ranks) {
    if (nodes.insert(placement.node).second && nodes.size() > nodesOver) return true;
  }
  return false;
}

bool FanInBook::decide(const JobSpec& spec) {
  std::lock_guard lock(mutex_);
  const auto [it, made] = decisions_.try_emplace(spec.jobId, false);
  if (made) it->second = rule_.fannedIn(spec);
  return it->second;
}

std::optional<bool> FanInBook::decided(const std::string& jobId) const {
  std::lock_guard lock(mutex_);
  const auto it = decisions_.find(jobId);
  return it == decisions_.end() ? std::nullopt : std::optional<bool>(it->second);
}

}  // namespace lockstep::app
