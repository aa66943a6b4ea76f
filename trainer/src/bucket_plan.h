#pragma once
// Choosing gradient buckets from measurements (docs/trainer.md, "How buckets are chosen"): among
// the ways planBuckets can cut this model's gradient buffer, the one whose simulated step
// (lockstep/kpi/step_model.h) ends first. Pure: the figures come from bucket_measure.h (or a
// test), and the same figures give the same plan on every rank.

#include <cstddef>
#include <string>
#include <vector>

#include "lockstep/kpi/step_model.h"
#include "model.h"

namespace lockstep::trainer {

using kpi::CommCurve;
using kpi::describeBuckets;
using kpi::simulateStep;
using kpi::StepForecast;
using PlanFigures = kpi::StepFigures;

// Buckets of at most capBytes, the first at most 1 MiB, as PyTorch DDP cuts them so that
// communication starts early: --bucket-mb's plan, and each plan chooseBuckets weighs.
std::vector<Bucket> cappedBuckets(const ParamLayout& layout, std::size_t capBytes);

struct BucketPlan {
  std::vector<Bucket> buckets;
  std::size_t capBytes = 0;      // the cap it was cut with (cappedBuckets)
  StepForecast forecast;
  StepForecast defaultForecast;  // the fixed 25 MB plan's, for comparison
};

// The plan with the earliest forecast step end among caps from 16 KiB to the whole buffer; where
// several come within 1%, the one with the fewest buckets, whose forecast leans least on the
// measured fixed cost per all-reduce.
BucketPlan chooseBuckets(const ParamLayout& layout, const PlanFigures& figures);

// One line for the job's events: the plan, the figures it rests on and its forecast.
std::string describePlan(const BucketPlan& plan, const PlanFigures& figures);

}  // namespace lockstep::trainer
