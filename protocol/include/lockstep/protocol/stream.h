#pragma once
// The one reader of the agents' stream (issue 31; docs/ARCHITECTURE.md, "The stream"). A streamed
// record is a job's (its events, step reports, process samples, and the samples of the GPUs its
// ranks hold) or a node's (its network interfaces, and every GPU sample, held or idle: a held
// GPU's sample is both). Everything that consumes the stream — the agent's metrics page, the
// app's ingest, lockstepctl watch, the history's recorder and replay, the KPI trackers — tells
// records apart here and nowhere else: a new kind of record gets its call in RecordSink and its
// line in visitRecord(), and its consumers override the call.

#include <functional>
#include <span>
#include <string>

#include "lockstep/protocol/types.h"

namespace lockstep {

// What a consumer of the stream implements: one call per kind of record, each with the node (the
// agent's name) whose stream carried it. Unimplemented calls ignore the record.
class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual void onEvent(const std::string& node, const JobEvent& event);
  virtual void onStep(const std::string& node, const StepReport& report);
  virtual void onProcess(const std::string& node, const ProcessSample& sample);
  virtual void onGpu(const std::string& node, const GpuSample& sample);
  virtual void onNet(const std::string& node, const NetSample& sample);
  virtual void onPhase(const std::string& node, const PhaseReport& phase);
};

// Calls the sink's call for the message's kind of record.
void visitRecord(const StreamMessage& message, RecordSink& sink);
// The same for a record `node` carried (the agent reads its own before they are numbered).
void visitRecord(const std::string& node, const StreamPayload& payload, RecordSink& sink);

// Whether the node it came from keeps it too (every GPU sample, the network); jobOf() and timeOf()
// are in types.h.
bool isNodeRecord(const StreamPayload& payload);

// The one rule of who keeps a record: a job's record goes to that job's sink, a node's to that
// node's (the node whose stream carried it); a held GPU's sample to both. `job` and `node` find (or
// make) the sink for a key, or decline with nullptr: the record is not this reader's to keep.
// Within a batch, a job's sink is looked up once per run of its messages. Every consumer of the
// stream reads it through one of these: kpi::StreamReader (the KPI trackers) and the history's
// writer.
class StreamRouter {
 public:
  using Find = std::function<RecordSink*(const std::string& key)>;
  StreamRouter(Find job, Find node);

  void read(const StreamMessage& message);
  void read(const std::string& node, const StreamPayload& payload);
  void read(std::span<const StreamMessage> messages);

 private:
  void readOne(const std::string& node, const StreamPayload& payload, const std::string*& lastJob, RecordSink*& sink);
  Find job_, node_;
};

}  // namespace lockstep
