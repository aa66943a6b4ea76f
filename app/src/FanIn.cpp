#include "FanIn.h"

#include <unordered_set>

namespace lockstep::app {

bool FanInRule::fannedIn(const JobSpec& spec) const {
  if (spec.ranks.size() <= nodesOver) return false;  // cannot span more nodes than it has ranks
  std::unordered_set<std::string_view> nodes;
  for (const auto& placement : spec.ranks) {
    if (nodes.insert(placement.node).second && nodes.size() > nodesOver) return true;
  }
  return false;
}

}  // namespace lockstep::app
