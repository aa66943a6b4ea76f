#pragma once
// A job list's status without its spec (ListJobsRequest::knownSpecs): what an agent sends a client
// that holds the spec already, one piece of code for the agent and for whatever stands in for one.

#include <utility>

#include "lockstep/protocol/types.h"

namespace lockstep {

// Leaves out the status's spec but for its job id and attempt, and says so.
inline void omitSpec(JobStatus& status) {
  JobSpec stub;
  stub.jobId = std::move(status.spec.jobId);
  stub.attempt = status.spec.attempt;
  status.spec = std::move(stub);
  status.specOmitted = true;
}

}  // namespace lockstep
