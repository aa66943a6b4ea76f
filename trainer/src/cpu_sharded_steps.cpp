// CpuLoop's steps with sharded gradients, and parameters (--shard gradients|parameters;
// sharded_layers.h has the layers and the staging).

#include "bucket_choice.h"
#include "bucket_plan.h"
#include "cpu_loop.h"
#include "lockstep/protocol/names.h"

namespace lockstep::trainer {
namespace {

// Without --bucket-mb: a bucket is what a rank stages whole, so it is small, unlike the measured
// plan's, which only weighs time.
constexpr std::size_t kStagedBucketBytes = std::size_t{1} << 20;

}  // namespace

bool CpuLoop::stagesGradients() const {
  const Shard shard = options_.spec.shard;
  return (shard == Shard::kGradients || shard == Shard::kParameters) && env_.worldSize > 1;
}

std::vector<Bucket> CpuLoop::stagedBuckets() const {
  if (options_.spec.bucketMb > 0) return fixedBuckets(host_, *s_.layout);
  auto buckets = cappedBuckets(*s_.layout, kStagedBucketBytes);
  host_.note("buckets: " + describeBuckets(buckets) + " (1 MiB each at most: --shard " +
             std::string(nameOf(options_.spec.shard)) + " stages one at a time)");
  return buckets;
}

void CpuLoop::setUpShardedLayers() {
  const bool parameters = options_.spec.shard == Shard::kParameters;
  sharded_ = std::make_unique<ShardedLayers>(*s_.comm, *s_.layout, *s_.shards, buckets_, parameters, s_.params, grads_,
                                             &s_.progress.record());
  // Stage 3: the rank keeps its part alone (the layers hold it now).
  if (parameters) std::vector<float>().swap(s_.params);
  cuts_.clear();
  for (const auto& b : buckets_) cuts_.push_back(b.end);
}

// Waits for the step's last buckets; the optimizer updates this rank's part, and with stage 2 the
// parts are gathered.
Result<void> CpuLoop::applySharded(Step& st, double lr) {
  s_.progress.enter(RankPhase::kCommunicate);
  const auto finished = sharded_->finish();
  st.exposed += sharded_->waitedForBuckets() + sharded_->waitedForLayers();
  if (!finished) return host_.diagnoseCommFailure(finished.error(), "during step " + std::to_string(st.index + 1));
  const auto optimizerStart = Clock::now();
  s_.optimizer->beginStep(lr);
  sharded_->applyOptimizer(*s_.optimizer, 1.0f / reducedHeader()[kSampleCount], s_.params);
  st.optimizer += Clock::now() - optimizerStart;
  if (!sharded_->shardsParameters()) LOCKSTEP_TRY(gatherParameters(st));
  st.end = Clock::now();
  return {};
}

void CpuLoop::addShardedLayerFigures(const Step& st, StepReport& report) const {
  report.paramBytes = sharded_->paramBytes();
  report.gradBytes = sharded_->gradBytes();
  // No all-reduce of the gradients' own: the collectives say what moved.
  report.allreduceTimeUs.reset();
  report.bytesReduced.reset();
  // The compute thread's waits: for the buckets (the reduce-scatters, or over Gloo the buckets'
  // all-reduces, and the header's all-reduce, which goes last), for a layer, and for stage 2's
  // parameters after the step.
  const auto bucketWait = micros(sharded_->waitedForBuckets());
  const KindTotals allReduce = sharded_->allReduces(), reduceScatter = sharded_->reduceScatters();
  KindTotals gathers = sharded_->allGathers();
  gathers += st.allGather;
  if (reduceScatter.count > 0) {
    report.collectives.push_back(allReduce.reported(CollectiveKind::kAllReduce, 0));
    report.collectives.push_back(reduceScatter.reported(CollectiveKind::kReduceScatter, bucketWait));
  } else {
    report.collectives.push_back(allReduce.reported(CollectiveKind::kAllReduce, bucketWait));
  }
  report.collectives.push_back(gathers.reported(CollectiveKind::kAllGather, micros(sharded_->waitedForLayers()) + st.allGather.micros));
}

Result<void> CpuLoop::gatherWholeParameters(std::vector<float>& into, const char* why) {
  s_.progress.enter(RankPhase::kCommunicate);
  if (auto r = sharded_->gatherAll(into); !r) return host_.diagnoseCommFailure(r.error(), why);
  return {};
}

}  // namespace lockstep::trainer
