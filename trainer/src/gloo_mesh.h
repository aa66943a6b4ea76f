#pragma once
// The Gloo full mesh among a job's ranks, found through the job's store: for the collectives
// (gloo_comm.cpp, pairs in synchronous mode) and the parameter server's messages (ps_link.cpp,
// asynchronous pairs, which point-to-point buffers need). Private to the trainer.

#include <exception>
#include <memory>

#include "comm.h"

namespace gloo {
class Context;
}

namespace lockstep::trainer {

Result<std::shared_ptr<gloo::Context>> connectGlooMesh(StoreClient& store, const GlooOptions& options, bool synchronousPairs);

// What a Gloo call's exception means: a timeout, a lost peer, or a bug.
Error glooError(const char* what, const std::exception& e);

}  // namespace lockstep::trainer
