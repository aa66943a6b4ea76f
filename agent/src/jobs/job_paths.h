#pragma once
// Where a job's part on this node keeps its files: its directory and its ranks' files there, the
// key that launched it, its cgroup, and the job table. They come from the (validated) job id,
// never from a file: a job table edited to name other files must not make the agent trim or serve
// them. Private to jobs/.

#include <cstdint>
#include <string>

#include "jobs/job_cgroup.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct JobPaths {
  std::string stateDir;
  std::string node;
  NodeCgroups cgroups;  // where jobs' cgroups are made (job_cgroup.h)

  std::string table() const;  // STATE/jobs.json
  std::string jobDir(const std::string& jobId) const;
  // Where the key that launched a job is kept, for its restarts: outside the job's directory.
  std::string launcher(const std::string& jobId) const;
  // The cgroups of the job's attempt (empty where jobs get none).
  PartCgroups jobCgroups(const JobSpec& spec) const;
  static std::string rankLog(const std::string& jobDir, std::uint32_t rank);
  // How the rank ended, as its keeper records it (lockstep/common/process.h).
  static std::string rankExit(const std::string& jobDir, std::uint32_t rank);
};

}  // namespace lockstep::agent
