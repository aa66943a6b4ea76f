#pragma once
// A rank's progress record (lockstep/common/progress.h) as read, in the wire's terms: what the
// stall watch shows of a rank, and where a failed rank left its peers (jobs.cpp).

#include <cstdint>

#include "lockstep/common/progress.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

// stillMs is the agent's to say.
RankProgress progressOf(std::uint32_t rank, const progress::Snapshot& snapshot, std::int64_t stillMs);

}  // namespace lockstep::agent
