#include "cuda_loop.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "bucket_choice.h"
#include "cuda_check.h"
#include "gpu_plan.h"
#include "lockstep/protocol/names.h"

namespace lockstep::trainer {

Result<std::unique_ptr<RankLoop>> makeCudaLoop(RankHost& host) {
  return std::unique_ptr<RankLoop>(std::make_unique<gpu::CudaLoop>(host));
}

bool cudaBackendBuilt() { return true; }

namespace gpu {

CudaLoop::CudaLoop(RankHost& host) : host_(host), options_(host.options()), env_(host.env()), s_(host.state()) {}

CudaLoop::~CudaLoop() = default;

bool CudaLoop::stagesGradients() const {
  return s_.shards && (options_.spec.shard == Shard::kGradients || options_.spec.shard == Shard::kParameters);
}

bool CudaLoop::withServer() const { return options_.spec.sync == Sync::kParameterServer && env_.worldSize > 1; }

Result<std::unique_ptr<Comm>> CudaLoop::connect(StoreClient* store, const std::string& keyPrefix) {
  keyPrefix_ = keyPrefix;
  LOCKSTEP_ASSIGN_OR_RETURN(const int device, pickDevice(env_.localRank));
  LOCKSTEP_CUDA(cudaSetDevice(device));
  if (withServer() && store != nullptr) {
    // The start-up broadcasts and the final barrier go over the hosts' mesh, as the pushes do: no
    // NCCL communicator, so several ranks may share one GPU.
    return connectGloo(*store, glooMesh(options_.spec, *store, keyPrefix + "gloo/", static_cast<int>(env_.rank),
                                        static_cast<int>(env_.worldSize)));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto comm, NcclComm::connect(store, keyPrefix, static_cast<int>(env_.rank),
                                                         static_cast<int>(env_.worldSize), commTimeout(options_.spec)));
  return std::unique_ptr<Comm>(std::move(comm));
}

Result<void> CudaLoop::train(StepAccounting& accounting) {
  if (withServer()) return trainWithServer(accounting);
  nccl_ = dynamic_cast<NcclComm*>(s_.comm.get());
  if (!nccl_) return Error{ErrorCode::kInternal, "the CUDA loop runs without its NCCL communicator"};
  LOCKSTEP_TRY(start(/*keepsOptimizer=*/true));
  LOCKSTEP_TRY(chooseBuckets());
  for (const auto& b : buckets_) bytesPerStep_ += (b.end - b.begin) * sizeof(float);
  accounting.start(buckets_.size());
  if (env_.rank == 0 && !options_.quiet) {
    std::fprintf(stderr, "[lockstep] GPU %d, %s, epilogues: %s; %d GEMM shapes timed\n", device_,
                 std::string(nameOf(options_.spec.precision)).c_str(),
                 model_->epilogues().c_str(), model_->tunedGemms());
  }
  LOCKSTEP_TRY(runSteps(accounting));
  s_.progress.enter(RankPhase::kCommunicate);  // at stage 3, the parts are gathered
  if (auto copied = downloadParameters(); !copied) return fail(copied.error(), accounting.summary().stepsDone);
  return checkpointAtSignal(accounting.summary());
}

Result<void> CudaLoop::start(bool keepsOptimizer) {
  LOCKSTEP_CUDA(cudaGetDevice(&device_));
  const std::size_t stateBegin = keepsOptimizer ? s_.optimizer->rangeBegin() : 0;
  const std::size_t stateEnd = keepsOptimizer ? s_.optimizer->rangeEnd() : 0;
  if (stagesGradients()) {
    LOCKSTEP_ASSIGN_OR_RETURN(sharded_, GpuShardedLayers::create(*nccl_, *s_.layout, *s_.shards,
                                                                options_.spec.shard == Shard::kParameters));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(model_, GpuModel::create(*s_.layout, options_.spec, s_.data, device_, stateBegin, stateEnd,
                                                     sharded_.get()));
  if (keepsOptimizer) {
    for (const auto& b : s_.optimizer->stateBuffers()) optimizerState_.push_back(b.data);
  }
  LOCKSTEP_TRY(model_->upload(s_.params.data(), optimizerState_));
  lr_ = effectiveLearningRate(options_.spec);
  LOCKSTEP_TRY(slots_.init());
  compute_ = model_->computeStream();
  comm_ = nccl_ ? nccl_->stream() : nullptr;
  grads_ = model_->grads();
  if (sharded_) sharded_->start(compute_, model_->params());
  return {};
}

Result<void> CudaLoop::chooseBuckets() {
  if (sharded_) {
    // A layer at a time, as backward stages them; the header is all-reduced on its own.
    if (options_.spec.bucketMb > 0) {
      host_.note("--bucket-mb does not apply to --shard " + std::string(nameOf(options_.spec.shard)) +
                 " on GPUs: each layer is staged and reduced as one");
    }
    for (std::size_t l = s_.layout->layerCount(); l-- > 0;) {
      buckets_.push_back({s_.layout->layerBegin(l), s_.layout->layerEnd(l)});
    }
    return {};
  }
  if (options_.spec.bucketMb > 0) {
    buckets_ = fixedBuckets(host_, *s_.layout);
    return {};
  }
  // The time it takes is start-up.
  const auto planStart = Clock::now();
  s_.sampler->indices(s_.firstStep, 0, env_.rank, indices_);
  auto mine = measureGpuStep(*nccl_, *model_, *s_.layout, indices_);
  if (!mine) return fail(mine.error(), s_.firstStep + 1);
  auto planned = agreeAndChoose(host_, *nccl_, *s_.layout, *mine, planStart);
  if (!planned) return fail(planned.error(), s_.firstStep + 1);
  buckets_ = planned->first.buckets;
  return {};
}

Result<void> CudaLoop::runSteps(StepAccounting& accounting) {
  LOCKSTEP_CUDA(cudaEventRecord(slots_.start(), compute_));
  cudaEvent_t previousEnd = slots_.start();
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::uint32_t> nextRows, prepare(s_.firstStep, nullptr));
  StepSlot* pending = nullptr;  // the step before the one just enqueued
  cudaEvent_t pendingPreviousEnd = nullptr;
  bool stopAfterThis = false;
  for (std::uint64_t step = s_.firstStep; step < s_.totalSteps && !stopAfterThis; ++step) {
    s_.progress.enter(RankPhase::kCompute);
    StepSlot& slot = slots_[step];
    slot.step = step + 1;
    slot.rows = nextRows;
    slot.localSamples = std::accumulate(slot.rows.begin(), slot.rows.end(), 0u);
    slot.commStarted = false;
    s_.optimizer->beginStep(lr_);
    LOCKSTEP_TRY(enqueueStep(step, slot, previousEnd));

    // The next batch, into the other slot, once the step before this one has finished reading it.
    if (step + 1 < s_.totalSteps) {
      LOCKSTEP_ASSIGN_OR_RETURN(nextRows, prepare(step + 1, pending ? pending->backwardEnd : nullptr));
    }
    // Meanwhile: the previous step's figures.
    if (pending) {
      s_.progress.enter(RankPhase::kCommunicate);
      LOCKSTEP_ASSIGN_OR_RETURN(stopAfterThis, report(*pending, pendingPreviousEnd, false, accounting));
    }
    pendingPreviousEnd = previousEnd;
    previousEnd = slot.end;
    pending = &slot;
    LOCKSTEP_TRY(checkpointIfDue(step + 1, slot));
  }
  if (pending) {
    s_.progress.enter(RankPhase::kCommunicate);
    LOCKSTEP_TRY(report(*pending, pendingPreviousEnd, true, accounting));
  }
  return {};
}

Result<std::vector<std::uint32_t>> CudaLoop::prepare(std::uint64_t step, cudaEvent_t slotFree) {
  std::vector<std::uint32_t> counts;
  for (std::uint32_t micro = 0; micro < options_.spec.accumSteps; ++micro) {
    s_.sampler->indices(step, micro, env_.rank, indices_);
    counts.push_back(static_cast<std::uint32_t>(indices_.size()));
    LOCKSTEP_TRY(model_->prepareBatch(static_cast<int>(step % 2), micro, indices_, micro == 0 ? slotFree : nullptr));
  }
  return counts;
}

Result<void> CudaLoop::enqueueStep(std::uint64_t step, StepSlot& slot, cudaEvent_t previousEnd) {
  const JobSpec& spec = options_.spec;
  // Compute: after the previous step's optimizer (it wrote the weights) and this step's batch.
  LOCKSTEP_CUDA(cudaStreamWaitEvent(compute_, previousEnd));
  LOCKSTEP_CUDA(cudaStreamWaitEvent(compute_, model_->batchReady(static_cast<int>(step % 2), 0)));
  LOCKSTEP_CUDA(cudaEventRecord(slot.computeStart, compute_));
  model_->beginStep(static_cast<float>(slot.localSamples), host_.stopSignal() != 0 ? 1.0f : 0.0f);
  std::size_t launched = 0;
  Result<void> commError;
  std::uint32_t micro = 0;
  const auto layerDone = [&](std::size_t end, cudaEvent_t ready) {
    if (!sharded_) return launchReady(slot, launched, end, ready, commError);
    if (commError) commError = reduceStagedLayer(slot, micro, end, ready);
  };
  if (sharded_) sharded_->newStep(step + 1 - s_.firstStep);  // this process's steps, as the CPU reducer counts
  for (micro = 0; micro < spec.accumSteps; ++micro) {
    LOCKSTEP_TRY(model_->forwardBackward(static_cast<int>(step % 2), micro, slot.rows[micro], micro + 1 == spec.accumSteps,
                                         layerDone));
  }
  if (!commError) return fail(commError.error(), step + 1);
  LOCKSTEP_CUDA(cudaEventRecord(slot.backwardEnd, compute_));
  LOCKSTEP_CUDA(cudaStreamWaitEvent(comm_, slot.backwardEnd));  // the step ends after its backward, too
  if (sharded_ && sharded_->shardsParameters()) {
    // Stage 3 gathers nothing after the step: forward gathers each layer as it needs it.
    LOCKSTEP_CUDA(cudaEventRecord(slot.gatherStart, comm_));
    slot.layerGathers = sharded_->gathers();
    slot.gatheredFloats = sharded_->gatheredFloats();
  } else if (s_.shards) {
    if (auto gathered = gatherParameters(slot); !gathered) return fail(gathered.error(), step + 1);
  }
  LOCKSTEP_CUDA(cudaMemcpyAsync(slot.header, grads_, 3 * sizeof(float), cudaMemcpyDeviceToHost, comm_));
  LOCKSTEP_CUDA(cudaEventRecord(slot.end, comm_));
  return {};
}

void CudaLoop::launchReady(StepSlot& slot, std::size_t& launched, std::size_t end, cudaEvent_t ready,
                           Result<void>& commError) {
  std::vector<NcclComm::Range> ranges;
  const std::size_t first = launched;
  while (launched < buckets_.size() && buckets_[launched].end <= end) {
    ranges.push_back({grads_ + buckets_[launched].begin, buckets_[launched].end - buckets_[launched].begin});
    ++launched;
  }
  if (ranges.empty() || !commError) return;
  if (auto r = cudaStreamWaitEvent(comm_, ready); r != cudaSuccess) {
    commError = cudaError(r, "cudaStreamWaitEvent");
    return;
  }
  if (!slot.commStarted) {
    // This rank's own loss, before the reduction sums it with the others'.
    cudaMemcpyAsync(slot.localLoss, grads_ + kLossSum, sizeof(float), cudaMemcpyDeviceToHost, comm_);
    cudaEventRecord(slot.commStart, comm_);
    slot.commStarted = true;
  }
  if (s_.shards) {
    for (std::size_t b = first; b < launched && commError; ++b) {
      if (auto r = reduceShardedBucket(buckets_[b]); !r) commError = r.error();
    }
    return;
  }
  if (auto r = nccl_->allReduceAsync(ranges.data(), ranges.size()); !r) {
    commError = r.error();
    return;
  }
  for (std::size_t b = first; b < launched; ++b) {
    model_->applyOptimizer(buckets_[b].begin, buckets_[b].end, *s_.optimizer, comm_);
  }
}

Result<void> CudaLoop::reduceShardedBucket(const Bucket& bucket) {
  const std::size_t first = std::max(bucket.begin, ParamLayout::kHeaderFloats);
  if (bucket.begin < first) {
    // The header: the optimizers read the global sample count from it, after this.
    NcclComm::Range header{grads_ + bucket.begin, first - bucket.begin};
    LOCKSTEP_TRY(nccl_->allReduceAsync(&header, 1));
  }
  if (first >= bucket.end) return {};
  LOCKSTEP_TRY(nccl_->reduceToOwnersAsync({grads_ + first, s_.shards->partsOf(first, bucket.end)}));
  applyOptimizerToOwnPart(first, bucket.end);
  return {};
}

void CudaLoop::applyOptimizerToOwnPart(std::size_t begin, std::size_t end) {
  begin = std::max(begin, s_.optimizer->rangeBegin());
  end = std::min(end, s_.optimizer->rangeEnd());
  if (begin < end) model_->applyOptimizer(begin, end, *s_.optimizer, comm_);
}

Result<void> CudaLoop::reduceStagedLayer(StepSlot& slot, std::uint32_t micro, std::size_t end, cudaEvent_t ready) {
  const ParamLayout& layout = *s_.layout;
  std::size_t layer = 0;
  while (layer < layout.layerCount() && layout.layerEnd(layer) != end) ++layer;
  if (layer == layout.layerCount()) return Error{ErrorCode::kInternal, "no layer ends at " + std::to_string(end)};
  const bool firstLayer = layer + 1 == layout.layerCount();  // backward's first
  const bool lastMicro = micro + 1 == options_.spec.accumSteps;
  LOCKSTEP_CUDA(cudaStreamWaitEvent(comm_, ready));
  if (firstLayer && micro == 0) LOCKSTEP_CUDA(cudaEventRecord(slot.commStart, comm_));
  if (firstLayer && lastMicro) {
    // This rank's own loss, then the header summed over the ranks: the optimizers read its sample count.
    LOCKSTEP_CUDA(cudaMemcpyAsync(slot.localLoss, grads_ + kLossSum, sizeof(float), cudaMemcpyDeviceToHost, comm_));
    NcclComm::Range header{grads_, ParamLayout::kHeaderFloats};
    LOCKSTEP_TRY(nccl_->allReduceAsync(&header, 1));
  }
  LOCKSTEP_TRY(sharded_->reduce(layer, ready, micro == 0));
  if (lastMicro) applyOptimizerToOwnPart(layout.layerBegin(layer), end);
  return {};
}

Result<void> CudaLoop::downloadParameters() {
  LOCKSTEP_TRY(model_->download(s_.params.data(), optimizerState_));
  if (!sharded_ || !sharded_->shardsParameters()) return {};
  const std::size_t first = ParamLayout::kHeaderFloats;
  return nccl_->allGather(s_.params.data() + first, s_.shards->partsOf(first, s_.layout->totalFloats()));
}

Result<void> CudaLoop::gatherParameters(StepSlot& slot) {
  LOCKSTEP_CUDA(cudaEventRecord(slot.gatherStart, comm_));
  const std::size_t first = ParamLayout::kHeaderFloats, total = s_.layout->totalFloats();
  LOCKSTEP_TRY(nccl_->broadcastFromOwnersAsync({model_->params() + first, s_.shards->partsOf(first, total)}));
  model_->refreshLowCopy(first, total, comm_);
  return {};
}

void CudaLoop::addMemoryAndKinds(const StepSlot& slot, StepReport& r) const {
  r.paramBytes = model_->paramBytes() + (sharded_ ? sharded_->gatheredLayerBytes() : 0);
  r.gradBytes = sharded_ ? sharded_->gradBytes() : std::uint64_t{s_.layout->totalFloats()} * sizeof(float);
  r.optimizerStateBytes = s_.optimizer->stateBytes();
  if (!s_.shards) return;
  // The all-reduce is the header's alone: its figures would say nothing of the gradients'.
  r.allreduceTimeUs.reset();
  r.bytesReduced.reset();
  const auto us = [](double v) { return static_cast<std::int64_t>(v); };
  const std::int64_t scatter = us(elapsedUs(slot.commStart, slot.gatherStart));
  const std::int64_t gather = us(elapsedUs(slot.gatherStart, slot.end));
  const std::int64_t scatterExposed = us(elapsedUs(slot.backwardEnd, slot.gatherStart));
  // Staged, every micro-step reduce-scatters its layers.
  const std::uint32_t scatters = sharded_ ? options_.spec.accumSteps : 1;
  r.collectives.push_back({CollectiveKind::kReduceScatter, static_cast<std::uint32_t>(buckets_.size()) * scatters,
                           scatter, std::clamp<std::int64_t>(scatterExposed, 0, scatter), bytesPerStep_ * scatters});
  if (sharded_ && sharded_->shardsParameters()) {
    // Stage 3's gathers run between the layers' compute; their time is not told apart from it on GPUs.
    r.collectives.push_back({CollectiveKind::kAllGather, slot.layerGathers, 0, 0, slot.gatheredFloats * sizeof(float)});
    return;
  }
  const std::uint64_t paramsBytes = (s_.layout->totalFloats() - ParamLayout::kHeaderFloats) * sizeof(float);
  r.collectives.push_back({CollectiveKind::kAllGather, 1, gather, gather, paramsBytes});
}

Result<bool> CudaLoop::report(StepSlot& slot, cudaEvent_t previousEnd, bool lastStep, StepAccounting& accounting) {
  if (auto done = nccl_->wait(slot.end); !done) return fail(done.error(), slot.step);
  const float* h = slot.header;
  const double globalLoss = static_cast<double>(h[kLossSum]) / h[kSampleCount];
  const bool stopVoted = h[kStopVotes] > 0.0f;
  StepReport r = accounting.report(slot.step, slot.localSamples, *slot.localLoss, globalLoss, lr_);
  r.dataTimeUs = static_cast<std::int64_t>(elapsedUs(previousEnd, slot.computeStart));
  r.computeTimeUs = static_cast<std::int64_t>(elapsedUs(slot.computeStart, slot.backwardEnd));
  r.exposedCommTimeUs = static_cast<std::int64_t>(elapsedUs(slot.backwardEnd, slot.end));
  r.stepTimeUs = static_cast<std::int64_t>(elapsedUs(previousEnd, slot.end));
  r.allreduceTimeUs = static_cast<std::int64_t>(elapsedUs(slot.commStart, slot.end));
  r.bytesReduced = std::uint64_t{bytesPerStep_};
  addMemoryAndKinds(slot, r);
  LOCKSTEP_ASSIGN_OR_RETURN(const bool reached,
                            accounting.record(r, static_cast<std::uint64_t>(h[kSampleCount]), globalLoss,
                                              lastStep || stopVoted));
  if (stopVoted) accounting.stopVoted(host_.stopSignal());
  return stopVoted || reached;
}

Result<void> CudaLoop::checkpointIfDue(std::uint64_t step, StepSlot& slot) {
  const JobSpec& spec = options_.spec;
  if (spec.checkpointEvery == 0 || step % spec.checkpointEvery != 0 || !takesPartInCheckpoints()) return {};
  s_.progress.enter(RankPhase::kCheckpoint);
  if (auto done = nccl_->wait(slot.end); !done) return fail(done.error(), step);
  return checkpoint(step);  // the step is done: what follows is the checkpoint's
}

Result<void> CudaLoop::checkpointAtSignal(const RunSummary& summary) {
  const JobSpec& spec = options_.spec;
  if (summary.stoppedBySignal == 0 || spec.checkpointEvery == 0 || summary.stepsDone % spec.checkpointEvery == 0 ||
      !takesPartInCheckpoints()) {
    return {};
  }
  return checkpoint(summary.stepsDone);
}

bool CudaLoop::gathersForCheckpoints() const { return s_.shards && !options_.spec.checkpointDir.empty(); }

bool CudaLoop::takesPartInCheckpoints() const { return s_.checkpoints || gathersForCheckpoints(); }

Result<void> CudaLoop::checkpoint(std::uint64_t step) {
  const auto copyStart = Clock::now();
  if (auto copied = downloadParameters(); !copied) return fail(copied.error(), step);
  std::unique_ptr<Optimizer> whole;  // sharded: every rank's part of the state, gathered
  if (gathersForCheckpoints()) {
    s_.progress.enter(RankPhase::kCommunicate);
    auto gathered = gatherOptimizer(*nccl_, *s_.shards, *s_.optimizer, *s_.layout);
    if (!gathered) return fail(gathered.error(), step);
    whole = std::move(*gathered);
  }
  if (!s_.checkpoints) return {};
  s_.progress.enter(RankPhase::kCheckpoint);
  LOCKSTEP_TRY(s_.checkpoints->submit(snapshotCheckpoint(step, s_.resume, s_.params, whole ? *whole : *s_.optimizer)));
  host_.notePhase("checkpoint", copyStart, step);
  return {};
}

Error CudaLoop::fail(const Error& error, std::uint64_t step) {
  if (nccl_) nccl_->abort();  // kernels of a broken collective would otherwise hold up every later free
  const std::string when = "during step " + std::to_string(step);
  if (s_.store) return host_.diagnoseCommFailure(error, when);
  host_.markCommBroken();
  return error.withContext("rank 0 " + when);
}

}  // namespace gpu
}  // namespace lockstep::trainer
