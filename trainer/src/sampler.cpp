#include "sampler.h"

#include <algorithm>
#include <cmath>
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
      stepsPerEpoch_((samples + globalBatch_ - 1) / globalBatch_) {
  setSplit(std::vector<std::uint32_t>(worldSize, batchPerRank));
}

void GlobalBatchSampler::setSplit(std::vector<std::uint32_t> rowsPerRank) {
  rows_ = std::move(rowsPerRank);
  offsets_.assign(rows_.size(), 0);
  for (std::size_t r = 1; r < rows_.size(); ++r) offsets_[r] = offsets_[r - 1] + rows_[r - 1];
}

std::vector<std::uint32_t> splitByCost(const std::vector<float>& costPerSample, std::uint32_t total,
                                       std::uint32_t maxRows, const std::vector<std::uint32_t>& current) {
  const std::size_t n = costPerSample.size();
  std::vector<std::uint32_t> rows(n, 0);
  if (n == 0) return rows;
  double known = 0, sumCost = 0;
  for (float c : costPerSample) {
    if (c > 0) {
      known += 1;
      sumCost += c;
    }
  }
  const double fallback = known > 0 ? sumCost / known : 1.0;  // unmeasured ranks: the mean cost
  std::vector<double> speed(n);
  double sumSpeed = 0;
  for (std::size_t r = 0; r < n; ++r) {
    speed[r] = 1.0 / (costPerSample[r] > 0 ? costPerSample[r] : fallback);
    sumSpeed += speed[r];
  }
  // Ideal shares, clamped to [1, maxRows]: ranks over the cap are fixed at it first, then ranks
  // under one row at one, each time sharing what is left among the others, until all fit.
  std::vector<double> share(n);
  std::vector<bool> fixed(n, false);
  for (std::size_t round = 0; round <= n; ++round) {
    double left = total, free = 0;
    for (std::size_t r = 0; r < n; ++r) {
      if (fixed[r]) left -= share[r];
      else free += speed[r];
    }
    if (free == 0) break;
    for (std::size_t r = 0; r < n; ++r) {
      if (!fixed[r]) share[r] = left * speed[r] / free;
    }
    bool over = false;
    for (std::size_t r = 0; r < n; ++r) over |= !fixed[r] && share[r] > maxRows;
    bool changed = false;
    for (std::size_t r = 0; r < n; ++r) {
      if (fixed[r]) continue;
      if (over ? share[r] > maxRows : share[r] < 1.0) {
        share[r] = over ? static_cast<double>(maxRows) : 1.0;
        fixed[r] = true;
        changed = true;
      }
    }
    if (!changed) break;
  }
  if (current.size() == n) {
    for (std::size_t r = 0; r < n; ++r) share[r] = 0.5 * (share[r] + current[r]);
  }
  std::uint32_t assigned = 0;
  for (std::size_t r = 0; r < n; ++r) {
    rows[r] = static_cast<std::uint32_t>(std::floor(share[r]));
    assigned += rows[r];
  }
  // Largest remainders first (ties to the lower rank), within the cap.
  std::vector<std::size_t> byRemainder(n);
  std::iota(byRemainder.begin(), byRemainder.end(), 0);
  std::stable_sort(byRemainder.begin(), byRemainder.end(), [&](std::size_t a, std::size_t b) {
    return share[a] - std::floor(share[a]) > share[b] - std::floor(share[b]);
  });
  for (std::size_t i = 0; assigned < total && i < 4 * n; ++i) {
    const std::size_t r = byRemainder[i % n];
    if (rows[r] < maxRows) {
      ++rows[r];
      ++assigned;
    }
  }
  return rows;
}

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
  const std::uint64_t begin = k * globalBatch_ + std::uint64_t{micro} * worldSize_ * batchPerRank_ + offsets_[rank];
  const std::uint64_t end = std::min(begin + rows_[rank], samples_);
  if (begin >= end) return;
  if (!shuffle_) {
    for (std::uint64_t p = begin; p < end; ++p) out.push_back(static_cast<std::uint32_t>(p));
    return;
  }
  prepareEpoch(epoch);
  out.assign(order_.begin() + static_cast<std::ptrdiff_t>(begin), order_.begin() + static_cast<std::ptrdiff_t>(end));
}

}  // namespace lockstep::trainer
