#include "bucket_choice.h"

#include <cstdio>

#include "bucket_measure.h"

namespace lockstep::trainer {

std::vector<Bucket> fixedBuckets(const RankHost& host, const ParamLayout& layout) {
  const double bucketMb = host.options().spec.bucketMb;
  auto buckets = cappedBuckets(layout, static_cast<std::size_t>(bucketMb * 1024 * 1024));
  char given[48];
  std::snprintf(given, sizeof given, "%g", bucketMb);
  host.note("buckets: " + describeBuckets(buckets) + " (--bucket-mb " + given + ")");
  return buckets;
}

Result<std::pair<BucketPlan, PlanFigures>> agreeAndChoose(RankHost& host, Comm& comm, const ParamLayout& layout,
                                                          const PlanFigures& mine, Clock::time_point since) {
  auto figures = agreeOnFigures(comm, mine);
  if (!figures) return host.diagnoseCommFailure(figures.error(), "agreeing on the bucket plan");
  BucketPlan plan = chooseBuckets(layout, *figures);
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
  host.note(describePlan(plan, *figures) + "; measured in " + std::to_string(took) + " ms at start-up");
  return std::pair<BucketPlan, PlanFigures>(std::move(plan), std::move(*figures));
}

}  // namespace lockstep::trainer
