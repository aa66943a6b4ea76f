// The GPU training loop (--backend cuda): the same steps, reports and checkpoints as the CPU loop
// in trainer.cpp, with the work enqueued on three streams and the host one step ahead of the GPU.
//
// Per step k (slot k % 2):
//   compute stream: wait for step k-1's optimizer, wait for batch k, header, forward, loss, backward;
//                   after each layer's gradients, an event;
//   comm stream:    per layer event, the buckets it completed: one NCCL group, then the optimizer on
//                   them; at the end the reduced header (loss sum, samples, stop votes) to the host;
//   data stream:    batch k+1 gathered while step k computes.
// The host never waits inside a step: it reads step k-1's header and event times while step k
// runs, so decisions taken from them (stop votes, the target loss) take effect one step later,
// on every rank alike.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include "cuda_check.h"
#include "gpu_model.h"
#include "gpu_plan.h"
#include "lockstep/protocol/names.h"
#include "nccl_comm.h"
#include "rank_state.h"

namespace lockstep::trainer {

namespace {

// The events and pinned header of one step in flight.
struct StepSlot {
  cudaEvent_t computeStart = nullptr, backwardEnd = nullptr, commStart = nullptr, end = nullptr;
  float* header = nullptr;     // reduced: loss sum, samples, stop votes (pinned)
  float* localLoss = nullptr;  // this rank's loss sum before the reduction (pinned)
  std::uint64_t step = 0;      // 1-based; 0: empty
  std::uint32_t localSamples = 0;
  std::vector<std::uint32_t> rows;  // per micro-step
  bool commStarted = false;
};

class StepSlots {
 public:
  ~StepSlots() {
    for (auto& s : slots_) {
      for (auto e : {s.computeStart, s.backwardEnd, s.commStart, s.end}) {
        if (e) cudaEventDestroy(e);
      }
      if (s.header) cudaFreeHost(s.header);
    }
    if (start_) cudaEventDestroy(start_);
  }
  Result<void> init() {
    for (auto& s : slots_) {
      for (auto* e : {&s.computeStart, &s.backwardEnd, &s.commStart, &s.end}) LOCKSTEP_CUDA(cudaEventCreate(e));
      void* pinned = nullptr;
      LOCKSTEP_CUDA(cudaMallocHost(&pinned, 4 * sizeof(float)));
      s.header = static_cast<float*>(pinned);
      s.localLoss = s.header + 3;
    }
    LOCKSTEP_CUDA(cudaEventCreate(&start_));
    return {};
  }
  // Three: the step being enqueued, the one reported meanwhile, and the one before it, whose end
  // event is the reported step's start.
  StepSlot& operator[](std::uint64_t step) { return slots_[step % 3]; }
  cudaEvent_t start() const { return start_; }

 private:
  StepSlot slots_[3];
  cudaEvent_t start_ = nullptr;
};

double elapsedUs(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
    (void)cudaGetLastError();  // a sticky "not ready" would fail the next launch check
    return 0.0;
  }
  return static_cast<double>(ms) * 1e3;
}

}  // namespace

Result<RunSummary> RankRunner::trainCuda() {
  State& s = *state_;
  const JobSpec& spec = options_.spec;
  auto* nccl = dynamic_cast<gpu::NcclComm*>(s.comm.get());
  if (!nccl) return Error{ErrorCode::kInternal, "the CUDA loop runs without its NCCL communicator"};
  int device = 0;
  LOCKSTEP_CUDA(cudaGetDevice(&device));
  LOCKSTEP_ASSIGN_OR_RETURN(auto model, gpu::GpuModel::create(*s.layout, spec, s.data, device));
  std::vector<std::vector<float>*> optimizerState;
  for (const auto& b : s.optimizer->stateBuffers()) optimizerState.push_back(b.data);
  LOCKSTEP_TRY(model->upload(s.params.data(), optimizerState));

  const double lr = effectiveLearningRate(spec);
  StepSlots slots;
  LOCKSTEP_TRY(slots.init());
  const cudaStream_t compute = model->computeStream();
  const cudaStream_t comm = nccl->stream();
  float* grads = model->grads();

  RunSummary summary;
  StepAccounting accounting(options_, env_, s, summary);
  std::uint64_t samplesSeen = 0;
  std::vector<std::uint32_t> indices;

  const auto fail = [&](const Error& e, std::uint64_t step) -> Error {
    nccl->abort();  // kernels of a broken collective would otherwise hold up every later free
    const std::string when = "during step " + std::to_string(step);
    if (s.store) return diagnoseCommFailure(e, when);
    commBroken_ = true;
    return e.withContext("rank 0 " + when);
  };

  std::vector<Bucket> buckets;
  if (spec.bucketMb > 0) {
    buckets = fixedBuckets();
  } else {
    // Chosen from this job's measurements (bucket_plan.h, gpu_plan.h); the time it takes is start-up.
    const auto planStart = Clock::now();
    s.sampler->indices(s.firstStep, 0, env_.rank, indices);
    auto mine = gpu::measureGpuStep(*nccl, *model, *s.layout, indices);
    if (!mine) return fail(mine.error(), s.firstStep + 1);
    auto planned = agreeAndChoose(*nccl, *mine, planStart);
    if (!planned) return fail(planned.error(), s.firstStep + 1);
    buckets = planned->first.buckets;
  }
  std::uint64_t bytesPerStep = 0;
  for (const auto& b : buckets) bytesPerStep += (b.end - b.begin) * sizeof(float);
  const auto runStart = Clock::now();
  accounting.printStart(buckets.size());
  if (env_.rank == 0 && !options_.quiet) {
    std::fprintf(stderr, "[lockstep] GPU %d, %s, epilogues: %s; %d GEMM shapes timed\n", device,
                 std::string(nameOf(spec.precision)).c_str(),
                 model->epilogues().c_str(), model->tunedGemms());
  }

  // Gathers step `step`'s micro-batches into its slot once the step two back is done with it;
  // returns their row counts.
  const auto prepare = [&](std::uint64_t step, cudaEvent_t slotFree) -> Result<std::vector<std::uint32_t>> {
    std::vector<std::uint32_t> counts;
    for (std::uint32_t micro = 0; micro < spec.accumSteps; ++micro) {
      s.sampler->indices(step, micro, env_.rank, indices);
      counts.push_back(static_cast<std::uint32_t>(indices.size()));
      LOCKSTEP_TRY(model->prepareBatch(static_cast<int>(step % 2), micro, indices, micro == 0 ? slotFree : nullptr));
    }
    return counts;
  };

  // Reads a finished step's header and times, and reports it. Returns whether to stop after the
  // step now in flight.
  const auto report = [&](StepSlot& slot, cudaEvent_t previousEnd, bool lastStep) -> Result<bool> {
    if (auto done = nccl->wait(slot.end); !done) return fail(done.error(), slot.step);
    const float* h = slot.header;
    const double globalLoss = static_cast<double>(h[kLossSum]) / h[kSampleCount];
    const bool stopVoted = h[kStopVotes] > 0.0f;
    StepReport r = stepReport(slot.step, slot.localSamples, *slot.localLoss, globalLoss, lr);
    r.dataTimeUs = static_cast<std::int64_t>(elapsedUs(previousEnd, slot.computeStart));
    r.computeTimeUs = static_cast<std::int64_t>(elapsedUs(slot.computeStart, slot.backwardEnd));
    r.exposedCommTimeUs = static_cast<std::int64_t>(elapsedUs(slot.backwardEnd, slot.end));
    r.stepTimeUs = static_cast<std::int64_t>(elapsedUs(previousEnd, slot.end));
    r.allreduceTimeUs = static_cast<std::int64_t>(elapsedUs(slot.commStart, slot.end));
    r.bytesReduced = std::uint64_t{bytesPerStep};
    samplesSeen += static_cast<std::uint64_t>(h[kSampleCount]);
    LOCKSTEP_ASSIGN_OR_RETURN(const bool reached,
                              accounting.record(r, static_cast<std::uint64_t>(h[kSampleCount]), globalLoss,
                                                lastStep || stopVoted));
    if (stopVoted) summary.stoppedBySignal = stopSignal_.load() != 0 ? stopSignal_.load() : 15;
    return stopVoted || reached;
  };

  LOCKSTEP_CUDA(cudaEventRecord(slots.start(), compute));
  cudaEvent_t previousEnd = slots.start();
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<std::uint32_t> nextRows, prepare(s.firstStep, nullptr));
  StepSlot* pending = nullptr;  // the step before the one just enqueued
  cudaEvent_t pendingPreviousEnd = nullptr;
  bool stopAfterThis = false;
  std::uint64_t step = s.firstStep;
  for (; step < s.totalSteps && !stopAfterThis; ++step) {
    s.progress.enter(RankPhase::kCompute);
    StepSlot& slot = slots[step];
    slot.step = step + 1;
    slot.rows = nextRows;
    slot.localSamples = std::accumulate(slot.rows.begin(), slot.rows.end(), 0u);
    slot.commStarted = false;
    s.optimizer->beginStep(lr);

    // Compute: after the previous step's optimizer (it wrote the weights) and this step's batch.
    LOCKSTEP_CUDA(cudaStreamWaitEvent(compute, previousEnd));
    LOCKSTEP_CUDA(cudaStreamWaitEvent(compute, model->batchReady(static_cast<int>(step % 2), 0)));
    LOCKSTEP_CUDA(cudaEventRecord(slot.computeStart, compute));
    model->beginStep(static_cast<float>(slot.localSamples), stopSignal_.load() != 0 ? 1.0f : 0.0f);
    std::size_t launched = 0;
    Result<void> commError;
    const auto layerDone = [&](std::size_t end, cudaEvent_t ready) {
      std::vector<gpu::NcclComm::Range> ranges;
      const std::size_t first = launched;
      while (launched < buckets.size() && buckets[launched].end <= end) {
        ranges.push_back({grads + buckets[launched].begin, buckets[launched].end - buckets[launched].begin});
        ++launched;
      }
      if (ranges.empty() || !commError) return;
      if (auto r = cudaStreamWaitEvent(comm, ready); r != cudaSuccess) {
        commError = gpu::cudaError(r, "cudaStreamWaitEvent");
        return;
      }
      if (!slot.commStarted) {
        // This rank's own loss, before the reduction sums it with the others'.
        cudaMemcpyAsync(slot.localLoss, grads + kLossSum, sizeof(float), cudaMemcpyDeviceToHost, comm);
        cudaEventRecord(slot.commStart, comm);
        slot.commStarted = true;
      }
      if (auto r = nccl->allReduceAsync(ranges.data(), ranges.size()); !r) {
        commError = r.error();
        return;
      }
      for (std::size_t b = first; b < launched; ++b) {
        model->applyOptimizer(buckets[b].begin, buckets[b].end, *s.optimizer, comm);
      }
    };
    for (std::uint32_t micro = 0; micro < spec.accumSteps; ++micro) {
      LOCKSTEP_TRY(model->forwardBackward(static_cast<int>(step % 2), micro, slot.rows[micro], micro + 1 == spec.accumSteps,
                                          layerDone));
    }
    if (!commError) return fail(commError.error(), step + 1);
    LOCKSTEP_CUDA(cudaEventRecord(slot.backwardEnd, compute));
    LOCKSTEP_CUDA(cudaStreamWaitEvent(comm, slot.backwardEnd));  // the step ends after its backward, too
    LOCKSTEP_CUDA(cudaMemcpyAsync(slot.header, grads, 3 * sizeof(float), cudaMemcpyDeviceToHost, comm));
    LOCKSTEP_CUDA(cudaEventRecord(slot.end, comm));

    // The next batch, into the other slot, once the step before this one has finished reading it.
    if (step + 1 < s.totalSteps) {
      LOCKSTEP_ASSIGN_OR_RETURN(nextRows, prepare(step + 1, pending ? pending->backwardEnd : nullptr));
    }

    // Meanwhile: the previous step's figures.
    if (pending) {
      s.progress.enter(RankPhase::kCommunicate);
      LOCKSTEP_ASSIGN_OR_RETURN(stopAfterThis, report(*pending, pendingPreviousEnd, false));
    }
    pendingPreviousEnd = previousEnd;
    previousEnd = slot.end;
    pending = &slot;

    const bool checkpointDue = spec.checkpointEvery > 0 && (step + 1) % spec.checkpointEvery == 0;
    if (s.checkpoints && checkpointDue) {
      s.progress.enter(RankPhase::kCheckpoint);
      if (auto done = nccl->wait(slot.end); !done) return fail(done.error(), step + 1);
      const auto copyStart = std::chrono::steady_clock::now();  // the step is done: what follows is the checkpoint's
      LOCKSTEP_TRY(model->download(s.params.data(), optimizerState));
      LOCKSTEP_TRY(s.checkpoints->submit(snapshotCheckpoint(step + 1, s.resume, s.params, *s.optimizer)));
      notePhase("checkpoint", copyStart, step + 1);
    }
  }
  if (pending) {
    s.progress.enter(RankPhase::kCommunicate);
    LOCKSTEP_TRY(report(*pending, pendingPreviousEnd, true));
  }
  LOCKSTEP_TRY(model->download(s.params.data(), optimizerState));
  if (s.checkpoints && summary.stoppedBySignal != 0 && spec.checkpointEvery > 0 &&
      summary.stepsDone % spec.checkpointEvery != 0) {
    const auto copyStart = std::chrono::steady_clock::now();
    LOCKSTEP_TRY(s.checkpoints->submit(snapshotCheckpoint(summary.stepsDone, s.resume, s.params, *s.optimizer)));
    notePhase("checkpoint", copyStart, summary.stepsDone);
  }
  LOCKSTEP_TRY(finishRun(s.params.data(), summary.stepsDone));
  accounting.finish(runStart, samplesSeen);
  s.heartbeat.reset();
  summary.droppedReports = s.metrics->close();
  return summary;
}

}  // namespace lockstep::trainer
