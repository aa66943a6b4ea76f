#pragma once
// A job's processes found in /proc by the variables the agent gave them: the ranks a restarted
// agent adopts, and what an adopted rank left behind.

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct FoundRank {
  pid_t keeper = -1;   // the leader of the rank's process group (lockstep/common/process.h)
  pid_t program = -1;  // the program it keeps
};

// `rank` of this attempt of the job as the agent spawned it: the process with the job's variables
// whose parent leads its process group (the keeper). Both -1 if there is none.
FoundRank findRankProcess(const JobSpec& spec, std::uint32_t rank);

// Kills what is left in an adopted rank's process group (not our child, so not reaped by us). The
// group's id may be reused once the rank is gone, so its members are picked by their job.
void killLeftovers(pid_t processGroup, const std::string& jobId);

}  // namespace lockstep::agent
