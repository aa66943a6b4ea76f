// A build without CUDA: --backend cuda says so instead of training.

#include "rank_loop.h"

namespace lockstep::trainer {

Result<std::unique_ptr<RankLoop>> makeCudaLoop(RankHost&) {
  return Error{ErrorCode::kFailedPrecondition,
               "this lockstep-trainer was built without CUDA, so --backend cuda is not available; use --backend cpu, "
               "or build with the CUDA toolkit and NCCL installed (LOCKSTEP_WITH_CUDA)"};
}

bool cudaBackendBuilt() { return false; }

}  // namespace lockstep::trainer
