#pragma once
// Which samples each rank trains on at each step.
//
// Every epoch has an order of the data set: a permutation seeded by (seed, epoch), shared by all
// ranks without communication (like PyTorch's DistributedSampler), or 0..N-1 with shuffling off.
// Global step k of an epoch takes positions [k*G, (k+1)*G) of that order, G = world x batch x accum;
// inside it, micro-step m and rank r take the contiguous slice
//   [k*G + m*world*batch + offset(r), ... + rows(r)),
// where rows(r) is batch for every rank (the even split) or what setSplit() gave it (--balance
// dynamic), and offset(r) the sum of the rows of the ranks before it.
// So the ranks' shards are disjoint and cover the epoch, and the samples a global step uses do not
// depend on how they are split among ranks. The epoch's last step may be short: slices are cut at
// the epoch's end and some ranks may get none (gradients are weighted by sample counts, so the
// update is still the mean over exactly the samples used).

#include <cstdint>
#include <vector>

namespace lockstep::trainer {

// The split that lets ranks finish a step together: rows in inverse proportion to each rank's
// measured time per sample, adding up to `total`, each between 1 and `maxRows` (rounded by largest
// remainder). A rank with no measurement (cost <= 0) keeps an even share. Deterministic: every
// rank computes the same split from the same costs.
// `current` (optional, same size) damps the move: the result is halfway from it to the ideal
// split, since a rank's time per sample is not quite constant (fixed costs weigh more on few rows)
// and full moves would swing back and forth.
std::vector<std::uint32_t> splitByCost(const std::vector<float>& costPerSample, std::uint32_t total,
                                       std::uint32_t maxRows, const std::vector<std::uint32_t>& current = {});

class GlobalBatchSampler {
 public:
  GlobalBatchSampler(std::uint64_t samples, std::uint32_t worldSize, std::uint32_t batchPerRank,
                     std::uint32_t accumSteps, bool shuffle, std::uint64_t seed);

  std::uint64_t globalBatch() const { return globalBatch_; }
  std::uint64_t stepsPerEpoch() const { return stepsPerEpoch_; }
  // step is 0-based and counts from the start of training, across epochs.
  std::uint32_t epochOf(std::uint64_t step) const { return static_cast<std::uint32_t>(step / stepsPerEpoch_); }

  // How many rows of each micro-step each rank takes; they must add up to world x batch.
  void setSplit(std::vector<std::uint32_t> rowsPerRank);
  const std::vector<std::uint32_t>& split() const { return rows_; }

  // Data set indices for `rank`'s micro-batch `micro` of global step `step` (0-based). Not
  // thread-safe: it may rebuild the epoch's permutation.
  void indices(std::uint64_t step, std::uint32_t micro, std::uint32_t rank, std::vector<std::uint32_t>& out);

 private:
  void prepareEpoch(std::uint32_t epoch);

  std::uint64_t samples_;
  std::uint32_t worldSize_;
  std::uint32_t batchPerRank_;
  std::uint32_t accumSteps_;
  bool shuffle_;
  std::uint64_t seed_;
  std::uint64_t globalBatch_;
  std::uint64_t stepsPerEpoch_;
  std::vector<std::uint32_t> rows_;     // per rank
  std::vector<std::uint64_t> offsets_;  // per rank: the sum of the rows before it
  std::vector<std::uint32_t> order_;
  std::int64_t orderEpoch_ = -1;
};

}  // namespace lockstep::trainer
