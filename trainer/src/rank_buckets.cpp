// The gradient buckets of a CPU rank: --bucket-mb's, or chosen from this job's measurements
// (bucket_plan.h, bucket_measure.h) and re-chosen when the steps drift; and the notes that tell the
// job's events what was chosen.

#include <cstdio>
#include <numeric>

#include "bucket_measure.h"
#include "lockstep/common/clock.h"
#include "rank_state.h"

namespace lockstep::trainer {

using std::chrono::milliseconds;

std::vector<Bucket> RankRunner::fixedBuckets() const {
  const JobSpec& spec = options_.spec;
  auto buckets = cappedBuckets(*state_->layout, static_cast<std::size_t>(spec.bucketMb * 1024 * 1024));
  char given[48];
  std::snprintf(given, sizeof given, "%g", spec.bucketMb);
  note("buckets: " + describeBuckets(buckets) + " (--bucket-mb " + given + ")");
  return buckets;
}

// Without --bucket-mb, the buckets are chosen from this job's measurements (bucket_plan.h), on a
// batch of the data set's first rows; the time it takes is start-up.
Result<void> RankRunner::setUpCpuBuckets() {
  State& s = *state_;
  const JobSpec& spec = options_.spec;
  std::vector<Bucket> buckets;
  if (spec.bucketMb > 0) {
    buckets = fixedBuckets();
  } else {
    const auto start = Clock::now();
    // A batch of the per-rank size (a step's slice may be short or empty at an epoch's end).
    const auto rows = static_cast<std::uint32_t>(std::min<std::uint64_t>(spec.batchPerRank, s.data.samples));
    std::vector<std::uint32_t> firstRows(rows);
    std::iota(firstRows.begin(), firstRows.end(), 0u);
    std::vector<float> x(std::size_t{rows} * s.data.dim);
    std::vector<std::int32_t> labels(rows);
    s.data.gather(firstRows, x.data(), labels.data());
    const CpuStepProbe probe{*s.model,      *s.layout, spec.optimizer, s.params.data(), x.data(), labels.data(), rows,
                             commTimeout()};
    auto mine = measureCpuStep(*s.comm, probe);
    if (!mine) return diagnoseCommFailure(mine.error(), "measuring the all-reduce");
    LOCKSTEP_ASSIGN_OR_RETURN(auto planned, agreeAndChoose(*s.comm, *mine, start));
    buckets = planned.first.buckets;
    s.planWatch = std::make_unique<PlanWatch>(*s.layout, std::move(planned.second), std::move(planned.first));
  }
  reduceIn(std::move(buckets));
  return {};
}

milliseconds RankRunner::commTimeout() const { return milliseconds(std::int64_t{options_.spec.timeoutS} * 1000); }

// The gradient reducer for this plan; the one before it, if any, is shut down first (its
// collectives are done: this runs between steps) and Gloo forgets the buffers it was bound to.
void RankRunner::reduceIn(std::vector<Bucket> buckets) {
  State& s = *state_;
  if (s.reducer) {
    s.reducer->shutdown();
    s.comm->releaseBuffers();
  }
  s.reducer = std::make_unique<GradientReducer>(*s.comm, s.grads, std::move(buckets), commTimeout(),
                                                &s.progress.record());
}

// Every rank's measurements made one (agreeOnFigures), the plan they give, and its note; `since`:
// when measuring began.
Result<std::pair<BucketPlan, PlanFigures>> RankRunner::agreeAndChoose(Comm& comm, const PlanFigures& mine,
                                                                      Clock::time_point since) {
  auto figures = agreeOnFigures(comm, mine);
  if (!figures) return diagnoseCommFailure(figures.error(), "agreeing on the bucket plan");
  BucketPlan plan = chooseBuckets(*state_->layout, *figures);
  const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - since).count();
  note(describePlan(plan, *figures) + "; measured in " + std::to_string(took) + " ms at start-up");
  return std::pair<BucketPlan, PlanFigures>(std::move(plan), std::move(*figures));
}

// Re-plans when the measurements drifted (PlanWatch), after step `step` on every rank alike.
Result<void> RankRunner::replanIfDrifted(std::uint64_t step) {
  State& s = *state_;
  if (!s.planWatch) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(auto replanned, s.planWatch->check(*s.comm, step));
  if (!replanned) return {};
  reduceIn(s.planWatch->plan().buckets);
  note(*replanned);
  return {};
}

// Rank 0 tells the job's events (through its agent) and its log what it decided.
void RankRunner::note(const std::string& text) const {
  if (env_.rank != 0) return;
  if (!options_.quiet) std::fprintf(stderr, "[lockstep] %s\n", text.c_str());
  JobEvent event;
  event.jobId = options_.spec.jobId;
  event.kind = JobEventKind::kNote;
  event.timeUnixUs = unixMicrosNow();
  event.rank = env_.rank;
  event.message = text;
  if (state_->metrics) state_->metrics->note(event);
}

}  // namespace lockstep::trainer
