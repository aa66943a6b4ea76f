// CpuLoop's steps with a parameter server (--sync parameter-server; ps_server.h has the server).

#include "cpu_loop.h"
#include "lockstep/protocol/validate.h"
#include "optimizer.h"

namespace lockstep::trainer {

Result<void> CpuLoop::setUpServer() {
  const JobSpec& spec = options_.spec;  // its world size is the environment's (RankRunner)
  const std::uint32_t workers = env_.worldSize;
  LOCKSTEP_TRY(validateStaleness(spec));
  const int parts = static_cast<int>(spec.serverRanks());
  serverParts_ = std::make_unique<ShardPlan>(*s_.layout, parts);
  const int rank = static_cast<int>(env_.rank);
  if (rank < parts) {
    // This rank's process holds part `rank` of the server: its range of the optimizer state.
    s_.optimizer = partOf(*s_.optimizer, *serverParts_, rank);
    server_ = std::make_unique<ParameterServer>(PsServerSetup{&options_, &env_, &s_.params, s_.optimizer.get(),
                                                              s_.checkpoints.get(), &s_.resume, s_.firstStep,
                                                              s_.totalSteps, keyPrefix_ + "ps/", s_.layout.get(),
                                                              serverParts_.get(), rank});
  } else {
    s_.optimizer = std::make_unique<Optimizer>(spec.optimizer, 0, 0);  // the server keeps the state
  }
  // Part 0's messages are the flat buffers' first floats (the header, then its range): sent from
  // the gradients and received into the weights in place. The others' are copied.
  pushes_.resize(static_cast<std::size_t>(parts));
  pulls_.resize(static_cast<std::size_t>(parts));
  for (int part = 1; part < parts; ++part) {
    pushes_[static_cast<std::size_t>(part)].resize(psMessageFloats(*serverParts_, part));
    pulls_[static_cast<std::size_t>(part)].resize(psMessageFloats(*serverParts_, part));
  }
  GlooOptions mesh;
  mesh.rank = rank;
  mesh.worldSize = static_cast<int>(workers) + parts;
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

// On a rank holding a part of the server: the part's own error once it has ended (its worker,
// which lost it, says why). `stopFirst`: this rank's worker failed, so the server stops waiting for pushes; else it
// ends once it has told every worker the run is over.
std::optional<Error> CpuLoop::serverError(bool stopFirst) {
  if (!server_) return std::nullopt;
  if (stopFirst) server_->abort();
  auto served = server_->join();
  if (served || served.error().code == ErrorCode::kCancelled) return std::nullopt;
  host_.markCommBroken();
  return served.error().withContext(serverParts_->count() > 1
                                        ? "the parameter server's part " + std::to_string(env_.rank) + " (rank " +
                                              std::to_string(env_.rank) + ")"
                                        : std::string("the parameter server (rank 0)"));
}

// Each part of the server gets the header and its range of the gradient, and sends back the
// header and its range of the weights after the update.
Result<PsHeader> CpuLoop::pushAndPull(Step& st) {
  const int parts = serverParts_->count(), firstServer = static_cast<int>(env_.worldSize);
  const auto message = [&](int part, float* flat, std::vector<float>& copy) {
    return part == 0 ? flat : copy.data();  // part 0's is the flat buffer's start
  };
  writePsHeader(grads_, PsHeader{version_, voteToStop_ ? 1u : 0u, 0, 0, 0});
  s_.progress.enter(RankPhase::kCommunicate);
  const std::string when = "at the parameter server after step " + std::to_string(version_);
  std::vector<std::unique_ptr<PsLink::Receive>> pulls;
  for (int part = 0; part < parts; ++part) {
    auto pull = psLink_->receive({firstServer + part}, message(part, weights_, pulls_[part]),
                                 psMessageFloats(*serverParts_, part), PsTag::kPull);
    if (!pull) return host_.diagnoseCommFailure(pull.error(), when);
    pulls.push_back(std::move(*pull));
  }
  std::uint64_t bytes = 0;
  const auto pushStart = Clock::now();
  s_.progress.record().collectiveBegin(0, 0, static_cast<std::uint32_t>(CollectiveKind::kPush));
  for (int part = 0; part < parts; ++part) {
    if (part > 0) {
      std::copy(grads_, grads_ + ParamLayout::kHeaderFloats, pushes_[part].begin());
      std::copy(grads_ + serverParts_->begin(part), grads_ + serverParts_->end(part),
                pushes_[part].begin() + ParamLayout::kHeaderFloats);
    }
    const std::size_t floats = psMessageFloats(*serverParts_, part);
    if (auto pushed = psLink_->send(firstServer + part, message(part, grads_, pushes_[part]), floats, PsTag::kPush); !pushed) {
      return host_.diagnoseCommFailure(pushed.error(), when);
    }
    bytes += floats * sizeof(float);
  }
  s_.progress.record().collectiveEnd();
  const auto pullStart = Clock::now();
  s_.progress.record().collectiveBegin(0, 0, static_cast<std::uint32_t>(CollectiveKind::kPull));
  for (int part = 0; part < parts; ++part) {
    if (auto pulled = pulls[part]->wait(); !pulled) return host_.diagnoseCommFailure(pulled.error(), when);
    if (part > 0) {
      std::copy(pulls_[part].begin() + ParamLayout::kHeaderFloats, pulls_[part].end(), weights_ + serverParts_->begin(part));
    }
  }
  s_.progress.record().collectiveEnd();
  st.end = Clock::now();
  // The parts answer alike (synchronous); part 0 speaks for them: the update's loss, samples and
  // votes (the header's slots, as an all-reduce leaves them) and what comes next.
  const PsHeader reply = readPsHeader(weights_);
  std::copy(weights_, weights_ + kPsHeaderAt, grads_);
  version_ = reply.version;
  st.index = reply.version - 1;
  st.exposed += st.end - pushStart;
  st.push = {static_cast<std::uint32_t>(parts), micros(pullStart - pushStart), bytes};
  st.pull = {static_cast<std::uint32_t>(parts), micros(st.end - pullStart), bytes};
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
