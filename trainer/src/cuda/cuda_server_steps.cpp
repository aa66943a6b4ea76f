// CudaLoop's steps with a parameter server (--sync parameter-server; ps_worker.h has the exchange
// and why it goes over the hosts, ps_server.h the server). One step at a time: the next step
// computes on the weights this one pulls.

#include <cstdio>
#include <numeric>
#include <thread>

#include "cuda_check.h"
#include "cuda_loop.h"
#include "lockstep/protocol/names.h"

namespace lockstep::trainer::gpu {

Result<void> CudaLoop::trainWithServer(StepAccounting& accounting) {
  // Before the model: on a rank holding a part of the server, the rank's optimizer becomes that
  // part's, which the server's thread applies on the host.
  LOCKSTEP_ASSIGN_OR_RETURN(slowdown_, testSlowdown(env_.rank));
  LOCKSTEP_ASSIGN_OR_RETURN(psWorker_, PsWorker::start(host_, keyPrefix_));
  LOCKSTEP_TRY(start(/*keepsOptimizer=*/false));
  hostGrads_.assign(s_.layout->totalFloats(), 0.0f);
  const double lr = serverLearningRate(options_.spec);
  accounting.start(1);
  if (env_.rank == 0 && !options_.quiet) {
    std::fprintf(stderr, "[lockstep] GPU %d, %s, a parameter server on the hosts\n", device_,
                 std::string(nameOf(options_.spec.precision)).c_str());
  }
  bool over = s_.firstStep >= s_.totalSteps;
  for (std::uint64_t dataStep = s_.firstStep; !over; ++dataStep) {
    auto stepOver = serverStep(dataStep, lr, accounting);
    if (!stepOver) return psWorker_->serverError(/*stopFirst=*/true).value_or(stepOver.error());
    over = *stepOver;
  }
  if (auto failed = psWorker_->serverError(/*stopFirst=*/false)) return *failed;
  return {};
}

Result<bool> CudaLoop::serverStep(std::uint64_t dataStep, double lr, StepAccounting& accounting) {
  s_.progress.enter(RankPhase::kCompute);
  const auto start = Clock::now();
  LOCKSTEP_ASSIGN_OR_RETURN(const std::vector<std::uint32_t> rows, prepare(dataStep, nullptr));
  const int slot = static_cast<int>(dataStep % 2);
  const auto localSamples = std::accumulate(rows.begin(), rows.end(), 0u);
  model_->beginStep(static_cast<float>(localSamples), host_.stopSignal() != 0 ? 1.0f : 0.0f);
  for (std::uint32_t micro = 0; micro < options_.spec.accumSteps; ++micro) {
    LOCKSTEP_TRY(model_->forwardBackward(slot, micro, rows[micro], micro + 1 == options_.spec.accumSteps,
                                         [](std::size_t, cudaEvent_t) {}));
  }
  LOCKSTEP_TRY(model_->downloadGradients(hostGrads_.data()));
  if (slowdown_ > 1.0) std::this_thread::sleep_for((Clock::now() - start) * (slowdown_ - 1.0));  // a test's slower GPU
  const auto computed = Clock::now();
  const double localLoss = hostGrads_[kLossSum];

  LOCKSTEP_ASSIGN_OR_RETURN(PsExchange exchange, psWorker_->pushAndPull(hostGrads_.data(), s_.params.data(), voteToStop_));
  LOCKSTEP_TRY(model_->upload(s_.params.data(), {}));  // part of the pull: the next step waits for it
  const auto end = Clock::now();
  const PsHeader& reply = exchange.reply;
  const bool over = reply.done != 0;
  if (reply.applied != 0) {
    const double globalLoss = static_cast<double>(hostGrads_[kLossSum]) / hostGrads_[kSampleCount];
    StepReport r = accounting.report(reply.version, localSamples, localLoss, globalLoss, lr);
    r.epoch = s_.sampler->epochOf(dataStep);  // asynchronous: this rank's data, not the server's count
    r.dataTimeUs = 0;  // the batch is gathered on the GPU's data stream, within the compute
    r.computeTimeUs = micros(computed - start);
    r.exposedCommTimeUs = micros(end - exchange.pushStart);
    r.stepTimeUs = micros(end - start);
    r.optimizerTimeUs = 0;  // the server's
    r.allreduceTimeUs = 0;
    r.bytesReduced = 0;
    exchange.pull.micros += micros(end - exchange.end);
    // Weights (and their bf16 copy) and gradients on the GPU, and their copies on the host that travel.
    const std::size_t total = s_.layout->totalFloats();
    psWorker_->addFigures(exchange, model_->paramBytes() / sizeof(float) + total, 2 * total, r);
    LOCKSTEP_ASSIGN_OR_RETURN(const bool reachedTarget,
                              accounting.record(r, static_cast<std::uint64_t>(hostGrads_[kSampleCount]), globalLoss, over));
    voteToStop_ = voteToStop_ || reachedTarget;  // the server ends the run: the next push asks it to
  }
  if (over && reply.stopped != 0) accounting.stopVoted(host_.stopSignal());
  return over;
}

}  // namespace lockstep::trainer::gpu
