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

// The gradients are reduced by now (the collectives ran in backward): the optimizer updates this
// rank's part, and with stage 2 the parts are gathered.
Result<void> CpuLoop::applySharded(Step& st, double lr) {
  st.exposed += std::chrono::microseconds(sharded_->allReduces().micros + sharded_->reduceScatters().micros +
                                          sharded_->allGathers().micros);
  if (const auto& failed = sharded_->error()) {
    return host_.diagnoseCommFailure(*failed, "during step " + std::to_string(st.index + 1));
  }
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
  // Every collective ran on the compute thread: all of it is exposed.
  auto entry = [](CollectiveKind kind, const KindTotals& t) {
    return CollectiveTimes{kind, t.count, t.micros, t.micros, t.bytes};
  };
  KindTotals gathers = sharded_->allGathers();
  gathers.count += st.allGather.count;
  gathers.micros += st.allGather.micros;
  gathers.bytes += st.allGather.bytes;
  report.collectives.push_back(entry(CollectiveKind::kAllReduce, sharded_->allReduces()));
  report.collectives.push_back(entry(CollectiveKind::kReduceScatter, sharded_->reduceScatters()));
  report.collectives.push_back(entry(CollectiveKind::kAllGather, gathers));
}

Result<void> CpuLoop::gatherWholeParameters(std::vector<float>& into, const char* why) {
  s_.progress.enter(RankPhase::kCommunicate);
  if (auto r = sharded_->gatherAll(into); !r) return host_.diagnoseCommFailure(r.error(), why);
  return {};
}

}  // namespace lockstep::trainer
