#pragma once
// --nproc N: start N ranks of this program on this machine, like torchrun --nproc_per_node. The
// launcher hosts the ranks' rendezvous store, records how each rank exits (so survivors can name a
// lost rank precisely), forwards stop signals, and cleans up: no rank outlives it.

#include <atomic>
#include <string>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/jobflags/options.h"

namespace lockstep::trainer {

// Returns the exit code for the launcher's process: 0 when every rank succeeded, the first failed
// rank's code otherwise, 128+N when stopped by signal N. rankArgs are passed to every rank.
Result<int> runLocalRanks(const jobflags::TrainerOptions& options, const std::vector<std::string>& rankArgs,
                          const std::atomic<int>& stopSignal);

}  // namespace lockstep::trainer
