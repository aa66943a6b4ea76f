#pragma once
// The stall watch (docs/stalls.md): four times a second, and at the moment a rank's allowance runs
// out (dueUs), the agent reads each running rank's progress record (lockstep/common/progress.h) and
// judges whether it moved within its allowance (kpi/stall.h). A job whose ranks stopped moving is
// stalled until one moves again; what the ranks' progress says (the wavefront) is its diagnosis.
// The event loop owns it (not thread-safe).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "jobs/jobs.h"
#include "jobs/rank_progress.h"
#include "lockstep/common/progress.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

// The process a rank's state and stacks are of: the one writing its record when that is of the
// rank's process group (`bash train.sh` runs Python as its child), else the rank's program.
pid_t workingProcess(const WatchedRank& rank, pid_t recordPid);
// "sleeping", "stopped by a signal", "waiting on disk or a file system"; "" when the process is gone.
std::string processStateOf(pid_t pid);
std::string processStateText(char state);

// A job's stall state, per job the watch follows. Every edge:
//
//   from      to        when                                              Change
//   moving    stalled   a judged rank stood still past its allowance      began
//                       (kpi/stall.h: stillMs > allowanceMs)
//   stalled   stalled   still over: only the diagnosis is written again   (none)
//   stalled   moving    no judged rank is over its allowance any more     ended
//   stalled   (gone)    the job is no longer listed (it ended)            ended, jobEnded
//   moving    (gone)    the job ended                                     (none)
//
// What a stall that began does (report, stop, restart) is the job's --on-stall, carried out by
// Stalls (stalls.h) once the evidence is taken.
class StallWatch {
 public:
  struct Change {
    std::string jobId;
    bool began = false;  // else ended
    Stall stall;         // what began (or what ended)
    OnStall onStall = OnStall::kReport;
    bool jobEnded = false;  // ended because the job did
  };

  // A step report's step time, for the rank's p99.
  void noteStep(const std::string& jobId, std::uint32_t rank, std::int64_t stepTimeUs);
  // Reads the jobs' records; forgets the jobs no longer listed. Returns the stalls that began or ended.
  std::vector<Change> tick(const std::vector<WatchedJob>& jobs);
  // When (unix µs, the node's clock) the first judged rank of a job not stalled goes over its
  // allowance if nothing moves before: the next tick is due then (INT64_MAX: none).
  std::int64_t dueUs() const;

  std::vector<RankProgress> progressOf(const std::string& jobId) const;
  std::optional<Stall> stallOf(const std::string& jobId) const;

 private:
  struct RankWatch {
    std::optional<progress::Snapshot> last;
    std::int64_t movedAtUs = 0;  // unix µs, the node's clock (the rank's record is on it too)
    std::deque<std::int64_t> stepMs;             // recent step times
    std::map<std::string, std::int64_t> phaseMaxMs;  // announced phases' longest runs
    RankProgress shown;
    bool judged = false;  // its stillness can stall the job (judged() in stall_watch.cpp)
  };
  struct JobWatch {
    std::map<std::uint32_t, RankWatch> ranks;
    std::optional<Stall> stall;
  };

  void observe(RankWatch& watch, const WatchedRank& rank, const WatchedJob& job, std::int64_t nowUs);
  std::optional<Change> judge(JobWatch& watch, const WatchedJob& job);

  std::map<std::string, JobWatch> jobs_;
};

}  // namespace lockstep::agent
