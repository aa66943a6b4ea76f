#pragma once
// The one path step reports take from a rank to its agent: protobuf StreamMessages pushed on a
// ZeroMQ PUSH socket (the agent's report.sock). lockstep-trainer sends through it, and so does
// the C API in lockstep/reporter.h that native programs use.
//
// Training never waits for the agent: a report that does not fit the queue (100,000 reports) is
// dropped and counted, and an agent that went away only means reports queue, then drop. Close
// waits at most 2 s for queued reports. Threading: one thread at a time.

#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

class ReportSender {
 public:
  // Connects (ZeroMQ connects lazily: an absent agent is no error). InvalidArgument when the
  // endpoint is not a ZeroMQ endpoint.
  static Result<std::unique_ptr<ReportSender>> connect(const std::string& endpoint);
  ~ReportSender();
  ReportSender(const ReportSender&) = delete;
  ReportSender& operator=(const ReportSender&) = delete;

  // Queues the report as the next StreamMessage; false when it was dropped.
  bool send(const StepReport& report);
  // A rank's note for the job's events (JobEventKind::kNote), queued like a report.
  bool send(const JobEvent& note);
  // A phase the program named, closed (a checkpoint, an evaluation), queued like a report.
  bool send(const PhaseReport& phase);
  std::uint64_t dropped() const { return dropped_; }
  // Waits up to 2 s for queued reports to leave; returns how many were dropped overall.
  std::uint64_t close();

  struct Socket;

 private:
  explicit ReportSender(std::unique_ptr<Socket> socket);
  bool push(StreamPayload payload);
  std::unique_ptr<Socket> socket_;
  std::uint64_t seq_ = 0;
  std::uint64_t dropped_ = 0;
};

}  // namespace lockstep
