#pragma once
// Where a job's ranks on this node meet the job's others. The agent that runs rank 0 hosts the
// trainer's rendezvous store (with a secret of its own, which the job's other agents are given)
// or picks the free port a command job's own store (torch's c10d) binds; the others take rank 0's
// host, port and secret from the job spec. Stores listen on the address the agent listens on.
// The job manager (jobs.h) owns it. Private to jobs/.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/common/store.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct Job;         // job.h
struct NodeLaunch;  // rank_launch.h

class JobRendezvous {
 public:
  // listenHost: the interface the agent listens on (JobManagerOptions::listenHost).
  explicit JobRendezvous(std::string listenHost);

  // Where `job`'s local ranks meet, in `launch` (its master address and port, the store's
  // secret): the job's store, started here when rank 0 runs here.
  Result<void> prepare(Job& job, const std::vector<RankPlacement>& local, NodeLaunch& launch) const;
  // The job's store on `port` (0: any): a new job's, or a re-adopted job's again, where its ranks'
  // store clients reconnect and register again.
  Result<std::unique_ptr<StoreServer>> startStore(const Job& job, std::uint16_t port) const;

 private:
  std::string listenHost_;
};

}  // namespace lockstep::agent
