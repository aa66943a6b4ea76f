#include "reducer.h"

#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lockstep::trainer {

using Clock = std::chrono::steady_clock;

namespace {

// LOCKSTEP_TEST_COMM_DELAY=RANK:MICROS:STEP makes that rank's every all-reduce MICROS longer from
// step STEP on; RANK "all" makes every rank's longer. The re-planning test stands in for a link
// that became slower with it: a link slows every rank's all-reduce alike, while one rank's delay
// reads, on the others, as waiting for a late rank.
struct CommDelay {
  static constexpr int kEveryRank = -1;
  int rank = -2;  // none
  std::chrono::microseconds delay{0};
  std::uint64_t fromStep = 0;
};

CommDelay commDelayFromEnvironment() {
  CommDelay d;
  const char* text = std::getenv("LOCKSTEP_TEST_COMM_DELAY");
  long long micros = 0;
  unsigned long long step = 0;
  if (text != nullptr && std::strncmp(text, "all:", 4) == 0 && std::sscanf(text + 4, "%lld:%llu", &micros, &step) == 2) {
    d.rank = CommDelay::kEveryRank;
  } else if (text == nullptr || std::sscanf(text, "%d:%lld:%llu", &d.rank, &micros, &step) != 3 || d.rank < 0) {
    return CommDelay{};
  }
  d.delay = std::chrono::microseconds(micros);
  d.fromStep = step;
  return d;
}

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
                                 std::chrono::milliseconds timeout, progress::Writer* record)
    : comm_(comm), grads_(grads), buckets_(std::move(buckets)), timeout_(timeout), record_(record),
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
  if (static const CommDelay test = commDelayFromEnvironment();
      (test.rank == comm_.rank() || test.rank == CommDelay::kEveryRank) && ++steps_ >= test.fromStep) {
    delay_ = test.delay;
  }
  readyEnd_ = 0;
  ready_ = 0;
  launched_ = 0;
  reduced_ = 0;
  allreduceMicros_ = 0;
  bytesReduced_ = 0;
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

std::int64_t GradientReducer::allreduceMicros() const {
  std::lock_guard lock(mutex_);
  return allreduceMicros_;
}

std::uint64_t GradientReducer::bytesReduced() const {
  std::lock_guard lock(mutex_);
  return bytesReduced_;
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
    if (delay > std::chrono::microseconds::zero()) std::this_thread::sleep_for(delay);
    if (record_) record_->collectiveBegin(number, static_cast<std::uint32_t>(buckets_.size()));
    Result<void> reduced = comm_.allReduceSum(grads_ + bucket.begin, bucket.end - bucket.begin);
    if (record_ && reduced) record_->collectiveEnd();  // a failed one is where the rank stays
    const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();

    lock.lock();
    if (!reduced) {
      error_ = reduced.error();
    } else {
      timings_[number - 1].start = start;
      timings_[number - 1].end = start + std::chrono::microseconds(micros);
      ++reduced_;
      allreduceMicros_ += micros;
      bytesReduced_ += (bucket.end - bucket.begin) * sizeof(float);
    }
    changed_.notify_all();
  }
}

}  // namespace lockstep::trainer
