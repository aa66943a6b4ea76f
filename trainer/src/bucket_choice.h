#pragma once
// A rank's gradient buckets as both loops choose them: --bucket-mb's, or the plan from every rank's
// measurements (bucket_plan.h, bucket_measure.h); rank 0 notes the choice in the job's events.

#include <utility>
#include <vector>

#include "bucket_plan.h"
#include "comm.h"
#include "lockstep/common/result.h"
#include "model.h"
#include "rank_host.h"

namespace lockstep::trainer {

// --bucket-mb's buckets, noted.
std::vector<Bucket> fixedBuckets(const RankHost& host, const ParamLayout& layout);

// Every rank's measurements made one (agreeOnFigures), the plan they give, and its note; `since`:
// when measuring began. Collective. A failed agreement is diagnosed (RankHost::diagnoseCommFailure).
Result<std::pair<BucketPlan, PlanFigures>> agreeAndChoose(RankHost& host, Comm& comm, const ParamLayout& layout,
                                                          const PlanFigures& mine, Clock::time_point since);

}  // namespace lockstep::trainer
