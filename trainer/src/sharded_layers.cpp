#include "sharded_layers.h"

#include <algorithm>
#include <cstring>

namespace lockstep::trainer {

std::size_t ShardedLayers::stagingFloats(const std::vector<Bucket>& buckets) {
  std::size_t most = 0;
  for (const auto& b : buckets) most = std::max(most, b.end - b.begin);
  return most;
}

ShardedLayers::ShardedLayers(Comm& comm, const ParamLayout& layout, const ShardPlan& plan, std::vector<Bucket> buckets,
                             bool shardParameters, const std::vector<float>& params, float* staging,
                             progress::Writer* record)
    : comm_(comm), layout_(layout), plan_(plan), buckets_(std::move(buckets)), shardParameters_(shardParameters),
      params_(params), staging_(staging), stagingFloats_(stagingFloats(buckets_)), record_(record),
      begin_(plan.begin(comm.rank())), end_(plan.end(comm.rank())) {
  ownGrads_.assign(end_ - begin_, 0.0f);
  if (!shardParameters_) return;
  ownParams_.assign(params.begin() + static_cast<std::ptrdiff_t>(begin_), params.begin() + static_cast<std::ptrdiff_t>(end_));
  std::size_t widest = 0;
  for (std::size_t l = 0; l < layout.layerCount(); ++l) widest = std::max(widest, layout.layerEnd(l) - layout.layerBegin(l));
  layer_.assign(widest, 0.0f);
}

void ShardedLayers::beginMicroStep(bool firstOfStep) {
  firstMicroStep_ = firstOfStep;
  reduced_ = 0;
  opened_ = false;
  if (!firstOfStep) return;
  error_.reset();
  allReduce_ = reduceScatter_ = allGather_ = {};
}

std::uint64_t ShardedLayers::paramBytes() const {
  return (shardParameters_ ? ownParams_.size() + layer_.size() : params_.size()) * sizeof(float);
}

const float* ShardedLayers::parameters(std::size_t layer) {
  const std::size_t lo = layout_.layerBegin(layer), hi = layout_.layerEnd(layer);
  if (!shardParameters_) return params_.data() + lo;
  if (gathered_ == layer || error_) return layer_.data();
  // This rank's part of the layer in place, then every other rank's.
  const std::size_t from = std::clamp(begin_, lo, hi), to = std::clamp(end_, lo, hi);
  std::copy(ownParams_.begin() + static_cast<std::ptrdiff_t>(from - begin_),
            ownParams_.begin() + static_cast<std::ptrdiff_t>(to - begin_), layer_.begin() + static_cast<std::ptrdiff_t>(from - lo));
  const auto parts = plan_.partsOf(lo, hi);
  if (timed(CollectiveKind::kAllGather, allGather_, hi - lo, [&] { return comm_.allGather(layer_.data(), parts); })) {
    gathered_ = layer;
  }
  return layer_.data();
}

float* ShardedLayers::gradients(std::size_t offset, std::size_t) {
  std::size_t index = reduced_;
  while (index + 1 < buckets_.size() && buckets_[index].end <= offset) ++index;
  if (index > reduced_) ready(buckets_[index].begin);  // backward has moved past them: they are final
  if (!opened_ || open_ != index) open(index);
  return staging_ + (offset - buckets_[index].begin);
}

void ShardedLayers::ready(std::size_t end) {
  while (reduced_ < buckets_.size() && buckets_[reduced_].end <= end) {
    if (!opened_ || open_ != reduced_) open(reduced_);
    reduceOpen();
    opened_ = false;
    ++reduced_;
  }
}

void ShardedLayers::open(std::size_t index) {
  const Bucket& b = buckets_[index];
  std::fill(staging_, staging_ + (b.end - b.begin), 0.0f);
  open_ = index;
  opened_ = true;
}

void ShardedLayers::reduceOpen() {
  const Bucket& b = buckets_[open_];
  const std::size_t lo = std::max(b.begin, ParamLayout::kHeaderFloats), hi = b.end;
  if (lo < hi) keepOwnPart(staging_ + (lo - b.begin), lo, hi);
  // After the micro-step's last bucket, the header: the step's loss, samples and stop votes.
  if (open_ + 1 == buckets_.size()) {
    std::copy(header_.begin(), header_.end(), headerSums_.begin());
    if (timed(CollectiveKind::kAllReduce, allReduce_, headerSums_.size(),
              [&] { return comm_.allReduceSum(headerSums_.data(), headerSums_.size()); })) {
      std::copy(headerSums_.begin(), headerSums_.end(), header_.begin());
    }
  }
}

void ShardedLayers::keepOwnPart(float* data, std::size_t lo, std::size_t hi) {
  const auto parts = plan_.partsOf(lo, hi);
  if (!timed(CollectiveKind::kReduceScatter, reduceScatter_, hi - lo,
             [&] { return comm_.reduceScatterSum(data, hi - lo, parts); })) {
    return;
  }
  const auto r = static_cast<std::size_t>(comm_.rank());
  const std::size_t mine = parts[r + 1] - parts[r];
  if (mine == 0) return;
  float* into = ownGrads_.data() + (lo + parts[r] - begin_);
  const float* sums = data + parts[r];
  if (firstMicroStep_) {
    std::memcpy(into, sums, mine * sizeof(float));
  } else {
    for (std::size_t i = 0; i < mine; ++i) into[i] += sums[i];
  }
}

Result<void> ShardedLayers::timed(CollectiveKind kind, KindTotals& totals, std::size_t floats,
                                  const std::function<Result<void>()>& call) {
  if (error_) return *error_;
  const auto start = std::chrono::steady_clock::now();
  if (record_) record_->collectiveBegin(totals.count, static_cast<std::uint32_t>(buckets_.size()), static_cast<std::uint32_t>(kind));
  Result<void> done = call();
  if (!done) {
    error_ = done.error();  // the rank stays where it failed
    return done;
  }
  if (record_) record_->collectiveEnd();
  ++totals.count;
  totals.micros += std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
  totals.bytes += floats * sizeof(float);
  return done;
}

void ShardedLayers::applyOptimizer(Optimizer& optimizer, float gradScale, std::vector<float>& params) {
  float* part = shardParameters_ ? ownParams_.data() : params.data() + begin_;
  optimizer.applyToRange(part, ownGrads_.data(), gradScale);
  gathered_.reset();  // the layer gathered last is out of date
}

Result<void> ShardedLayers::gatherAll(std::vector<float>& into) {
  into.assign(layout_.totalFloats(), 0.0f);
  std::copy(ownParams_.begin(), ownParams_.end(), into.begin() + static_cast<std::ptrdiff_t>(begin_));
  const std::size_t first = ParamLayout::kHeaderFloats, total = layout_.totalFloats();
  return comm_.allGather(into.data() + first, plan_.partsOf(first, total));
}

}  // namespace lockstep::trainer
