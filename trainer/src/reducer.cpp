#include "reducer.h"

#include <sched.h>

#include "dist_env.h"
#include "shard.h"

namespace lockstep::trainer {

using Clock = std::chrono::steady_clock;

namespace {

// True when a thread may go to SCHED_IDLE and come back to SCHED_OTHER. Tried on a thread of its
// own, so that a failed return strands nobody.
bool canReturnFromIdleScheduling() {
  bool ok = false;
  std::thread probe([&ok] {
    sched_param none{};
    ok = ::sched_setscheduler(0, SCHED_IDLE, &none) == 0 && ::sched_setscheduler(0, SCHED_OTHER, &none) == 0;
  });
  probe.join();
  return ok;
}

}  // namespace

GradientReducer::GradientReducer(Comm& comm, float* grads, std::vector<Bucket> buckets,
                                 std::chrono::milliseconds timeout, progress::Writer* record, const ShardPlan* shards)
    : comm_(comm), grads_(grads), buckets_(std::move(buckets)), timeout_(timeout), record_(record), shards_(shards),
      canYield_(canReturnFromIdleScheduling()), timings_(buckets_.size()) {
  thread_ = std::thread([this] { run(); });
}

GradientReducer::~GradientReducer() { shutdown(); }

void GradientReducer::shutdown() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

std::vector<std::size_t> GradientReducer::cuts() const {
  std::vector<std::size_t> out;
  for (const auto& b : buckets_) out.push_back(b.end);
  return out;
}

void GradientReducer::beginStep() {
  std::lock_guard lock(mutex_);
  delay_ = testCommDelay(comm_.rank(), ++steps_);
  readyEnd_ = 0;
  ready_ = 0;
  launched_ = 0;
  reduced_ = 0;
  allReduce_ = {};
  reduceScatter_ = {};
}

void GradientReducer::markReady(std::size_t end) {
  bool launch = false;
  {
    std::lock_guard lock(mutex_);
    readyEnd_ = std::max(readyEnd_, end);
    const auto now = Clock::now();
    for (; ready_ < buckets_.size() && buckets_[ready_].end <= readyEnd_; ++ready_) timings_[ready_].ready = now;
    launch = launched_ < buckets_.size() && buckets_[launched_].end <= readyEnd_;
  }
  if (!launch) return;
  changed_.notify_all();
  if (canYield_ && !computeYielding_) yieldComputeToCommunication(true);
}

Result<void> GradientReducer::waitBucket(std::size_t index) {
  std::unique_lock lock(mutex_);
  // The collective has its own timeout; this one only guards against a reducer bug.
  const bool done = changed_.wait_for(lock, timeout_ + std::chrono::seconds(5),
                                      [&] { return reduced_ > index || error_.has_value(); });
  const bool failed = error_.has_value() || !done;
  lock.unlock();
  if (failed || index + 1 == buckets_.size()) yieldComputeToCommunication(false);
  if (failed) return error_ ? *error_ : timeoutError("bucket " + std::to_string(index) + " was not reduced in time");
  return {};
}

void GradientReducer::yieldComputeToCommunication(bool yield) {
  if (yield == computeYielding_) return;
  sched_param none{};
  if (::sched_setscheduler(0, yield ? SCHED_IDLE : SCHED_OTHER, &none) == 0) {
    computeYielding_ = yield;
  } else if (!yield) {
    // Could not come back (the limit changed under us): stop yielding rather than starve.
    canYield_ = false;
  }
}

std::vector<BucketTiming> GradientReducer::timings() const {
  std::lock_guard lock(mutex_);
  return timings_;
}

std::int64_t GradientReducer::allreduceMicros() const { return allReduces().micros; }

std::uint64_t GradientReducer::bytesReduced() const { return allReduces().bytes; }

KindTotals GradientReducer::allReduces() const {
  std::lock_guard lock(mutex_);
  return allReduce_;
}

KindTotals GradientReducer::reduceScatters() const {
  std::lock_guard lock(mutex_);
  return reduceScatter_;
}

// A bucket is all-reduced; sharded, its parameters' gradients are reduce-scattered onto their
// owners and only the header (the step's loss, samples and votes, which every rank needs) is
// all-reduced.
// The test's delay (LOCKSTEP_TEST_COMM_DELAY) counts as the bucket's first collective's time.
Result<void> GradientReducer::reduce(const Bucket& bucket, std::uint32_t number, std::chrono::microseconds delay) {
  std::size_t begin = bucket.begin;
  if (shards_ != nullptr && begin < ParamLayout::kHeaderFloats) {
    LOCKSTEP_TRY(timed(CollectiveKind::kAllReduce, number, ParamLayout::kHeaderFloats, delay,
                       [&] { return comm_.allReduceSum(grads_, ParamLayout::kHeaderFloats); }));
    begin = ParamLayout::kHeaderFloats;
    delay = {};
  }
  if (shards_ == nullptr) {
    return timed(CollectiveKind::kAllReduce, number, bucket.end - begin, delay,
                 [&] { return comm_.allReduceSum(grads_ + begin, bucket.end - begin); });
  }
  if (bucket.end <= begin) return {};
  // A backend without a reduce-scatter all-reduces: counted as what it did.
  const CollectiveKind kind = comm_.reduceScatters() ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
  return timed(kind, number, bucket.end - begin, delay, [&] {
    return comm_.reduceScatterSum(grads_ + begin, bucket.end - begin, shards_->partsOf(begin, bucket.end));
  });
}

Result<void> GradientReducer::timed(CollectiveKind kind, std::uint32_t number, std::size_t floats,
                                    std::chrono::microseconds delay, const std::function<Result<void>()>& call) {
  const auto start = Clock::now();
  if (delay > std::chrono::microseconds::zero()) std::this_thread::sleep_for(delay);
  if (record_) record_->collectiveBegin(number, static_cast<std::uint32_t>(buckets_.size()), static_cast<std::uint32_t>(kind));
  Result<void> done = call();
  if (record_ && done) record_->collectiveEnd();  // a failed one is where the rank stays
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  if (!done) return done;
  std::lock_guard lock(mutex_);
  KindTotals& totals = kind == CollectiveKind::kReduceScatter ? reduceScatter_ : allReduce_;
  ++totals.count;
  totals.micros += micros;
  totals.bytes += floats * sizeof(float);
  return {};
}

void GradientReducer::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] {
      return stopping_ || (!error_ && launched_ < buckets_.size() && buckets_[launched_].end <= readyEnd_);
    });
    if (stopping_) return;
    const Bucket bucket = buckets_[launched_++];
    const auto number = static_cast<std::uint32_t>(launched_);
    const auto delay = delay_;
    lock.unlock();

    const auto start = Clock::now();
    Result<void> reduced = reduce(bucket, number, delay);
    const auto end = Clock::now();

    lock.lock();
    if (!reduced) {
      error_ = reduced.error();
    } else {
      timings_[number - 1].start = start;
      timings_[number - 1].end = end;
      ++reduced_;
    }
    changed_.notify_all();
  }
}

}  // namespace lockstep::trainer
