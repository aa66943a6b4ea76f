#include "sharded_layers.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace lockstep::trainer {
namespace {

std::size_t widestBucket(const std::vector<Bucket>& buckets) {
  std::size_t most = 0;
  for (const auto& b : buckets) most = std::max(most, b.end - b.begin);
  return most;
}

}  // namespace

std::size_t ShardedLayers::stagingFloats(const std::vector<Bucket>& buckets) { return kSlots * widestBucket(buckets); }

ShardedLayers::ShardedLayers(Comm& comm, const ParamLayout& layout, const ShardPlan& plan, std::vector<Bucket> buckets,
                             bool shardParameters, const std::vector<float>& params, float* staging,
                             progress::Writer* record)
    : comm_(comm), layout_(layout), plan_(plan), buckets_(std::move(buckets)), shardParameters_(shardParameters),
      params_(params), staging_(staging), slotFloats_(widestBucket(buckets_)), record_(record),
      begin_(plan.begin(comm.rank())), end_(plan.end(comm.rank())) {
  ownGrads_.assign(end_ - begin_, 0.0f);
  bucketTickets_.assign(buckets_.size(), 0);
  if (shardParameters_) {
    ownParams_.assign(params.begin() + static_cast<std::ptrdiff_t>(begin_), params.begin() + static_cast<std::ptrdiff_t>(end_));
    for (auto& buffer : layers_) buffer.assign(layout.widestLayerFloats(), 0.0f);
  }
  thread_ = std::thread([this] { run(); });
}

ShardedLayers::~ShardedLayers() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();  // a collective in flight ends by its own timeout at the latest
}

void ShardedLayers::beginMicroStep(bool firstOfStep, bool lastOfStep) {
  (void)finish();  // the slots and the header are reused
  firstMicroStep_ = firstOfStep;
  lastMicroStep_ = lastOfStep;
  asked_ = 0;
  opened_ = false;
  backward_ = false;
  if (!firstOfStep) return;
  waitedForBuckets_ = waitedForLayers_ = {};
  std::lock_guard lock(mutex_);
  error_.reset();
  allReduce_ = reduceScatter_ = allGather_ = {};
}

std::uint64_t ShardedLayers::paramBytes() const {
  return (shardParameters_ ? ownParams_.size() + layers_[0].size() + layers_[1].size() : params_.size()) * sizeof(float);
}

// --- parameters ---------------------------------------------------------------------------------

const float* ShardedLayers::parameters(std::size_t layer) {
  if (!shardParameters_) return params_.data() + layout_.layerBegin(layer);
  auto holding = [&](std::size_t l) -> Held* {
    for (auto& h : held_) {
      if (h.layer == l) return &h;
    }
    return nullptr;
  };
  Held* mine = holding(layer);
  if (mine == nullptr) mine = &gather(layer, std::nullopt);
  // The layer asked for next while this one computes: forward's next, or after forward's last
  // layer backward's second (it starts with the last, held already); backward stops at layer 1.
  const std::size_t count = layout_.layerCount();
  std::optional<std::size_t> next;
  if (!backward_) next = layer + 1 < count ? std::optional(layer + 1) : count >= 3 ? std::optional(count - 2) : std::nullopt;
  if (backward_ && layer >= 2) next = layer - 1;
  if (next && holding(*next) == nullptr) gather(*next, layer);
  waitFor(mine->ticket, waitedForLayers_);
  return layers_[static_cast<std::size_t>(mine - held_.data())].data();
}

ShardedLayers::Held& ShardedLayers::gather(std::size_t layer, std::optional<std::size_t> keep) {
  // Not the buffer that holds `keep` (computing now); otherwise the one asked for longest ago.
  std::size_t into = held_[0].ticket <= held_[1].ticket ? 0 : 1;
  if (keep && held_[into].layer == keep) into = 1 - into;
  Held& h = held_[into];
  h.layer = layer;
  h.ticket = ask([this, layer, into] { gatherLayer(layer, layers_[into]); });
  return h;
}

void ShardedLayers::gatherLayer(std::size_t layer, std::vector<float>& into) {
  const std::size_t lo = layout_.layerBegin(layer), hi = layout_.layerEnd(layer);
  // This rank's part of the layer in place, then every other rank's.
  const std::size_t from = std::clamp(begin_, lo, hi), to = std::clamp(end_, lo, hi);
  if (to > from) {
    std::copy(ownParams_.begin() + static_cast<std::ptrdiff_t>(from - begin_),
              ownParams_.begin() + static_cast<std::ptrdiff_t>(to - begin_), into.begin() + static_cast<std::ptrdiff_t>(from - lo));
  }
  const auto parts = plan_.partsOf(lo, hi);
  timed(CollectiveKind::kAllGather, allGather_, hi - lo, [&] { return comm_.allGather(into.data(), parts); });
}

// --- gradients ----------------------------------------------------------------------------------

float* ShardedLayers::gradients(std::size_t offset, std::size_t) {
  backward_ = true;
  std::size_t index = asked_;
  while (index + 1 < buckets_.size() && buckets_[index].end <= offset) ++index;
  if (index > asked_) ready(buckets_[index].begin);  // backward has moved past them: they are final
  if (!opened_ || open_ != index) open(index);
  return slot(index) + (offset - buckets_[index].begin);
}

void ShardedLayers::ready(std::size_t end) {
  while (asked_ < buckets_.size() && buckets_[asked_].end <= end) {
    if (!opened_ || open_ != asked_) open(asked_);
    bucketTickets_[asked_] = ask([this, index = asked_, first = firstMicroStep_] { reduceScatterBucket(index, first); });
    opened_ = false;
    ++asked_;
  }
  if (asked_ != buckets_.size() || end < layout_.totalFloats() || !lastMicroStep_) return;
  // After the micro-step's last bucket, the header: the step's loss, samples and stop votes.
  std::copy(header_.begin(), header_.end(), headerSums_.begin());
  ask([this] {
    timed(CollectiveKind::kAllReduce, allReduce_, headerSums_.size(), [&]() -> Result<void> {
      LOCKSTEP_TRY(comm_.allReduceSum(headerSums_.data(), headerSums_.size()));
      std::copy(headerSums_.begin(), headerSums_.end(), header_.begin());
      return {};
    });
  });
  asked_ = buckets_.size() + 1;  // asked for once
}

void ShardedLayers::open(std::size_t index) {
  if (index >= kSlots) waitFor(bucketTickets_[index - kSlots], waitedForBuckets_);
  // The whole slot: without a reduce-scatter of its own the communicator all-reduces all of it.
  std::fill(slot(index), slot(index) + slotFloats_, 0.0f);
  open_ = index;
  opened_ = true;
}

void ShardedLayers::reduceScatterBucket(std::size_t index, bool firstMicroStep) {
  const Bucket& b = buckets_[index];
  const std::size_t lo = std::max(b.begin, ParamLayout::kHeaderFloats), hi = b.end;
  if (lo >= hi) return;
  float* data = slot(index) + (lo - b.begin);
  const auto parts = plan_.partsOf(lo, hi);
  const auto r = static_cast<std::size_t>(comm_.rank());
  const bool scatters = comm_.reduceScatters();
  timed(scatters ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce, scatters ? reduceScatter_ : allReduce_,
        scatters ? hi - lo : slotFloats_, [&]() -> Result<void> {
    LOCKSTEP_TRY(scatters ? comm_.reduceScatterSum(data, hi - lo, parts) : comm_.allReduceSum(slot(index), slotFloats_));
    const std::size_t mine = parts[r + 1] - parts[r];
    if (mine == 0) return {};
    float* into = ownGrads_.data() + (lo + parts[r] - begin_);
    const float* sums = data + parts[r];
    if (firstMicroStep) {
      std::memcpy(into, sums, mine * sizeof(float));
    } else {
      for (std::size_t i = 0; i < mine; ++i) into[i] += sums[i];
    }
    return {};
  });
}

// --- the step's end -----------------------------------------------------------------------------

Result<void> ShardedLayers::finish() {
  Ticket all = 0;
  {
    std::lock_guard lock(mutex_);
    all = askedTotal_;
  }
  waitFor(all, waitedForBuckets_);
  std::lock_guard lock(mutex_);
  if (error_) return *error_;
  return {};
}

void ShardedLayers::applyOptimizer(Optimizer& optimizer, float gradScale, std::vector<float>& params) {
  float* part = shardParameters_ ? ownParams_.data() : params.data() + begin_;
  optimizer.applyToRange(part, ownGrads_.data(), gradScale);
  held_ = {};  // the layers gathered are out of date
}

Result<void> ShardedLayers::gatherAll(std::vector<float>& into) {
  LOCKSTEP_TRY(finish());
  into.assign(layout_.totalFloats(), 0.0f);
  std::copy(ownParams_.begin(), ownParams_.end(), into.begin() + static_cast<std::ptrdiff_t>(begin_));
  const std::size_t first = ParamLayout::kHeaderFloats, total = layout_.totalFloats();
  return comm_.allGather(into.data() + first, plan_.partsOf(first, total));
}

KindTotals ShardedLayers::allReduces() const {
  std::lock_guard lock(mutex_);
  return allReduce_;
}
KindTotals ShardedLayers::reduceScatters() const {
  std::lock_guard lock(mutex_);
  return reduceScatter_;
}
KindTotals ShardedLayers::allGathers() const {
  std::lock_guard lock(mutex_);
  return allGather_;
}

// --- the communication thread -------------------------------------------------------------------

ShardedLayers::Ticket ShardedLayers::ask(std::function<void()> collective) {
  std::lock_guard lock(mutex_);
  queue_.push_back(std::move(collective));
  changed_.notify_all();
  return ++askedTotal_;
}

void ShardedLayers::waitFor(Ticket ticket, std::chrono::steady_clock::duration& waited) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return doneTotal_ >= ticket; });
  waited += std::chrono::steady_clock::now() - start;
}

void ShardedLayers::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    auto collective = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    collective();
    lock.lock();
    ++doneTotal_;
    changed_.notify_all();
  }
}

// Runs one collective unless one failed this step already; adds it to the step's totals.
void ShardedLayers::timed(CollectiveKind kind, KindTotals& totals, std::size_t floats,
                          const std::function<Result<void>()>& call) {
  {
    std::lock_guard lock(mutex_);
    if (error_) return;
  }
  const auto start = std::chrono::steady_clock::now();
  if (record_) record_->collectiveBegin(totals.count, static_cast<std::uint32_t>(buckets_.size()), static_cast<std::uint32_t>(kind));
  Result<void> done = call();
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard lock(mutex_);
  if (!done) {
    error_ = done.error();  // the rank stays where it failed
    return;
  }
  if (record_) record_->collectiveEnd();
  ++totals.count;
  totals.micros += micros;
  totals.bytes += floats * sizeof(float);
}

}  // namespace lockstep::trainer
