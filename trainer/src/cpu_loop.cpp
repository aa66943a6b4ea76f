#include "cpu_loop.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <thread>

#include "bucket_choice.h"
#include "optimizer.h"
#include "shm_comm.h"

namespace lockstep::trainer {

CpuLoop::CpuLoop(RankHost& host) : host_(host), options_(host.options()), env_(host.env()), s_(host.state()) {}

CpuLoop::~CpuLoop() = default;

Result<void> CpuLoop::setUp() {
  const JobSpec& spec = options_.spec;
  // With --balance dynamic a rank may take up to 4 per-rank batches of a micro-step.
  maxRows_ = spec.rebalanceEvery > 0 && env_.worldSize > 1
                 ? static_cast<std::uint32_t>(std::min<std::uint64_t>(std::uint64_t{spec.batchPerRank} * env_.worldSize,
                                                                      std::uint64_t{spec.batchPerRank} * 4))
                 : spec.batchPerRank;
  model_ = std::make_unique<Mlp>(*s_.layout, spec.activation, maxRows_);
  LOCKSTEP_ASSIGN_OR_RETURN(slowdown_, testSlowdown(env_.rank));
  return {};
}

Result<std::unique_ptr<Comm>> CpuLoop::connect(StoreClient* store, const std::string& keyPrefix) {
  keyPrefix_ = keyPrefix;
  std::unique_ptr<Comm> comm;
  if (store != nullptr) {
    const auto timeout = commTimeout(options_.spec);
    LOCKSTEP_ASSIGN_OR_RETURN(comm, connectGloo(*store, glooMesh(options_.spec, *store, keyPrefix + "gloo/",
                                                                 static_cast<int>(env_.rank),
                                                                 static_cast<int>(env_.worldSize))));
    // All ranks on this node: all-reduce through shared memory (shm_comm.h), unless asked not to.
    const char* allReduce = std::getenv("LOCKSTEP_ALLREDUCE");
    if (env_.localWorldSize == env_.worldSize && (allReduce == nullptr || std::string(allReduce) != "gloo")) {
      LOCKSTEP_ASSIGN_OR_RETURN(comm, connectSharedMemory(std::move(comm), *store, keyPrefix + "shm/",
                                                          gradientFloats(), timeout));
    }
  }
  // The gradients live where the all-reduce reads them, if it can read them in place.
  grads_ = reducibleBuffer(comm.get(), gradientFloats(), ownGrads_);
  return comm;
}

// The gradient buffer: the whole, or with sharded gradients one staged bucket.
std::size_t CpuLoop::gradientFloats() {
  if (!stagesGradients()) return s_.layout->totalFloats();
  if (buckets_.empty()) buckets_ = stagedBuckets();
  return ShardedLayers::stagingFloats(buckets_);
}

// Without --bucket-mb, the buckets are chosen from this job's measurements (bucket_plan.h), on a
// batch of the data set's first rows; the time it takes is start-up.
Result<void> CpuLoop::setUpBuckets() {
  const JobSpec& spec = options_.spec;
  std::vector<Bucket> buckets;
  if (spec.bucketMb > 0) {
    buckets = fixedBuckets(host_, *s_.layout);
  } else {
    const auto start = Clock::now();
    // A batch of the per-rank size (a step's slice may be short or empty at an epoch's end).
    const auto rows = static_cast<std::uint32_t>(std::min<std::uint64_t>(spec.batchPerRank, s_.data.samples));
    std::vector<std::uint32_t> firstRows(rows);
    std::iota(firstRows.begin(), firstRows.end(), 0u);
    std::vector<float> x(std::size_t{rows} * s_.data.dim);
    std::vector<std::int32_t> labels(rows);
    s_.data.gather(firstRows, x.data(), labels.data());
    const CpuStepProbe probe{*model_,  *s_.layout, spec.optimizer, s_.params.data(), x.data(), labels.data(), rows,
                             commTimeout(spec)};
    auto mine = measureCpuStep(*s_.comm, probe);
    if (!mine) return host_.diagnoseCommFailure(mine.error(), "measuring the all-reduce");
    LOCKSTEP_ASSIGN_OR_RETURN(auto planned, agreeAndChoose(host_, *s_.comm, *s_.layout, *mine, start));
    buckets = planned.first.buckets;
    planWatch_ = std::make_unique<PlanWatch>(*s_.layout, std::move(planned.second), std::move(planned.first));
  }
  reduceIn(std::move(buckets));
  return {};
}

// The gradient reducer for this plan; the one before it, if any, is shut down first (its
// collectives are done: this runs between steps) and Gloo forgets the buffers it was bound to.
void CpuLoop::reduceIn(std::vector<Bucket> buckets) {
  if (reducer_) {
    reducer_->shutdown();
    s_.comm->releaseBuffers();
  }
  reducer_ = std::make_unique<GradientReducer>(*s_.comm, grads_, std::move(buckets), commTimeout(options_.spec),
                                               &s_.progress.record(), s_.shards.get());
}

// Re-plans when the measurements drifted (PlanWatch), after step `step` on every rank alike.
Result<void> CpuLoop::replanIfDrifted(std::uint64_t step) {
  if (!planWatch_) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(auto replanned, planWatch_->check(*s_.comm, step));
  if (!replanned) return {};
  reduceIn(planWatch_->plan().buckets);
  host_.note(*replanned);
  return {};
}

Result<void> CpuLoop::train(StepAccounting& accounting) {
  weights_ = s_.params.data();
  batchX_.assign(std::size_t{maxRows_} * s_.data.dim, 0.0f);
  batchY_.assign(maxRows_, 0);
  if (options_.spec.sync == Sync::kParameterServer && s_.comm) return trainWithServer(accounting);
  const double lr = effectiveLearningRate(options_.spec);
  if (s_.shards && stagesGradients()) {
    setUpShardedLayers();
  } else {
    if (s_.comm) LOCKSTEP_TRY(setUpBuckets());
    cuts_ = reducer_ ? reducer_->cuts() : std::vector<std::size_t>{};
    buckets_ = reducer_ ? reducer_->buckets() : std::vector<Bucket>{{0, s_.layout->totalFloats()}};
  }
  accounting.start(buckets_.size());
  if (env_.rank == 0 && !options_.quiet && reducer_ && !reducer_->yieldsCompute()) {
    std::fprintf(stderr,
                 "[lockstep] note: this process may not return from SCHED_IDLE (needs CAP_SYS_NICE or "
                 "`ulimit -e 20`), so communication competes with compute for CPU time\n");
  }
  for (std::uint64_t step = s_.firstStep; step < s_.totalSteps; ++step) {
    LOCKSTEP_ASSIGN_OR_RETURN(const bool goOn, runStep(step, lr, accounting));
    if (!goOn) break;
  }
  // The ranks leave together next (RankRunner::finishRun): no bucket of this loop's in flight then.
  if (reducer_) reducer_->shutdown();
  // Sharded parameters: the whole, for the saved weights (every rank has the same options).
  if (sharded_ && sharded_->shardsParameters() && !options_.saveWeightsPath.empty()) {
    return gatherWholeParameters(s_.params, "gathering the parameters at the end");
  }
  return {};
}

Result<bool> CpuLoop::runStep(std::uint64_t step, double lr, StepAccounting& accounting) {
  Step st;
  st.index = step;
  st.dataIndex = step;
  st.start = Clock::now();
  s_.progress.enter(RankPhase::kCompute);
  if (reducer_) reducer_->beginStep();
  for (std::uint32_t micro = 0; micro < options_.spec.accumSteps; ++micro) computeMicroStep(st, micro);
  LOCKSTEP_TRY(reduceAndApply(st, lr));
  return afterStep(st, lr, accounting);
}

void CpuLoop::computeMicroStep(Step& st, std::uint32_t micro) {
  const auto dataStart = Clock::now();
  s_.sampler->indices(st.dataIndex, micro, env_.rank, indices_);
  s_.data.gather(indices_, batchX_.data(), batchY_.data());
  st.data += Clock::now() - dataStart;

  const auto n = static_cast<std::uint32_t>(indices_.size());
  const bool last = micro + 1 == options_.spec.accumSteps;
  if (sharded_) sharded_->beginMicroStep(micro == 0, last);
  const auto modelStart = Clock::now();
  if (slowdown_ > 1.0) {
    // A test knob: stand in for slower hardware by idling (slowdown - 1) x the last compute time.
    std::this_thread::sleep_for(lastComputeTime_ * (slowdown_ - 1.0));
  }
  const auto computeStart = Clock::now();
  const auto waitedBefore = sharded_ ? sharded_->waited() : Clock::duration::zero();
  st.localLossSum += sharded_ ? model_->forward(*sharded_, batchX_.data(), batchY_.data(), n)
                              : model_->forward(weights_, batchX_.data(), batchY_.data(), n);
  st.localSamples += n;
  if (last) {
    float* header = sharded_ ? sharded_->header().data() : grads_;
    header[kLossSum] = static_cast<float>(st.localLossSum);
    header[kSampleCount] = static_cast<float>(st.localSamples);
    header[kStopVotes] = host_.stopSignal() != 0 ? 1.0f : 0.0f;
    st.backwardStart = Clock::now();
  }
  if (sharded_) {
    model_->backward(*sharded_, false, cuts_);  // each micro-step's gradient is reduced as it comes
  } else {
    model_->backward(weights_, grads_, micro > 0, cuts_, [&](std::size_t end) {
      if (last && reducer_) reducer_->markReady(end);
    });
  }
  if (last) st.backwardEnd = Clock::now();
  // Waiting for the peers (a staging slot, a layer) is not this rank's compute: a re-split and the
  // slowdown knob weigh compute alone.
  const auto waited = sharded_ ? sharded_->waited() - waitedBefore : Clock::duration::zero();
  lastComputeTime_ = Clock::now() - computeStart - waited;
  st.model += Clock::now() - modelStart - waited;
}

// Applies each bucket as soon as it is reduced; the first carries the header.
Result<void> CpuLoop::reduceAndApply(Step& st, double lr) {
  if (sharded_) return applySharded(st, lr);
  const auto optimizerBegins = Clock::now();
  s_.optimizer->beginStep(lr);
  st.optimizer += Clock::now() - optimizerBegins;
  float gradScale = 0.0f;
  if (reducer_) s_.progress.enter(RankPhase::kCommunicate);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (reducer_) {
      const auto waitStart = Clock::now();
      if (auto r = reducer_->waitBucket(b); !r) {
        return host_.diagnoseCommFailure(r.error(), "during step " + std::to_string(st.index + 1));
      }
      st.exposed += Clock::now() - waitStart;
    }
    if (b == 0) gradScale = 1.0f / grads_[kSampleCount];
    const auto applyStart = Clock::now();
    s_.optimizer->apply(s_.params.data(), grads_, buckets_[b].begin, buckets_[b].end, gradScale);
    st.optimizer += Clock::now() - applyStart;
  }
  if (s_.shards) LOCKSTEP_TRY(gatherParameters(st));
  st.end = Clock::now();
  return {};
}

Result<void> CpuLoop::gatherParameters(Step& st) {
  const std::size_t first = ParamLayout::kHeaderFloats, total = s_.layout->totalFloats();
  const auto start = Clock::now();
  s_.progress.record().collectiveBegin(0, 0, static_cast<std::uint32_t>(CollectiveKind::kAllGather));
  if (auto r = s_.comm->allGather(s_.params.data() + first, s_.shards->partsOf(first, total)); !r) {
    return host_.diagnoseCommFailure(r.error(), "gathering the parameters after step " + std::to_string(st.index + 1));
  }
  s_.progress.record().collectiveEnd();
  const auto took = Clock::now() - start;
  st.exposed += took;
  st.allGather = {1, micros(took), (total - first) * sizeof(float)};
  return {};
}

StepReport CpuLoop::reportOf(const Step& st, double lr, double globalLoss, const StepAccounting& accounting) const {
  StepReport report = accounting.report(st.index + 1, st.localSamples, st.localLossSum, globalLoss, lr);
  report.dataTimeUs = micros(st.data);
  report.exposedCommTimeUs = micros(st.exposed);
  report.stepTimeUs = micros(st.end - st.start);
  report.computeTimeUs = std::max<std::int64_t>(0, report.stepTimeUs - micros(st.data) - micros(st.exposed));
  report.optimizerTimeUs = std::min(micros(st.optimizer), *report.computeTimeUs);
  report.allreduceTimeUs = reducer_ ? reducer_->allreduceMicros() : 0;
  report.bytesReduced = reducer_ ? reducer_->bytesReduced() : 0;
  addShardFigures(st, report);
  return report;
}

void CpuLoop::addShardFigures(const Step& st, StepReport& report) const {
  if (sharded_) {
    report.optimizerStateBytes = s_.optimizer->stateBytes();
    return addShardedLayerFigures(st, report);
  }
  if (st.exchange) return psWorker_->addFigures(*st.exchange, s_.params.size(), s_.layout->totalFloats(), report);
  report.paramBytes = s_.params.size() * sizeof(float);
  report.gradBytes = s_.layout->totalFloats() * sizeof(float);
  report.optimizerStateBytes = s_.optimizer->stateBytes();
  if (!s_.shards || !reducer_) return;  // all-reduce only: the report's all-reduce fields say it all
  // The wait for the buckets is the reduce-scatters' (the header's all-reduce is tiny and
  // goes first); the all-gather is waited on whole.
  const KindTotals allReduce = reducer_->allReduces(), reduceScatter = reducer_->reduceScatters();
  const std::int64_t bucketWait = *report.exposedCommTimeUs - st.allGather.micros;
  if (reduceScatter.count > 0) {
    // The all-reduce is the header's alone: its bandwidth would say nothing of the gradients'.
    report.allreduceTimeUs.reset();
    report.bytesReduced.reset();
    report.collectives.push_back(allReduce.reported(CollectiveKind::kAllReduce, 0));
    report.collectives.push_back(reduceScatter.reported(CollectiveKind::kReduceScatter, bucketWait));
  } else {
    report.collectives.push_back(allReduce.reported(CollectiveKind::kAllReduce, bucketWait));
  }
  report.collectives.push_back(st.allGather.reported(CollectiveKind::kAllGather, st.allGather.micros));
}

// Rank 0's checkpoint after 1-based `step`, when one is due or the ranks voted to stop. The copy
// is quick; the file is written on the writer's thread while training goes on.
Result<void> CpuLoop::checkpointIfDue(std::uint64_t step, bool stopVoted) {
  const JobSpec& spec = options_.spec;
  const bool checkpointDue = spec.checkpointEvery > 0 && step % spec.checkpointEvery == 0;
  if (!(checkpointDue || (stopVoted && spec.checkpointEvery > 0))) return {};
  // Sharded, the file still holds every parameter's optimizer state: every rank gives its part.
  std::unique_ptr<Optimizer> gathered;
  std::vector<float> wholeParameters;  // sharded parameters, gathered
  if (s_.shards && !spec.checkpointDir.empty()) {
    s_.progress.enter(RankPhase::kCommunicate);
    auto full = gatherOptimizer(*s_.comm, *s_.shards, *s_.optimizer, *s_.layout);
    if (!full) return host_.diagnoseCommFailure(full.error(), "gathering the optimizer state for a checkpoint");
    gathered = std::move(*full);
    if (sharded_ && sharded_->shardsParameters()) {
      LOCKSTEP_TRY(gatherWholeParameters(wholeParameters, "gathering the parameters for a checkpoint"));
    }
  }
  if (!s_.checkpoints) return {};
  s_.progress.enter(RankPhase::kCheckpoint);
  const auto copyStart = Clock::now();
  const std::vector<float>& params = wholeParameters.empty() ? s_.params : wholeParameters;
  LOCKSTEP_TRY(s_.checkpoints->submit(snapshotCheckpoint(step, s_.resume, params, gathered ? *gathered : *s_.optimizer)));
  host_.notePhase("checkpoint", copyStart, step);
  return {};
}

// The reduced step's report, checkpoint, re-split and re-plan. Returns whether to go on.
Result<bool> CpuLoop::afterStep(const Step& st, double lr, StepAccounting& accounting) {
  const JobSpec& spec = options_.spec;
  const std::uint64_t step = st.index + 1;
  const float* header = reducedHeader();
  const double globalLoss = static_cast<double>(header[kLossSum]) / header[kSampleCount];
  const bool stopVoted = header[kStopVotes] > 0.0f;
  const StepReport report = reportOf(st, lr, globalLoss, accounting);
  if (planWatch_) planWatch_->noteStep(reducer_->timings(), st.backwardStart, st.backwardEnd);
  LOCKSTEP_TRY(checkpointIfDue(step, stopVoted));
  LOCKSTEP_ASSIGN_OR_RETURN(const bool reachedTarget,
                            accounting.record(report, static_cast<std::uint64_t>(header[kSampleCount]), globalLoss,
                                              step == s_.totalSteps || stopVoted));
  // Forward and backward only: they grow with the rows, unlike the optimizer, which every rank
  // runs over all parameters.
  if (st.localSamples > 0) costs_.push_back(static_cast<double>(micros(st.model)) / st.localSamples);
  if (spec.rebalanceEvery > 0 && s_.comm && step % spec.rebalanceEvery == 0 && !stopVoted && !reachedTarget) {
    if (auto r = rebalance(std::move(costs_), step); !r) return host_.diagnoseCommFailure(r.error(), "re-splitting the batch");
    costs_.clear();
  }
  if (!stopVoted && !reachedTarget && planWatch_) {
    if (auto r = replanIfDrifted(step); !r) return host_.diagnoseCommFailure(r.error(), "re-planning the buckets");
    cuts_ = reducer_->cuts();
    buckets_ = reducer_->buckets();
  }
  if (stopVoted) accounting.stopVoted(host_.stopSignal());
  return !stopVoted && !reachedTarget;
}

Result<void> CpuLoop::rebalance(std::vector<double> costs, std::uint64_t step) {
  const JobSpec& spec = options_.spec;
  std::vector<float>& cost = rankCosts_;
  cost.assign(env_.worldSize, 0.0f);  // same size each time: the buffer does not move
  // The median step: a step the scheduler or the page cache held up says nothing about speed.
  if (!costs.empty()) {
    std::nth_element(costs.begin(), costs.begin() + static_cast<std::ptrdiff_t>(costs.size() / 2), costs.end());
    cost[env_.rank] = static_cast<float>(costs[costs.size() / 2]);
  }
  s_.progress.enter(RankPhase::kCommunicate);
  LOCKSTEP_TRY(s_.comm->allReduceSum(cost.data(), cost.size()));
  const auto split = splitByCost(cost, spec.batchPerRank * env_.worldSize, maxRows_, s_.sampler->split());
  if (split == s_.sampler->split()) return {};
  s_.sampler->setSplit(split);
  if (env_.rank == 0 && !options_.quiet) {
    std::string rows, costText;
    for (std::size_t r = 0; r < split.size(); ++r) {
      rows += (r ? ", " : "") + std::to_string(split[r]);
      char text[32];
      std::snprintf(text, sizeof text, "%s%.1f", r ? ", " : "", cost[r]);
      costText += text;
    }
    std::fprintf(stderr, "[lockstep] after step %llu: rows per rank %s (measured us per sample: %s)\n",
                 static_cast<unsigned long long>(step), rows.c_str(), costText.c_str());
  }
  return {};
}

}  // namespace lockstep::trainer
