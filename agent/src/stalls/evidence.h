#pragma once
// Evidence of what a job's ranks are doing (docs/stalls.md), taken off the agent's event loop:
// each rank's process state and whether its CPU time moves, its threads' states and wait
// channels (/proc), its Python stacks (the lockstep package registers faulthandler on the signal
// its progress record names; the agent sends it and reads what the rank appended to its stacks
// file), a native backtrace where gdb is installed (for ranks without Python stacks), and the end
// of its log. Nothing needs the stuck thread's help. Every wait is bounded: stacks 2 s, gdb 10 s
// a rank (at most 4 ranks), so one taking lasts at most about 45 s. Takings run one at a time (a
// rank's stacks file and a tracer are one per process), so a request may also wait for up to
// three others before it: about 3 minutes at the very worst.
//
// Not thread-safe: the event loop calls it; the taking runs on a thread per request.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/off_loop.h"
#include "jobs/jobs.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct EvidenceTarget {
  WatchedRank rank;
  RankProgress progress;  // as the stall watch last saw it
  int stackSignal = 0;    // from the progress record; 0: not a Python rank of the package
  pid_t recordPid = 0;    // the process that writes the record (a wrapper's child, say); 0: unknown
};

// Whether `pid` has a handler for `signal` (/proc/PID/status SigCgt): only then is it sent, since
// a real-time signal's default action ends the process.
bool catchesSignal(pid_t pid, int signal);

// On the calling thread (the tests call it directly).
StacksReply takeEvidence(const std::string& jobId, const std::string& node, const std::vector<EvidenceTarget>& ranks);

class EvidenceTaker {
 public:
  static constexpr std::size_t kMaxInFlight = 4;

  int wakeFd() const { return takings_.wakeFd(); }
  Result<void> submit(std::uint64_t id, std::string jobId, std::string node, std::vector<EvidenceTarget> ranks);

  using Done = OffLoop<StacksReply>::Done;  // its reply is `result`
  std::vector<Done> take() { return takings_.take(); }

 private:
  OffLoop<StacksReply> takings_{kMaxInFlight};
};

}  // namespace lockstep::agent
