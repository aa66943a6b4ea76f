#pragma once
// The CPU training loop (--backend cpu): forward and backward through BLAS, the gradient buckets
// all-reduced on the reducer's thread while backward goes on (Gloo, or shared memory when every
// rank is on one node), each bucket's optimizer as soon as it is reduced. It owns what only the
// CPU needs: the model, the gradient buffer, the reducer and its bucket plan (measured at start-up,
// re-planned when the steps drift: PlanWatch) and --balance dynamic's re-splits.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bucket_measure.h"
#include "model.h"
#include "ps_worker.h"
#include "rank_loop.h"
#include "rank_state.h"
#include "step_accounting.h"
#include "reducer.h"
#include "sharded_layers.h"

namespace lockstep::trainer {

class CpuLoop final : public RankLoop {
 public:
  explicit CpuLoop(RankHost& host);
  ~CpuLoop() override;
  CpuLoop(const CpuLoop&) = delete;
  CpuLoop& operator=(const CpuLoop&) = delete;

  bool pinsCpus() const override { return true; }
  Result<void> setUp() override;
  // Gloo among the ranks, all-reducing through shared memory when all are on this node.
  Result<std::unique_ptr<Comm>> connect(StoreClient* store, const std::string& keyPrefix) override;
  Result<void> train(StepAccounting& accounting) override;

 private:
  // One step as it runs: its times and this rank's share of the loss.
  struct Step {
    std::uint64_t index = 0;      // 0-based; the report's step is index + 1
    std::uint64_t dataIndex = 0;  // the global step whose samples it takes (asynchronous: this rank's own count)
    Clock::time_point start, end;
    Clock::time_point backwardStart, backwardEnd;  // the last micro-step's, which the reducer follows
    Clock::duration data{}, model{}, exposed{}, optimizer{};
    KindTotals allGather;  // sharded: the parameters, after the optimizer
    std::optional<PsExchange> exchange;  // with a parameter server
    double localLossSum = 0.0;
    std::uint32_t localSamples = 0;
  };

  // Gradient buckets: --bucket-mb's, or chosen by measurement, and re-chosen when it drifts.
  Result<void> setUpBuckets();
  void reduceIn(std::vector<Bucket> buckets);
  Result<void> replanIfDrifted(std::uint64_t step);

  // --sync parameter-server (ps_worker.h): the steps, each computed on the weights the server sent last.
  Result<void> trainWithServer(StepAccounting& accounting);
  Result<void> recordServerStep(Step& step, double lr, StepAccounting& accounting, const PsHeader& reply);

  // --shard gradients|parameters (sharded_layers.h): the buckets, staged one at a time (--bucket-mb's
  // or 1 MiB), and the layers each rank keeps its part of.
  bool stagesGradients() const;
  std::size_t gradientFloats();
  std::vector<Bucket> stagedBuckets() const;
  void setUpShardedLayers();
  Result<void> applySharded(Step& step, double lr);
  void addShardedLayerFigures(const Step& step, StepReport& report) const;
  // The step's sums of the header (loss, samples, stop votes): in the gradient buffer, or the sharded layers'.
  const float* reducedHeader() const { return sharded_ ? sharded_->header().data() : grads_; }
  // Stage 3: the whole parameters, gathered onto every rank (collective), for a checkpoint or the end.
  Result<void> gatherWholeParameters(std::vector<float>& into, const char* why);

  // One step; returns whether to go on.
  Result<bool> runStep(std::uint64_t step, double lr, StepAccounting& accounting);
  void computeMicroStep(Step& step, std::uint32_t micro);
  Result<void> reduceAndApply(Step& step, double lr);
  // Sharded: every rank's updated part of the parameters, to every rank.
  Result<void> gatherParameters(Step& step);
  // What the step's report says the rank holds and did: bytes of state, collectives by kind.
  void addShardFigures(const Step& step, StepReport& report) const;
  StepReport reportOf(const Step& step, double lr, double globalLoss, const StepAccounting& accounting) const;
  Result<void> checkpointIfDue(std::uint64_t step, bool stopVoted);
  Result<bool> afterStep(const Step& step, double lr, StepAccounting& accounting);
  // --balance dynamic: shares each rank's time per sample (per step since the last re-split) and
  // re-splits.
  Result<void> rebalance(std::vector<double> costs, std::uint64_t step);

  RankHost& host_;
  const jobflags::TrainerOptions& options_;
  const DistEnv& env_;
  RankState& s_;

  std::unique_ptr<Mlp> model_;
  std::uint32_t maxRows_ = 0;  // the most rows of a micro-step this rank may get (the split's cap)
  double slowdown_ = 1.0;      // LOCKSTEP_TEST_SLOWDOWN: this rank computes this many times slower
  std::vector<float> ownGrads_;
  float* grads_ = nullptr;  // the communicator's in-place buffer (reducibleBuffer), or ownGrads_
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<ShardedLayers> sharded_;  // --shard gradients|parameters, instead of the reducer
  std::unique_ptr<PlanWatch> planWatch_;  // buckets chosen by measurement (no --bucket-mb)
  // The ranks' times per sample for a re-split. One buffer for the run: Gloo keeps an algorithm per
  // buffer address, and every rank must reduce the same buffers in the same order.
  std::vector<float> rankCosts_;

  // The reducer's plan, re-read when it is re-planned between steps; or the staged buckets.
  std::vector<std::size_t> cuts_;
  std::vector<Bucket> buckets_;
  std::vector<std::uint32_t> indices_;
  std::vector<float> batchX_;
  std::vector<std::int32_t> batchY_;
  std::vector<double> costs_;  // this rank's forward + backward time per sample, each step since the last re-split
  Clock::duration lastComputeTime_{};

  // With a parameter server.
  std::string keyPrefix_;  // the job's keys in the store
  std::unique_ptr<PsWorker> psWorker_;
  float* weights_ = nullptr;       // what forward and backward read: the rank state's params
  bool voteToStop_ = false;        // the target loss was reached: the next push says so
};

}  // namespace lockstep::trainer
