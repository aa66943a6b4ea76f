#pragma once
// Measuring what the bucket planner (bucket_plan.h) needs, agreeing on it across ranks, and
// watching it drift while the job runs (docs/trainer.md, "How buckets are chosen").
//
// Every function here that takes the communicator is collective: all ranks call it at the same
// point, between steps, from the thread that owns the communicator then.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bucket_plan.h"
#include "comm.h"
#include "lockstep/common/result.h"
#include "model.h"
#include "optimizer.h"
#include "reducer.h"

namespace lockstep::trainer {

// All-reduce time on `comm` at a few sizes up to `maxBytes`, through a GradientReducer as a step's
// buckets go, the median of three after one to warm up, on `scratch` (at least maxBytes).
Result<CommCurve> measureAllReduce(Comm& comm, float* scratch, std::size_t maxBytes, std::chrono::milliseconds timeout);

// One forward pass, then what the CPU backend's step needs timed: the backward (alone, and again
// while a reducer all-reduces its buckets, for the contention) and the optimizer. The batch is
// rows x layout's input; the gradient and parameter copies are this function's own.
struct CpuStepProbe {
  Mlp& model;
  const ParamLayout& layout;
  const OptimizerSpec& optimizer;
  const float* params;
  const float* x;
  const std::int32_t* labels;
  std::uint32_t rows = 0;
  std::chrono::milliseconds timeout{60000};
};
Result<PlanFigures> measureCpuStep(Comm& comm, const CpuStepProbe& probe);

// The mean of every rank's figures, exactly as rank 0 computed it, so that every rank plans alike.
Result<PlanFigures> agreeOnFigures(Comm& comm, const PlanFigures& mine);

// Watches a running plan: collects each step's all-reduce and backward times, and every `every`
// steps compares them, agreed among the ranks, with what the plan's figures forecast.
class PlanWatch {
 public:
  PlanWatch(const ParamLayout& layout, PlanFigures figures, BucketPlan plan, std::uint64_t every = 100);

  const BucketPlan& plan() const { return plan_; }
  const PlanFigures& figures() const { return figures_; }

  // A finished step's bucket times, and when its backward began and ended.
  void noteStep(const std::vector<BucketTiming>& timings, std::chrono::steady_clock::time_point backwardStart,
                std::chrono::steady_clock::time_point backwardEnd);

  // Collective, after step `step` (every rank the same): at the end of a window, agrees on how far
  // the all-reduce and backward times moved from the figures; when either moved by more than 30%,
  // scales the figures and plans again, and changes plans when another's forecast step is 3%
  // shorter. Returns the new plan's event text then.
  Result<std::optional<std::string>> check(Comm& comm, std::uint64_t step);

 private:
  const ParamLayout& layout_;
  PlanFigures figures_;
  BucketPlan plan_;
  std::uint64_t every_;
  std::vector<float> window_;  // the checks' buffer; resized only with the plan (Gloo binds to it)
  std::vector<std::vector<double>> bucketMicros_;  // this window's all-reduce times, per bucket
  std::vector<double> backwardMicros_;

  Result<std::vector<double>> agreeOnWindow(Comm& comm);
  CommCurve curveOf(const std::vector<double>& bucketMicros) const;
};

// Scales figures by measured drift: all-reduce times by `comm` (their CPU work kept: the contention
// shrinks as they lengthen), compute times by `compute`.
PlanFigures scaledFigures(PlanFigures figures, double comm, double compute);

}  // namespace lockstep::trainer
