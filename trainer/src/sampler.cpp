#include "sampler.h"

#include <algorithm>
#include <numeric>

#include "rng.h"

namespace lockstep::trainer {

GlobalBatchSampler::GlobalBatchSampler(std::uint64_t samples, std::uint32_t worldSize, std::uint32_t batchPerRank,
                                       std::uint32_t accumSteps, bool shuffle, std::uint64_t seed)
    : samples_(samples),
      worldSize_(worldSize),
      batchPerRank_(batchPerRank),
      accumSteps_(accumSteps),
      shuffle_(shuffle),
      seed_(seed),
      globalBatch_(std::uint64_t{worldSize} * batchPerRank * accumSteps),
      stepsPerEpoch_((samples + globalBatch_ - 1) / globalBatch_) {}

void GlobalBatchSampler::prepareEpoch(std::uint32_t epoch) {
  if (orderEpoch_ == epoch) return;
  order_.resize(samples_);
  std::iota(order_.begin(), order_.end(), 0u);
  if (shuffle_) {
    SplitMix64 rng(mixSeed(seed_, 0x5eed0000ull + epoch));
    for (std::uint64_t i = samples_ - 1; i > 0; --i) std::swap(order_[i], order_[rng.below(i + 1)]);
  }
  orderEpoch_ = epoch;
}

void GlobalBatchSampler::indices(std::uint64_t step, std::uint32_t micro, std::uint32_t rank,
                                 std::vector<std::uint32_t>& out) {
  out.clear();
  const std::uint32_t epoch = epochOf(step);
  const std::uint64_t k = step % stepsPerEpoch_;
  const std::uint64_t begin =
      k * globalBatch_ + std::uint64_t{micro} * worldSize_ * batchPerRank_ + std::uint64_t{rank} * batchPerRank_;
  const std::uint64_t end = std::min(begin + batchPerRank_, samples_);
  if (begin >= end) return;
  if (!shuffle_) {
    for (std::uint64_t p = begin; p < end; ++p) out.push_back(static_cast<std::uint32_t>(p));
    return;
  }
  prepareEpoch(epoch);
  out.assign(order_.begin() + static_cast<std::ptrdiff_t>(begin), order_.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace lockstep::trainer
