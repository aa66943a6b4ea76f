#pragma once
// A job's stall and its ranks' progress and evidence (docs/stalls.md) to and from their schema
// messages, for codec.cpp. Private to protocol/.

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"
#include "lockstep/v1/lockstep.pb.h"

namespace lockstep::detail {

void toPb(const RankProgress& p, v1::RankProgress* m);
Result<RankProgress> fromPb(const v1::RankProgress& m);
void toPb(const Stall& s, v1::Stall* m);
Result<Stall> fromPb(const v1::Stall& m);
void toPb(const StacksReply& r, v1::StacksReply* m);
Result<StacksReply> fromPb(const v1::StacksReply& m);

}  // namespace lockstep::detail
