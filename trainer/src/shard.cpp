#include "shard.h"

#include <algorithm>
#include <cstring>

namespace lockstep::trainer {

ShardPlan::ShardPlan(const ParamLayout& layout, int worldSize) {
  const std::size_t first = ParamLayout::kHeaderFloats, total = layout.totalFloats();
  const auto n = static_cast<std::size_t>(worldSize);
  // Equal parts, each starting on a tensor alignment boundary (whole vectors for the optimizer).
  const std::size_t align = ParamLayout::kAlignFloats;
  const std::size_t per = ((total - first + n - 1) / n + align - 1) / align * align;
  for (std::size_t r = 0; r <= n; ++r) bounds_.push_back(std::min(total, first + r * per));
}

std::vector<std::size_t> ShardPlan::partsOf(std::size_t begin, std::size_t end) const {
  std::vector<std::size_t> parts;
  for (std::size_t r = 0; r < bounds_.size(); ++r) {
    parts.push_back(std::clamp(bounds_[r], begin, end) - begin);
  }
  parts.front() = 0;
  parts.back() = end - begin;
  return parts;
}

Result<std::unique_ptr<Optimizer>> gatherOptimizer(Comm& comm, const ShardPlan& plan, Optimizer& part,
                                                   const ParamLayout& layout) {
  auto full = std::make_unique<Optimizer>(part.spec(), layout);
  full->setStepsTaken(part.stepsTaken());
  const auto mine = part.stateBuffers(), all = full->stateBuffers();
  const std::size_t first = ParamLayout::kHeaderFloats, total = layout.totalFloats();
  for (std::size_t b = 0; b < all.size(); ++b) {
    std::vector<float>& whole = *all[b].data;
    const std::vector<float>& own = *mine[b].data;
    std::copy(own.begin(), own.end(), whole.begin() + static_cast<std::ptrdiff_t>(part.rangeBegin()));
    LOCKSTEP_TRY(comm.allGather(whole.data() + first, plan.partsOf(first, total)));
  }
  return full;
}

std::unique_ptr<Optimizer> partOf(Optimizer& full, const ShardPlan& plan, int rank) {
  auto part = std::make_unique<Optimizer>(full.spec(), plan.begin(rank), plan.end(rank));
  part->setStepsTaken(full.stepsTaken());
  const auto all = full.stateBuffers(), mine = part->stateBuffers();
  for (std::size_t b = 0; b < all.size(); ++b) {
    const auto from = all[b].data->begin() + static_cast<std::ptrdiff_t>(plan.begin(rank));
    std::copy(from, from + static_cast<std::ptrdiff_t>(mine[b].data->size()), mine[b].data->begin());
  }
  return part;
}

}  // namespace lockstep::trainer
