#include "lockstep/kpi/stream.h"

namespace lockstep::kpi {

StreamReader::StreamReader(FindJob findJob, NodeSettings nodeSettings)
    : findJob_(std::move(findJob)), nodeSettings_(nodeSettings) {}

void StreamReader::read(const StreamMessage& message) { read(message.node, message.payload); }

void StreamReader::read(const std::string& node, const StreamPayload& payload) {
  const std::string* lastJob = nullptr;
  RecordSink* sink = nullptr;
  readOne(node, payload, lastJob, sink);
}

void StreamReader::read(std::span<const StreamMessage> messages) {
  const std::string* lastJob = nullptr;
  RecordSink* sink = nullptr;
  for (const auto& m : messages) readOne(m.node, m.payload, lastJob, sink);
}

void StreamReader::readOne(const std::string& node, const StreamPayload& payload, const std::string*& lastJob,
                           RecordSink*& sink) {
  const std::string& job = jobOf(payload);
  if (!job.empty()) {
    if (lastJob == nullptr || *lastJob != job) {
      lastJob = &job;
      sink = findJob_ ? findJob_(job) : nullptr;
    }
    if (sink != nullptr) visitRecord(node, payload, *sink);
  }
  if (isNodeRecord(payload) && !node.empty()) {
    auto it = nodes_.find(node);
    if (it == nodes_.end()) it = nodes_.try_emplace(node, node, nodeSettings_).first;
    visitRecord(node, payload, it->second);
    changed_.insert(node);
  }
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
