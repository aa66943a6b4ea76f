#include "ps_worker.h"

#include <algorithm>

#include "lockstep/protocol/validate.h"
#include "optimizer.h"
#include "rank_state.h"

namespace lockstep::trainer {

PsWorker::PsWorker(RankHost& host) : host_(host) {}

PsWorker::~PsWorker() = default;

Result<std::unique_ptr<PsWorker>> PsWorker::start(RankHost& host, const std::string& keyPrefix) {
  LOCKSTEP_TRY(validateStaleness(host.options().spec));
  std::unique_ptr<PsWorker> worker(new PsWorker(host));
  LOCKSTEP_TRY(worker->connect(keyPrefix));
  return worker;
}

Result<void> PsWorker::connect(const std::string& keyPrefix) {
  const JobSpec& spec = host_.options().spec;  // its world size is the environment's (RankRunner)
  const DistEnv& env = host_.env();
  RankState& s = host_.state();
  const int parts = static_cast<int>(spec.serverRanks());
  parts_ = std::make_unique<ShardPlan>(*s.layout, parts);
  const int rank = static_cast<int>(env.rank);
  if (rank < parts) {
    // This rank's process holds part `rank` of the server: its range of the optimizer state.
    s.optimizer = partOf(*s.optimizer, *parts_, rank);
    server_ = std::make_unique<ParameterServer>(PsServerSetup{&host_.options(), &env, &s.params, s.optimizer.get(),
                                                              s.checkpoints.get(), &s.resume, s.firstStep,
                                                              s.totalSteps, keyPrefix + "ps/", s.layout.get(),
                                                              parts_.get(), rank});
  } else {
    s.optimizer = std::make_unique<Optimizer>(spec.optimizer, 0, 0);  // the server keeps the state
  }
  // Part 0's messages are the flat buffers' first floats (the header, then its range): sent from
  // the gradients and received into the weights in place. The others' are copied.
  pushes_.resize(static_cast<std::size_t>(parts));
  pulls_.resize(static_cast<std::size_t>(parts));
  for (int part = 1; part < parts; ++part) {
    pushes_[static_cast<std::size_t>(part)].resize(psMessageFloats(*parts_, part));
    pulls_[static_cast<std::size_t>(part)].resize(psMessageFloats(*parts_, part));
  }
  auto link = PsLink::connect(*s.store, glooMesh(spec, *s.store, keyPrefix + "ps/", rank,
                                                 static_cast<int>(env.worldSize) + parts));
  if (!link) return host_.diagnoseCommFailure(link.error(), "connecting to the parameter server");
  link_ = std::move(*link);
  version_ = s.firstStep;
  return {};
}

std::optional<Error> PsWorker::serverError(bool stopFirst) {
  if (!server_) return std::nullopt;
  if (stopFirst) server_->abort();
  auto served = server_->join();
  if (served || served.error().code == ErrorCode::kCancelled) return std::nullopt;
  host_.markCommBroken();
  const std::string rank = std::to_string(host_.env().rank);
  return served.error().withContext(parts_->count() > 1 ? "the parameter server's part " + rank + " (rank " + rank + ")"
                                                        : std::string("the parameter server (rank 0)"));
}

float* PsWorker::message(int part, float* flat, std::vector<std::vector<float>>& copies) const {
  return part == 0 ? flat : copies[static_cast<std::size_t>(part)].data();
}

// Each part of the server gets the header and its range of the gradient, and sends back the
// header and its range of the weights after the update.
Result<PsExchange> PsWorker::pushAndPull(float* grads, float* weights, bool voteToStop) {
  RankState& s = host_.state();
  const int parts = parts_->count(), firstServer = static_cast<int>(host_.env().worldSize);
  writePsHeader(grads, PsHeader{version_, voteToStop ? 1u : 0u, 0, 0, 0});
  s.progress.enter(RankPhase::kCommunicate);
  const std::string when = "at the parameter server after step " + std::to_string(version_);
  std::vector<std::unique_ptr<PsLink::Receive>> pulls;
  for (int part = 0; part < parts; ++part) {
    auto pull = link_->receive({firstServer + part}, message(part, weights, pulls_), psMessageFloats(*parts_, part),
                               PsTag::kPull);
    if (!pull) return host_.diagnoseCommFailure(pull.error(), when);
    pulls.push_back(std::move(*pull));
  }
  PsExchange x;
  std::uint64_t bytes = 0;
  x.pushStart = Clock::now();
  s.progress.record().collectiveBegin(0, 0, static_cast<std::uint32_t>(CollectiveKind::kPush));
  for (int part = 0; part < parts; ++part) {
    if (part > 0) {
      auto& copy = pushes_[static_cast<std::size_t>(part)];
      std::copy(grads, grads + ParamLayout::kHeaderFloats, copy.begin());
      std::copy(grads + parts_->begin(part), grads + parts_->end(part), copy.begin() + ParamLayout::kHeaderFloats);
    }
    const std::size_t floats = psMessageFloats(*parts_, part);
    if (auto pushed = link_->send(firstServer + part, message(part, grads, pushes_), floats, PsTag::kPush); !pushed) {
      return host_.diagnoseCommFailure(pushed.error(), when);
    }
    bytes += floats * sizeof(float);
  }
  s.progress.record().collectiveEnd();
  const auto pullStart = Clock::now();
  s.progress.record().collectiveBegin(0, 0, static_cast<std::uint32_t>(CollectiveKind::kPull));
  for (int part = 0; part < parts; ++part) {
    if (auto pulled = pulls[static_cast<std::size_t>(part)]->wait(); !pulled) {
      return host_.diagnoseCommFailure(pulled.error(), when);
    }
    if (part > 0) {
      const auto& copy = pulls_[static_cast<std::size_t>(part)];
      std::copy(copy.begin() + ParamLayout::kHeaderFloats, copy.end(), weights + parts_->begin(part));
    }
  }
  s.progress.record().collectiveEnd();
  x.end = Clock::now();
  // The parts answer alike (synchronous); part 0 speaks for them: the update's loss, samples and
  // votes (the header's slots, as an all-reduce leaves them) and what comes next.
  x.reply = readPsHeader(weights);
  std::copy(weights, weights + kPsHeaderAt, grads);
  version_ = x.reply.version;
  x.push = {static_cast<std::uint32_t>(parts), micros(pullStart - x.pushStart), bytes};
  x.pull = {static_cast<std::uint32_t>(parts), micros(x.end - pullStart), bytes};
  return x;
}

void PsWorker::addFigures(const PsExchange& x, std::size_t workerParamFloats, std::size_t workerGradFloats,
                          StepReport& report) const {
  // A rank holding a part of the server holds its master, queued gradients and optimizer too; a
  // worker's messages to and from a split server's other parts are copies.
  std::size_t pushed = 0, pulled = 0;
  for (const auto& m : pushes_) pushed += m.size();
  for (const auto& m : pulls_) pulled += m.size();
  report.paramBytes = (workerParamFloats + pulled) * sizeof(float) + (server_ ? server_->masterBytes() : 0);
  report.gradBytes = (workerGradFloats + pushed) * sizeof(float) + (server_ ? server_->gradientBytes() : 0);
  report.optimizerStateBytes = host_.state().optimizer->stateBytes();
  if (host_.options().spec.staleness > 0) report.staleness = x.reply.staleness;
  report.collectives.push_back({CollectiveKind::kPush, x.push.count, x.push.micros, x.push.micros, x.push.bytes});
  report.collectives.push_back({CollectiveKind::kPull, x.pull.count, x.pull.micros, x.pull.micros, x.pull.bytes});
}

}  // namespace lockstep::trainer
