#pragma once
// Choosing gradient buckets from measurements (docs/trainer.md, "How buckets are chosen").
//
// A step's backward makes the gradient buffer final from its start to its end; each bucket is
// all-reduced, in order, as soon as backward has passed its end; after backward the main thread
// waits for each bucket in turn and applies the optimizer to it. What the bucket plan changes is
// how much of that waiting is left after backward (exposed communication) and how many
// all-reduces' fixed costs the step pays. This file simulates a step from measured figures and
// picks the plan with the earliest step end. It is pure: the figures come from bucket_measure.h
// (or from a test), and the same figures give the same plan on every rank.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model.h"

namespace lockstep::trainer {

// All-reduce time against message size on one communicator: measured points, linear between them
// and beyond the last, never below the smallest message's time for smaller ones.
struct CommCurve {
  std::vector<double> bytes;   // ascending
  std::vector<double> micros;  // all-reduce time at each size
  double at(double messageBytes) const;
  // The fit "a ms + b ms/MB" over the measured points (least squares), for people.
  std::string describe() const;
};

struct PlanFigures {
  CommCurve allReduce;
  // When backward had made grads[0, readyEnds[i]) final, in microseconds from its start, compute
  // alone. Ascending; the last entry is the whole buffer and the backward's duration.
  std::vector<std::size_t> readyEnds;
  std::vector<double> readyMicros;
  double optimizerMicrosPerFloat = 0;
  // Compute time lost per microsecond an all-reduce runs (0: communication does not slow compute,
  // as on a GPU; 1: it stops compute, as when it shares the rank's only core).
  double contention = 0;
  std::uint32_t worldSize = 1;
  // Ranges become final only at the measured points (the GPU loop launches a layer's buckets when
  // the layer is done), not gradually between them.
  bool readyOnlyAtPoints = false;

  double backwardMicros() const { return readyMicros.empty() ? 0 : readyMicros.back(); }
  // When grads[0, end) is final, interpolated between the measured points.
  double readyAt(std::size_t end) const;
};

// Buckets of at most capBytes, the first at most 1 MiB, as PyTorch DDP cuts them so that
// communication starts early: --bucket-mb's plan, and each plan chooseBuckets weighs.
std::vector<Bucket> cappedBuckets(const ParamLayout& layout, std::size_t capBytes);

// What a plan is expected to cost per step, from the backward's start.
struct StepForecast {
  double stepMicros = 0;     // to the end of the last bucket's optimizer
  double exposedMicros = 0;  // the main thread waiting for all-reduce after backward
  double backwardEndMicros = 0;  // when backward ends, slowed by the all-reduces beside it
};

StepForecast simulateStep(const std::vector<Bucket>& buckets, const PlanFigures& figures);

struct BucketPlan {
  std::vector<Bucket> buckets;
  std::size_t capBytes = 0;      // the cap it was cut with (planBuckets)
  StepForecast forecast;
  StepForecast defaultForecast;  // the fixed 25 MB plan's, for comparison
};

// The plan with the earliest forecast step end among caps from 16 KiB to the whole buffer (the
// first bucket capped at 1 MiB, as PyTorch DDP does); where several come within 1%, the one with
// the fewest buckets, whose forecast leans least on the measured fixed cost per all-reduce.
BucketPlan chooseBuckets(const ParamLayout& layout, const PlanFigures& figures);

// "9 buckets of ~0.8 MB", for a fixed plan as for a chosen one.
std::string describeBuckets(const std::vector<Bucket>& buckets);
// One line for the job's events: the plan, the figures it rests on and its forecast.
std::string describePlan(const BucketPlan& plan, const PlanFigures& figures);

}  // namespace lockstep::trainer
