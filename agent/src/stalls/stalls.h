#pragma once
// The agent's stalls (docs/stalls.md): the stall watch over the running ranks' progress records,
// the evidence taken off the loop when a stall begins or a client asks (`stacks`), and what a
// stall does to its job (--on-stall). A stall's beginning, its end and its evidence join the job's
// events. Event loop only; the evidence is taken on threads of its own (evidence.h).

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/ports.h"
#include "jobs/jobs.h"
#include "stalls/evidence.h"
#include "stalls/stall_watch.h"

namespace lockstep::agent {

class Stalls {
 public:
  Stalls(std::string node, JobManager& jobs, StreamPort& stream, ReplyPort& replies, Log& log);

  // Readable when evidence was taken (onEvidence).
  int wakeFd() const { return evidence_.wakeFd(); }
  // A rank's step report, for its step times.
  void noteStep(const std::string& jobId, std::uint32_t rank, std::int64_t stepTimeUs) {
    watch_.noteStep(jobId, rank, stepTimeUs);
  }
  // A client's `stacks`: answered once the evidence is taken.
  void onStacks(const std::string& client, std::uint64_t id, const StacksRequest& request);
  // Reads the progress records four times a second, and when a rank's allowance runs out
  // (untilDue); a stall that began has its evidence taken.
  void tick();
  // How long the event loop may wait before tick() must run: until a rank's allowance runs out.
  std::chrono::milliseconds untilDue() const;
  void onEvidence();
  // A running job's progress and stall, as its status shows them.
  void withProgress(JobStatus& job) const;

 private:
  // Evidence being taken: for a client's `stacks`, or for a stall that began.
  struct Pending {
    std::string client;  // empty: for a stall
    std::uint64_t requestId = 0;
    std::optional<StallWatch::Change> stall;
  };

  void stallEnded(const StallWatch::Change& change);
  void stallBegan(StallWatch::Change change);
  void stallEvidenced(const StallWatch::Change& change, const StacksReply& evidence);
  std::vector<EvidenceTarget> evidenceTargets(const WatchedJob& job, std::optional<std::uint32_t> rank) const;

  std::string node_;
  JobManager& jobs_;
  StreamPort& stream_;
  ReplyPort& replies_;
  Log& log_;
  StallWatch watch_;
  std::chrono::steady_clock::time_point nextTick_;
  EvidenceTaker evidence_;
  std::map<std::uint64_t, Pending> pending_;  // by submission id
  std::uint64_t nextEvidenceId_ = 1;
};

}  // namespace lockstep::agent
