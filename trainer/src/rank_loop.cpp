#include "rank_loop.h"

#include "cpu_loop.h"

namespace lockstep::trainer {

Result<std::unique_ptr<RankLoop>> makeRankLoop(Backend backend, RankHost& host) {
  if (backend == Backend::kCuda) return makeCudaLoop(host);
  return std::unique_ptr<RankLoop>(std::make_unique<CpuLoop>(host));
}

}  // namespace lockstep::trainer
