// CpuLoop's steps with a parameter server (--sync parameter-server; ps_worker.h has the exchange,
// ps_server.h the server).

#include "cpu_loop.h"
#include "optimizer.h"

namespace lockstep::trainer {

Result<void> CpuLoop::trainWithServer(StepAccounting& accounting) {
  LOCKSTEP_ASSIGN_OR_RETURN(psWorker_, PsWorker::start(host_, keyPrefix_));
  const double lr = serverLearningRate(options_.spec);
  accounting.start(1);
  bool over = s_.firstStep >= s_.totalSteps;
  for (std::uint64_t dataStep = s_.firstStep; !over; ++dataStep) {
    Step st;
    st.dataIndex = dataStep;
    st.start = Clock::now();
    s_.progress.enter(RankPhase::kCompute);
    for (std::uint32_t micro = 0; micro < options_.spec.accumSteps; ++micro) computeMicroStep(st, micro);
    auto exchange = psWorker_->pushAndPull(grads_, weights_, voteToStop_);
    if (!exchange) return psWorker_->serverError(/*stopFirst=*/true).value_or(exchange.error());
    st.end = exchange->end;
    st.exposed += exchange->end - exchange->pushStart;
    st.index = exchange->reply.version - 1;
    st.exchange = *exchange;
    const PsHeader& reply = exchange->reply;
    over = reply.done != 0;
    if (reply.applied != 0) LOCKSTEP_TRY(recordServerStep(st, lr, accounting, reply));
    if (over && reply.stopped != 0) accounting.stopVoted(host_.stopSignal());
  }
  if (auto failed = psWorker_->serverError(/*stopFirst=*/false)) return *failed;
  return {};
}

Result<void> CpuLoop::recordServerStep(Step& st, double lr, StepAccounting& accounting, const PsHeader& reply) {
  const double globalLoss = static_cast<double>(grads_[kLossSum]) / grads_[kSampleCount];
  StepReport report = reportOf(st, lr, globalLoss, accounting);
  report.epoch = s_.sampler->epochOf(st.dataIndex);  // asynchronous: this rank's data, not the server's count
  LOCKSTEP_ASSIGN_OR_RETURN(const bool reachedTarget, accounting.record(report, static_cast<std::uint64_t>(grads_[kSampleCount]),
                                                                         globalLoss, reply.done != 0));
  // The server ends the run: the next push asks it to.
  voteToStop_ = voteToStop_ || reachedTarget;
  return {};
}

}  // namespace lockstep::trainer
