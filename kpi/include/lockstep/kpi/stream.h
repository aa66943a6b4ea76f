#pragma once
// The one reader of the stream for everything that keeps KPIs (issue 31; docs/ARCHITECTURE.md,
// "The stream"): the agent's metrics page, the app's ingest, lockstepctl watch and the history's
// replay each hand it messages. Through protocol's StreamRouter, a job's record goes to that job's
// sink, which `findJob` finds or makes (or declines, with nullptr: not this reader's job); a node's
// record to that node's tracker, made on first sight; a GPU sample of a job to both.
// Not thread-safe: one owner at a time.

#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/kpi/node.h"

namespace lockstep::kpi {

class StreamReader {
 public:
  using FindJob = std::function<RecordSink*(const std::string& jobId)>;
  explicit StreamReader(FindJob findJob, NodeSettings nodeSettings = {});
  StreamReader(const StreamReader&) = delete;  // its router calls back into it
  StreamReader& operator=(const StreamReader&) = delete;

  void read(const StreamMessage& message) { router_.read(message); }
  void read(const std::string& node, const StreamPayload& payload) { router_.read(node, payload); }
  // A batch, in order. A job's sink is looked up once per run of its messages.
  void read(std::span<const StreamMessage> messages) { router_.read(messages); }

  const std::map<std::string, NodeTracker, NaturalLess>& nodes() const { return nodes_; }
  const NodeTracker* node(std::string_view name) const;
  // Moves the nodes' trackers out (the reader starts over without them).
  std::map<std::string, NodeTracker, NaturalLess> takeNodes() { return std::exchange(nodes_, {}); }
  // The nodes that got a record since the last call, in natural order.
  std::vector<std::string> takeChangedNodes();

 private:
  RecordSink* nodeTracker(const std::string& node);

  NodeSettings nodeSettings_;
  std::map<std::string, NodeTracker, NaturalLess> nodes_;
  std::set<std::string, NaturalLess> changed_;
  StreamRouter router_;  // last: it calls back into the members above
};

}  // namespace lockstep::kpi
