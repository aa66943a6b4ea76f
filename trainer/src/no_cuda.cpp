// A build without CUDA: --backend cuda says so instead of training.

#include "comm.h"
#include "trainer.h"

namespace lockstep::trainer {
namespace {

Error notBuilt() {
  return Error{ErrorCode::kFailedPrecondition,
               "this lockstep-trainer was built without CUDA, so --backend cuda is not available; use --backend cpu, "
               "or build with the CUDA toolkit and NCCL installed (LOCKSTEP_WITH_CUDA)"};
}

}  // namespace

Result<std::unique_ptr<Comm>> connectNccl(StoreClient*, const std::string&, const DistEnv&, std::chrono::milliseconds) {
  return notBuilt();
}

Result<RunSummary> RankRunner::trainCuda() { return notBuilt(); }

bool cudaBackendBuilt() { return false; }

}  // namespace lockstep::trainer
