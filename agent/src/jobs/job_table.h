#pragma once
// The job table on disk (STATE/jobs.json, written on every change) and what a restarted agent
// makes of it: each job read back, its ranks re-adopted, those still running (same pid and start
// time) and those it had spawned but not yet recorded (found by their environment). A re-adopted
// rank is relayed and sampled again, but its exit status is not the agent's to read (it is no
// longer its child). The job manager (jobs.h) owns it. Private to jobs/.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "jobs/job_paths.h"
#include "lockstep/common/result.h"

namespace lockstep::agent {

struct Job;  // job.h

class JobTableFile {
 public:
  explicit JobTableFile(JobPaths paths);

  // Writes `jobs`, oldest first. A failed write is said on stderr, not fatal for running jobs:
  // the next change tries again.
  void save(const std::vector<const Job*>& jobs) const;

  bool exists() const;  // false before the agent's first job
  // A job read back, with its ranks re-adopted. everyRankFound: false when the agent stopped
  // while starting it (the job still kStarting) before it had spawned every rank.
  using Take = std::function<void(std::unique_ptr<Job> job, bool everyRankFound)>;
  // Reads the table back, if there is one, handing each job to `take` in the table's order.
  Result<void> restore(const Take& take) const;

 private:
  JobPaths paths_;
  std::string path_;  // jobs.json
};

}  // namespace lockstep::agent
