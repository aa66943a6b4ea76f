#pragma once
// A job spec to and from its schema message, for codec.cpp (which wraps it in requests, replies
// and JSON). Private to protocol/.

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"
#include "lockstep/v1/lockstep.pb.h"

namespace lockstep::detail {

void toPb(const JobSpec& spec, v1::JobSpec* m);
// Decoded and validated (validateJobSpec).
Result<JobSpec> fromPb(const v1::JobSpec& m);

}  // namespace lockstep::detail
