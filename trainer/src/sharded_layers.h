#pragma once
// --shard gradients and --shard parameters (ZeRO stages 2 and 3; docs/trainer.md), on CPUs.
//
// Gradients: backward writes each bucket into one staging slot (the communicator's in-place
// buffer, so that shared memory reduce-scatters it without a copy); when the bucket is final it is
// reduce-scattered and this rank keeps its part, [plan.begin(rank), plan.end(rank)), adding it up
// over a step's micro-steps. A rank holds its part of the gradients and one bucket, not the whole.
// The header (loss, samples, stop votes) is all-reduced on its own with the first bucket.
//
// Parameters (stage 3 only): a rank keeps its part; forward and backward all-gather a layer when
// they reach it, into one layer's buffer that the next layer's gather reuses. After the optimizer
// updates the part, nothing is gathered until the next forward needs it.
//
// The collectives run on the calling (compute) thread, in the order backward reaches them, so the
// gradients' communication is exposed, not overlapped. A failed collective is kept (error()) and no
// further one is started: the step's figures are then garbage and the caller returns the error.

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
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
  // `params`: the whole parameters, of which this rank keeps its part (stage 3) or which it reads
  // (stage 2; the caller all-gathers them after each step). `staging`: at least stagingFloats(buckets)
  // floats. `record`: where the rank's progress goes (its collectives), or null.
  ShardedLayers(Comm& comm, const ParamLayout& layout, const ShardPlan& plan, std::vector<Bucket> buckets,
                bool shardParameters, const std::vector<float>& params, float* staging, progress::Writer* record);

  // The floats a slot must hold for these buckets: the largest.
  static std::size_t stagingFloats(const std::vector<Bucket>& buckets);

  // Before each micro-step's forward; the first of a step restarts the step's figures.
  void beginMicroStep(bool firstOfStep);
  // The header this rank contributes (set before the last micro-step's backward), and after the
  // last bucket of that backward the sums over every rank.
  std::array<float, 3>& header() { return header_; }
  const std::array<float, 3>& header() const { return header_; }

  const float* parameters(std::size_t layer) override;
  float* gradients(std::size_t offset, std::size_t count) override;
  void ready(std::size_t end) override;

  // The first failed collective since the last beginMicroStep(true), if any.
  const std::optional<Error>& error() const { return error_; }

  // Applies the optimizer (whose range is this rank's part) to the part.
  void applyOptimizer(Optimizer& optimizer, float gradScale, std::vector<float>& params);
  // Stage 3: every rank's part into `into` (the whole buffer), for a checkpoint or the saved weights.
  Result<void> gatherAll(std::vector<float>& into);

  bool shardsParameters() const { return shardParameters_; }
  std::uint64_t paramBytes() const;
  std::uint64_t gradBytes() const { return (ownGrads_.size() + stagingFloats_) * sizeof(float); }
  const KindTotals& allReduces() const { return allReduce_; }
  const KindTotals& reduceScatters() const { return reduceScatter_; }
  const KindTotals& allGathers() const { return allGather_; }

 private:
  // Starts bucket `index` in the slot: zeroed, so that padding and rows backward does not write sum to 0.
  void open(std::size_t index);
  // Reduce-scatters the open bucket and adds this rank's part to its gradients.
  void reduceOpen();
  // Reduce-scatters data, the flat range [lo, hi), and adds this rank's part to its gradients.
  void keepOwnPart(float* data, std::size_t lo, std::size_t hi);
  Result<void> timed(CollectiveKind kind, KindTotals& totals, std::size_t floats, const std::function<Result<void>()>& call);

  Comm& comm_;
  const ParamLayout& layout_;
  const ShardPlan& plan_;
  std::vector<Bucket> buckets_;
  bool shardParameters_;
  const std::vector<float>& params_;
  float* staging_;
  std::size_t stagingFloats_;
  progress::Writer* record_;
  std::size_t begin_, end_;  // this rank's part of the flat buffer

  std::vector<float> ownParams_;  // stage 3: params[begin_, end_)
  std::vector<float> ownGrads_;   // gradients of [begin_, end_), summed over ranks and micro-steps
  std::vector<float> layer_;      // stage 3: the layer gathered last
  std::optional<std::size_t> gathered_;  // which layer layer_ holds, while it is current

  std::array<float, 3> header_{};
  std::vector<float> headerSums_ = std::vector<float>(3);  // one buffer for the run: Gloo binds to it
  bool firstMicroStep_ = true;
  std::size_t open_ = 0;     // the bucket in the slot
  bool opened_ = false;      // whether the slot holds bucket open_ yet
  std::size_t reduced_ = 0;  // buckets reduced this micro-step
  std::optional<Error> error_;
  KindTotals allReduce_, reduceScatter_, allGather_;
};

}  // namespace lockstep::trainer
