#include "lockstep/kpi/stream.h"

namespace lockstep::kpi {

StreamReader::StreamReader(FindJob findJob, NodeSettings nodeSettings)
    : nodeSettings_(nodeSettings),
      router_(std::move(findJob), [this](const std::string& node) -> RecordSink* { return nodeTracker(node); }) {}

RecordSink* StreamReader::nodeTracker(const std::string& node) {
  auto it = nodes_.find(node);
  if (it == nodes_.end()) it = nodes_.try_emplace(node, node, nodeSettings_).first;
  changed_.insert(node);
  return &it->second;
}

const NodeTracker* StreamReader::node(std::string_view name) const {
  const auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::vector<std::string> StreamReader::takeChangedNodes() {
  std::vector<std::string> out(changed_.begin(), changed_.end());
  changed_.clear();
  return out;
}

}  // namespace lockstep::kpi
