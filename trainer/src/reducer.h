#pragma once
// Overlaps gradient all-reduce with backward: the main thread says how far the gradient buffer is
// final (markReady), a communication thread all-reduces each bucket as soon as it is complete, in
// order, and the main thread waits for each bucket before applying the optimizer to it.
//
// Threading: one main thread calls beginStep/markReady/waitBucket; the reducer owns the
// communication thread, which is the only caller of comm.allReduceSum while the reducer exists.
//
// Scheduling: on CPUs the compute thread and the communication thread share cores, and an
// exchange stalls until the peer's communication thread gets a time slice (measured: median
// exposed wait 2.2 ms, p90 6 ms per step on 2 cores). So while buckets are in flight the main
// thread runs at SCHED_IDLE, which any waking thread preempts at once, and returns to
// SCHED_OTHER when the step's last bucket is reduced. Going to SCHED_IDLE is always allowed;
// coming back needs CAP_SYS_NICE or RLIMIT_NICE >= 20 (`ulimit -e 20`, systemd's LimitNICE=),
// so the reducer first checks on a throwaway thread and yields only when it can come back.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm.h"
#include "lockstep/common/progress.h"
#include "model.h"

namespace lockstep::trainer {

class ShardPlan;  // shard.h

// A step's collectives of one kind so far.
struct KindTotals {
  std::uint32_t count = 0;
  std::int64_t micros = 0;
  std::uint64_t bytes = 0;
  KindTotals& operator+=(const KindTotals& more) {
    count += more.count;
    micros += more.micros;
    bytes += more.bytes;
    return *this;
  }
  // As a step report's entry, of which the compute thread waited `exposedUs` (at most all of it).
  CollectiveTimes reported(CollectiveKind kind, std::int64_t exposedUs) const {
    return CollectiveTimes{kind, count, micros, std::min(exposedUs, micros), bytes};
  }
};

// When one bucket of a step became final, began its all-reduce and ended it.
struct BucketTiming {
  std::chrono::steady_clock::time_point ready, start, end;
};

class GradientReducer {
 public:
  // `record`: where the rank's progress goes (its collectives), or null. `shards`: reduce-scatter
  // each bucket onto the ranks that own its parts (the header is still all-reduced), or null:
  // all-reduce every bucket.
  GradientReducer(Comm& comm, float* grads, std::vector<Bucket> buckets, std::chrono::milliseconds timeout,
                  progress::Writer* record = nullptr, const ShardPlan* shards = nullptr);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Bucket ends: where backward splits its work.
  std::vector<std::size_t> cuts() const;

  void beginStep();
  // grads[0, end) is final for this step.
  void markReady(std::size_t end);
  // Blocks until bucket `index` is reduced. Fails with the communication error, or a timeout.
  Result<void> waitBucket(std::size_t index);

  // The step's buckets so far (those reduced have all three times).
  std::vector<BucketTiming> timings() const;

  // Totals of the current step so far.
  std::int64_t allreduceMicros() const;
  std::uint64_t bytesReduced() const;
  KindTotals allReduces() const;
  KindTotals reduceScatters() const;

  // Whether the compute thread yields to communication (see above).
  bool yieldsCompute() const { return canYield_; }

  // Stops and joins the thread. A collective in flight ends by its own timeout at the latest.
  void shutdown();

 private:
  void run();
  // One bucket's collectives; adds to the totals (under the lock).
  Result<void> reduce(const Bucket& bucket, std::uint32_t number, std::chrono::microseconds delay);
  Result<void> timed(CollectiveKind kind, std::uint32_t number, std::size_t floats, std::chrono::microseconds delay,
                     const std::function<Result<void>()>& call);
  void yieldComputeToCommunication(bool yield);

  Comm& comm_;
  float* grads_;
  std::vector<Bucket> buckets_;
  std::chrono::milliseconds timeout_;
  progress::Writer* record_;
  const ShardPlan* shards_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t readyEnd_ = 0;    // grads[0, readyEnd_) final
  std::size_t ready_ = 0;       // buckets final this step
  std::size_t launched_ = 0;    // buckets handed to the collective this step
  std::size_t reduced_ = 0;     // buckets finished this step
  bool stopping_ = false;
  bool computeYielding_ = false;  // main thread only
  bool canYield_ = false;
  std::optional<Error> error_;
  KindTotals allReduce_, reduceScatter_;
  std::vector<BucketTiming> timings_;
  std::uint64_t steps_ = 0;                      // this reducer's beginStep calls, for the test's delay
  std::chrono::microseconds delay_{0};           // LOCKSTEP_TEST_COMM_DELAY (dist_env.h)
  std::thread thread_;
};

}  // namespace lockstep::trainer
