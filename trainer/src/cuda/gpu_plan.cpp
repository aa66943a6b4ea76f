#include "gpu_plan.h"

#include <algorithm>

#include "cuda_check.h"
#include "lockstep/kpi/median.h"

namespace lockstep::trainer::gpu {
namespace {

using kpi::median;

constexpr int kRepeats = 3;  // timed runs of each measurement, after one to warm up


// Timing events, destroyed with the measurement.
class Events {
 public:
  ~Events() {
    for (auto e : events_) cudaEventDestroy(e);
  }
  Result<cudaEvent_t> make() {
    cudaEvent_t e = nullptr;
    LOCKSTEP_CUDA(cudaEventCreate(&e));
    events_.push_back(e);
    return e;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

Result<double> elapsedMicros(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  LOCKSTEP_CUDA(cudaEventElapsedTime(&ms, from, to));
  return static_cast<double>(ms) * 1e3;
}

Result<CommCurve> allReduceCurve(NcclComm& nccl, float* grads, std::size_t maxBytes, Events& events) {
  LOCKSTEP_ASSIGN_OR_RETURN(cudaEvent_t start, events.make());
  LOCKSTEP_ASSIGN_OR_RETURN(cudaEvent_t end, events.make());
  CommCurve curve;
  for (std::size_t bytes = 16u << 10;; bytes *= 4) {
    const std::size_t size = std::min(bytes, maxBytes);
    std::vector<double> runs;
    for (int run = 0; run <= kRepeats; ++run) {
      const NcclComm::Range range{grads, size / sizeof(float)};
      LOCKSTEP_CUDA(cudaEventRecord(start, nccl.stream()));
      LOCKSTEP_TRY(nccl.allReduceAsync(&range, 1));
      LOCKSTEP_CUDA(cudaEventRecord(end, nccl.stream()));
      LOCKSTEP_TRY(nccl.wait(end));
      LOCKSTEP_ASSIGN_OR_RETURN(const double us, elapsedMicros(start, end));
      if (run > 0) runs.push_back(us);
    }
    curve.bytes.push_back(static_cast<double>(size));
    curve.micros.push_back(median(runs));
    if (size == maxBytes) break;
  }
  return curve;
}

}  // namespace

Result<PlanFigures> measureGpuStep(NcclComm& nccl, GpuModel& model, const ParamLayout& layout,
                                   const std::vector<std::uint32_t>& firstBatch) {
  Events events;
  PlanFigures f;
  f.worldSize = static_cast<std::uint32_t>(nccl.worldSize());
  f.readyOnlyAtPoints = true;
  LOCKSTEP_ASSIGN_OR_RETURN(f.allReduce, allReduceCurve(nccl, model.grads(), layout.totalFloats() * sizeof(float), events));

  // One forward and backward of the first batch, timed from the step's start to each layer's end
  // (the forward is in every point alike: the planner needs when each range becomes final).
  const cudaStream_t compute = model.computeStream();
  LOCKSTEP_TRY(model.prepareBatch(0, 0, firstBatch, nullptr));
  LOCKSTEP_ASSIGN_OR_RETURN(cudaEvent_t start, events.make());
  std::vector<cudaEvent_t> layerEnds;
  std::vector<std::vector<double>> runs;
  for (int run = 0; run <= kRepeats; ++run) {
    LOCKSTEP_CUDA(cudaStreamWaitEvent(compute, model.batchReady(0, 0)));
    LOCKSTEP_CUDA(cudaEventRecord(start, compute));
    model.beginStep(static_cast<float>(firstBatch.size()), 0.0f);
    std::size_t layer = 0;
    Result<void> recorded;
    LOCKSTEP_TRY(model.forwardBackward(0, 0, static_cast<std::uint32_t>(firstBatch.size()), true,
                                       [&](std::size_t end, cudaEvent_t) {
                                         if (layerEnds.size() <= layer) {
                                           auto e = events.make();
                                           if (!e) {
                                             recorded = e.error();
                                             return;
                                           }
                                           layerEnds.push_back(*e);
                                           f.readyEnds.push_back(end);
                                           runs.emplace_back();
                                         }
                                         cudaEventRecord(layerEnds[layer++], compute);
                                       }));
    LOCKSTEP_TRY(recorded);
    LOCKSTEP_CUDA(cudaStreamSynchronize(compute));
    for (std::size_t i = 0; run > 0 && i < layerEnds.size(); ++i) {
      LOCKSTEP_ASSIGN_OR_RETURN(const double us, elapsedMicros(start, layerEnds[i]));
      runs[i].push_back(us);
    }
  }
  for (auto& r : runs) f.readyMicros.push_back(std::max(median(r), f.readyMicros.empty() ? 0.0 : f.readyMicros.back()));
  return f;
}

}  // namespace lockstep::trainer::gpu
