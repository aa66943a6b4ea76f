#pragma once
// The streamed records to and from their schema messages, for codec.cpp (which wraps them in
// replies). Private to protocol/.

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"
#include "lockstep/v1/lockstep.pb.h"

namespace lockstep::detail {

void toPb(const StreamMessage& message, v1::StreamMessage* m);
Result<StreamMessage> fromPb(const v1::StreamMessage& m);

}  // namespace lockstep::detail
