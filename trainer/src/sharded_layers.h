#pragma once
// --shard gradients and --shard parameters (ZeRO stages 2 and 3; docs/trainer.md), on CPUs.
//
// Gradients: backward writes each bucket into a staging slot (two of them, in the communicator's
// in-place buffer, so that shared memory reduce-scatters it without a copy); when the bucket is
// final it is reduce-scattered while backward goes on into the other slot, and this rank keeps its
// part, [plan.begin(rank), plan.end(rank)), adding it up over a step's micro-steps. A rank holds
// its part of the gradients and two buckets, not the whole. The header (loss, samples, stop votes)
// is all-reduced on its own after the step's last bucket. Where the communicator has no
// reduce-scatter of its own (Gloo), a bucket is all-reduced whole, its slot's full size, so that Gloo
// keeps one algorithm (and its buffers) per slot, not one per bucket.
//
// Parameters (stage 3 only): a rank keeps its part; a layer is all-gathered when forward or
// backward reaches it, into one of two layer buffers, and the next layer is gathered into the other
// while this one computes. After the optimizer updates the part nothing is gathered until the next
// forward needs it.
//
// Threading: the compute thread calls everything; the collectives run in the order it asks for them
// on this object's communication thread, the only caller of the communicator while a step's
// buckets or layers are in flight (finish() waits for them). The order of asks is the same on every
// rank, so the ranks' collectives match. A failed collective is kept (error()) and no further one is
// started: the step's figures are then garbage and the caller returns the error.

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "comm.h"
#include "lockstep/common/progress.h"
#include "model.h"
#include "optimizer.h"
#include "reducer.h"
#include "shard.h"

namespace lockstep::trainer {

class ShardedLayers final : public LayerStore {
 public:
  static constexpr std::size_t kSlots = 2;

  // `params`: the whole parameters, of which this rank keeps its part (stage 3) or which it reads
  // (stage 2; the caller all-gathers them after each step). `staging`: stagingFloats(buckets)
  // floats. `record`: where the rank's progress goes (its collectives), or null.
  ShardedLayers(Comm& comm, const ParamLayout& layout, const ShardPlan& plan, std::vector<Bucket> buckets,
                bool shardParameters, const std::vector<float>& params, float* staging, progress::Writer* record);
  ~ShardedLayers() override;
  ShardedLayers(const ShardedLayers&) = delete;
  ShardedLayers& operator=(const ShardedLayers&) = delete;

  // The floats of the staging slots for these buckets.
  static std::size_t stagingFloats(const std::vector<Bucket>& buckets);

  // Before each micro-step's forward; the first of a step restarts the step's figures, the last
  // all-reduces the header after its last bucket.
  void beginMicroStep(bool firstOfStep, bool lastOfStep);
  // The header this rank contributes (set before the last micro-step's backward), and after
  // finish() the sums over every rank.
  std::array<float, 3>& header() { return header_; }
  const std::array<float, 3>& header() const { return header_; }

  const float* parameters(std::size_t layer) override;
  float* gradients(std::size_t offset, std::size_t count) override;
  void ready(std::size_t end) override;

  // Waits for every collective asked for; returns the first that failed this step, if any.
  Result<void> finish();

  // Applies the optimizer (whose range is this rank's part) to the part. After finish().
  void applyOptimizer(Optimizer& optimizer, float gradScale, std::vector<float>& params);
  // Stage 3: every rank's part into `into` (the whole buffer), for a checkpoint or the saved weights.
  Result<void> gatherAll(std::vector<float>& into);

  bool shardsParameters() const { return shardParameters_; }
  std::uint64_t paramBytes() const;
  std::uint64_t gradBytes() const { return (ownGrads_.size() + kSlots * slotFloats_) * sizeof(float); }
  // The step's collectives so far (after finish(): all of them).
  KindTotals allReduces() const;
  KindTotals reduceScatters() const;
  KindTotals allGathers() const;
  // How long the compute thread waited this step: for a slot or the last buckets (the
  // reduce-scatters' exposed time), and for a layer (the all-gathers').
  std::chrono::steady_clock::duration waitedForBuckets() const { return waitedForBuckets_; }
  std::chrono::steady_clock::duration waitedForLayers() const { return waitedForLayers_; }
  std::chrono::steady_clock::duration waited() const { return waitedForBuckets_ + waitedForLayers_; }

 private:
  using Ticket = std::uint64_t;
  // Where layer l is gathered to: one of the two buffers, and the collective that fills it.
  struct Held {
    std::optional<std::size_t> layer;
    Ticket ticket = 0;
  };

  float* slot(std::size_t bucket) const { return staging_ + (bucket % kSlots) * slotFloats_; }
  // Starts bucket `index` in its slot, once the bucket before it there is reduced: zeroed, so that
  // padding and the header sum to 0.
  void open(std::size_t index);
  // The slot's bucket, reduce-scattered; this rank's part into its gradients.
  void reduceScatterBucket(std::size_t index, bool firstMicroStep);
  // Stage 3: asks for layer l in the buffer that does not hold layer `keep`.
  Held& gather(std::size_t layer, std::optional<std::size_t> keep);
  void gatherLayer(std::size_t layer, std::vector<float>& into);

  // The communication thread's queue.
  Ticket ask(std::function<void()> collective);
  void waitFor(Ticket ticket, std::chrono::steady_clock::duration& waited);
  void run();
  void timed(CollectiveKind kind, KindTotals& totals, std::size_t floats, const std::function<Result<void>()>& call);

  Comm& comm_;
  const ParamLayout& layout_;
  const ShardPlan& plan_;
  std::vector<Bucket> buckets_;
  bool shardParameters_;
  const std::vector<float>& params_;
  float* staging_;
  std::size_t slotFloats_;
  progress::Writer* record_;
  std::size_t begin_, end_;  // this rank's part of the flat buffer

  std::vector<float> ownParams_;  // stage 3: params[begin_, end_)
  std::vector<float> ownGrads_;   // gradients of [begin_, end_), summed over ranks and micro-steps
  std::array<std::vector<float>, 2> layers_;  // stage 3: gathered layers
  std::array<Held, 2> held_;
  bool backward_ = false;  // which way the layers are asked for: forward's 0, 1, ... or backward's

  std::array<float, 3> header_{};
  std::vector<float> headerSums_ = std::vector<float>(3);  // one buffer for the run: Gloo binds to it
  bool firstMicroStep_ = true, lastMicroStep_ = true;
  std::size_t open_ = 0;     // the bucket backward writes
  bool opened_ = false;      // whether open_ is in its slot yet
  std::size_t asked_ = 0;    // buckets handed to the communication thread this micro-step
  std::vector<Ticket> bucketTickets_;
  std::chrono::steady_clock::duration waitedForBuckets_{}, waitedForLayers_{};

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  Ticket askedTotal_ = 0, doneTotal_ = 0;
  bool stopping_ = false;
  std::optional<Error> error_;
  KindTotals allReduce_, reduceScatter_, allGather_;  // the header's all-reduce is in allReduce_
  std::thread thread_;
};

}  // namespace lockstep::trainer
