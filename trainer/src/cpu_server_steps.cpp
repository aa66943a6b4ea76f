// CpuLoop's steps with a parameter server (--sync parameter-server; ps_server.h has the server).

#include "cpu_loop.h"
#include "lockstep/protocol/validate.h"
#include "optimizer.h"

namespace lockstep::trainer {

Result<void> CpuLoop::setUpServer() {
  const JobSpec& spec = options_.spec;  // its world size is the environment's (RankRunner)
  const std::uint32_t workers = env_.worldSize;
  LOCKSTEP_TRY(validateStaleness(spec));
  if (env_.rank == 0) {
    ownWeights_ = s_.params;
    weights_ = ownWeights_.data();
    server_ = std::make_unique<ParameterServer>(PsServerSetup{&options_, &env_, &s_.params, s_.optimizer.get(),
                                                              s_.checkpoints.get(), &s_.resume, s_.firstStep,
                                                              s_.totalSteps, keyPrefix_ + "ps/"});
  } else {
    s_.optimizer = std::make_unique<Optimizer>(spec.optimizer, 0, 0);  // the server keeps the state
  }
  GlooOptions mesh;
  mesh.rank = static_cast<int>(env_.rank);
  mesh.worldSize = static_cast<int>(workers) + 1;
  mesh.storePrefix = keyPrefix_ + "ps/";
  mesh.localHost = s_.store->localAddress();
  mesh.timeout = commTimeout(spec);
  auto link = PsLink::connect(*s_.store, mesh);
  if (!link) return host_.diagnoseCommFailure(link.error(), "connecting to the parameter server");
  psLink_ = std::move(*link);
  version_ = s_.firstStep;
  return {};
}

Result<void> CpuLoop::trainWithServer(StepAccounting& accounting) {
  LOCKSTEP_TRY(setUpServer());
  const double lr = serverLearningRate(options_.spec);
  accounting.start(1);
  bool over = s_.firstStep >= s_.totalSteps;
  for (std::uint64_t dataStep = s_.firstStep; !over; ++dataStep) {
    Step st;
    st.dataIndex = dataStep;
    st.start = Clock::now();
    s_.progress.enter(RankPhase::kCompute);
    for (std::uint32_t micro = 0; micro < options_.spec.accumSteps; ++micro) computeMicroStep(st, micro);
    auto reply = pushAndPull(st);
    if (!reply) return serverError(/*stopFirst=*/true).value_or(reply.error());
    over = reply->done != 0;
    if (reply->applied != 0) LOCKSTEP_TRY(recordServerStep(st, lr, accounting, *reply));
    if (over && reply->stopped != 0) accounting.stopVoted(host_.stopSignal());
  }
  if (auto failed = serverError(/*stopFirst=*/false)) return *failed;
  return {};
}

// On rank 0: the server's own error once it has ended (a worker of rank 0 that lost the server
// says why). `stopFirst`: rank 0's worker failed, so the server stops waiting for pushes; else it
// ends once it has told every worker the run is over.
std::optional<Error> CpuLoop::serverError(bool stopFirst) {
  if (!server_) return std::nullopt;
  if (stopFirst) server_->abort();
  auto served = server_->join();
  if (served || served.error().code == ErrorCode::kCancelled) return std::nullopt;
  host_.markCommBroken();
  return served.error().withContext("the parameter server (rank 0)");
}

Result<PsHeader> CpuLoop::pushAndPull(Step& st) {
  const std::size_t floats = s_.layout->totalFloats();
  const int server = static_cast<int>(env_.worldSize);
  writePsHeader(grads_, PsHeader{version_, voteToStop_ ? 1u : 0u, 0, 0, 0});
  s_.progress.enter(RankPhase::kCommunicate);
  const std::string when = "at the parameter server after step " + std::to_string(version_);
  auto pull = psLink_->receive({server}, weights_, floats, PsTag::kPull);
  if (!pull) return host_.diagnoseCommFailure(pull.error(), when);
  const auto pushStart = Clock::now();
  s_.progress.record().collectiveBegin(0, 0, static_cast<std::uint32_t>(CollectiveKind::kPush));
  if (auto pushed = psLink_->send(server, grads_, floats, PsTag::kPush); !pushed) {
    return host_.diagnoseCommFailure(pushed.error(), when);
  }
  s_.progress.record().collectiveEnd();
  const auto pullStart = Clock::now();
  s_.progress.record().collectiveBegin(0, 0, static_cast<std::uint32_t>(CollectiveKind::kPull));
  if (auto pulled = (*pull)->wait(); !pulled) return host_.diagnoseCommFailure(pulled.error(), when);
  s_.progress.record().collectiveEnd();
  st.end = Clock::now();
  const PsHeader reply = readPsHeader(weights_);
  // The update's loss, samples and votes: the header's slots, as an all-reduce leaves them.
  std::copy(weights_, weights_ + kPsHeaderAt, grads_);
  version_ = reply.version;
  st.index = reply.version - 1;
  st.exposed += st.end - pushStart;
  st.push = {1, micros(pullStart - pushStart), floats * sizeof(float)};
  st.pull = {1, micros(st.end - pullStart), floats * sizeof(float)};
  if (options_.spec.staleness > 0) st.staleness = reply.staleness;
  return reply;
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
