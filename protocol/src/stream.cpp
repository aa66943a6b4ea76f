#include "lockstep/protocol/stream.h"

#include <type_traits>
#include <variant>

#include "lockstep/protocol/records.h"

namespace lockstep {

void RecordSink::onEvent(const std::string&, const JobEvent&) {}
void RecordSink::onStep(const std::string&, const StepReport&) {}
void RecordSink::onProcess(const std::string&, const ProcessSample&) {}
void RecordSink::onGpu(const std::string&, const GpuSample&) {}
void RecordSink::onNet(const std::string&, const NetSample&) {}
void RecordSink::onPhase(const std::string&, const PhaseReport&) {}

void visitRecord(const StreamMessage& message, RecordSink& sink) { visitRecord(message.node, message.payload, sink); }

void visitRecord(const std::string& node, const StreamPayload& payload, RecordSink& sink) {
  std::visit(
      [&](const auto& record) {
        using R = std::decay_t<decltype(record)>;
        if constexpr (std::is_same_v<R, JobEvent>) sink.onEvent(node, record);
        if constexpr (std::is_same_v<R, StepReport>) sink.onStep(node, record);
        if constexpr (std::is_same_v<R, ProcessSample>) sink.onProcess(node, record);
        if constexpr (std::is_same_v<R, GpuSample>) sink.onGpu(node, record);
        if constexpr (std::is_same_v<R, NetSample>) sink.onNet(node, record);
        if constexpr (std::is_same_v<R, PhaseReport>) sink.onPhase(node, record);
      },
      payload);
}

const std::string& jobOf(const StreamPayload& payload) {
  static const std::string none;
  return std::visit(
      [](const auto& record) -> const std::string& {
        if constexpr (requires { record.jobId; }) {
          return record.jobId;
        } else {
          return none;
        }
      },
      payload);
}

bool isNodeRecord(const StreamPayload& payload) {
  return std::holds_alternative<GpuSample>(payload) || std::holds_alternative<NetSample>(payload);
}

std::int64_t timeOf(const StreamPayload& payload) {
  return std::visit([](const auto& record) { return record.timeUnixUs; }, payload);
}

StreamRouter::StreamRouter(Find job, Find node) : job_(std::move(job)), node_(std::move(node)) {}

void StreamRouter::read(const StreamMessage& message) { read(message.node, message.payload); }

void StreamRouter::read(const std::string& node, const StreamPayload& payload) {
  const std::string* lastJob = nullptr;
  RecordSink* sink = nullptr;
  readOne(node, payload, lastJob, sink);
}

void StreamRouter::read(std::span<const StreamMessage> messages) {
  const std::string* lastJob = nullptr;
  RecordSink* sink = nullptr;
  for (const auto& m : messages) readOne(m.node, m.payload, lastJob, sink);
}

void StreamRouter::readOne(const std::string& node, const StreamPayload& payload, const std::string*& lastJob,
                           RecordSink*& sink) {
  const std::string& job = jobOf(payload);
  if (!job.empty()) {
    if (lastJob == nullptr || *lastJob != job) {
      lastJob = &job;
      sink = job_ ? job_(job) : nullptr;
    }
    if (sink != nullptr) visitRecord(node, payload, *sink);
  }
  if (isNodeRecord(payload) && !node.empty() && node_) {
    if (RecordSink* own = node_(node)) visitRecord(node, payload, *own);
  }
}

bool JobEvent::operator==(const JobEvent& o) const { return records::same(*this, o); }
bool GpuSample::operator==(const GpuSample& o) const { return records::same(*this, o); }
bool ProcessSample::operator==(const ProcessSample& o) const { return records::same(*this, o); }
bool NetSample::operator==(const NetSample& o) const { return records::same(*this, o); }
bool StepReport::operator==(const StepReport& o) const { return records::same(*this, o); }
bool PhaseReport::operator==(const PhaseReport& o) const { return records::same(*this, o); }

}  // namespace lockstep
