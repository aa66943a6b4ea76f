#pragma once
// Where a rank's step reports go: JSON lines (a file shared by all local ranks, or stdout) and,
// when LOCKSTEP_REPORT names a ZeroMQ endpoint, protobuf StreamMessages pushed to it.
// Training never waits for the endpoint: reports beyond its queue are counted as dropped.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::trainer {

class MetricsSink {
 public:
  // path "" writes to stdout. The file is opened for appending; whoever starts the ranks truncates
  // it (the launcher, or rank 0 before the rendezvous).
  static Result<std::unique_ptr<MetricsSink>> open(const std::string& path, const std::string& reportEndpoint);
  ~MetricsSink();
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;

  Result<void> write(const StepReport& report);
  // A note for the job's events (the bucket plan), when there is an agent to take it.
  void note(const JobEvent& event);
  // A phase of the rank's own (a checkpoint), for the timeline, when there is an agent to take it.
  void phase(const PhaseReport& phase);
  // Waits (bounded) for queued reports to leave; returns how many were dropped overall.
  std::uint64_t close();

  class Impl;

 private:
  explicit MetricsSink(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One JSON object per line, with the schema's field names (docs/trainer.md).
std::string stepReportJson(const StepReport& report);
// And back: one such line; an error names what is missing or wrong.
Result<StepReport> stepReportFromJson(const std::string& line);
// Every line of a --metrics-out file (blank lines skipped); an error names the file and line.
Result<std::vector<StepReport>> readStepReports(const std::string& path);

}  // namespace lockstep::trainer
