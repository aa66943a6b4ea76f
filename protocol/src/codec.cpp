#include "lockstep/protocol/codec.h"

#include <cmath>
#include <cstdio>
#include <iterator>

#include "lockstep/common/store.h"
#include "lockstep/protocol/names.h"
#include "lockstep/protocol/validate.h"
#include "lockstep/v1/lockstep.pb.h"
#include "stall_pb.h"
#include "stream_pb.h"

#include <google/protobuf/util/json_util.h>

namespace lockstep {
namespace {

namespace pb = ::lockstep::v1;

Error bad(std::string message) { return invalidArgument(std::move(message)); }

template <class Optional, class Message, class Setter>
void setIf(const Optional& value, Message* message, Setter setter) {
  if (value) (message->*setter)(*value);
}

// ---- enums ----

// The domain enums (types.h, result.h) cast to and from the protobuf ones: each value is tied here,
// so that a change to either side fails to compile instead of silently meaning another value.
#define LOCKSTEP_SAME(domain, pbValue) static_assert(static_cast<int>(domain) == static_cast<int>(pb::pbValue))
LOCKSTEP_SAME(Backend::kCpu, BACKEND_CPU);
LOCKSTEP_SAME(Backend::kCuda, BACKEND_CUDA);
LOCKSTEP_SAME(Activation::kRelu, ACTIVATION_RELU);
LOCKSTEP_SAME(Activation::kGelu, ACTIVATION_GELU);
LOCKSTEP_SAME(Precision::kFp32, PRECISION_FP32);
LOCKSTEP_SAME(Precision::kTf32, PRECISION_TF32);
LOCKSTEP_SAME(Precision::kBf16, PRECISION_BF16);
LOCKSTEP_SAME(OptimizerKind::kSgd, OPTIMIZER_KIND_SGD);
LOCKSTEP_SAME(OptimizerKind::kAdamW, OPTIMIZER_KIND_ADAMW);
LOCKSTEP_SAME(LrScaling::kNone, LR_SCALING_NONE);
LOCKSTEP_SAME(LrScaling::kLinear, LR_SCALING_LINEAR);
LOCKSTEP_SAME(JobState::kStarting, JOB_STATE_STARTING);
LOCKSTEP_SAME(JobState::kRunning, JOB_STATE_RUNNING);
LOCKSTEP_SAME(JobState::kFinished, JOB_STATE_FINISHED);
LOCKSTEP_SAME(JobState::kFailed, JOB_STATE_FAILED);
LOCKSTEP_SAME(JobState::kStopped, JOB_STATE_STOPPED);
LOCKSTEP_SAME(SupervisionState::kNone, SUPERVISION_STATE_UNSPECIFIED);
LOCKSTEP_SAME(SupervisionState::kFollowing, SUPERVISION_STATE_FOLLOWING);
LOCKSTEP_SAME(SupervisionState::kRestarting, SUPERVISION_STATE_RESTARTING);
LOCKSTEP_SAME(SupervisionState::kEnded, SUPERVISION_STATE_ENDED);
LOCKSTEP_SAME(SupervisionState::kStandby, SUPERVISION_STATE_STANDBY);
LOCKSTEP_SAME(JobEventKind::kStarted, JOB_EVENT_KIND_STARTED);
LOCKSTEP_SAME(JobEventKind::kRankStarted, JOB_EVENT_KIND_RANK_STARTED);
LOCKSTEP_SAME(JobEventKind::kRankExited, JOB_EVENT_KIND_RANK_EXITED);
LOCKSTEP_SAME(JobEventKind::kCheckpointSaved, JOB_EVENT_KIND_CHECKPOINT_SAVED);
LOCKSTEP_SAME(JobEventKind::kFinished, JOB_EVENT_KIND_FINISHED);
LOCKSTEP_SAME(JobEventKind::kFailed, JOB_EVENT_KIND_FAILED);
LOCKSTEP_SAME(JobEventKind::kStopped, JOB_EVENT_KIND_STOPPED);
LOCKSTEP_SAME(JobEventKind::kStalled, JOB_EVENT_KIND_STALLED);
LOCKSTEP_SAME(JobEventKind::kStallEnded, JOB_EVENT_KIND_STALL_ENDED);
LOCKSTEP_SAME(JobEventKind::kRankEvidence, JOB_EVENT_KIND_RANK_EVIDENCE);
LOCKSTEP_SAME(JobEventKind::kNote, JOB_EVENT_KIND_NOTE);
LOCKSTEP_SAME(OnStall::kReport, ON_STALL_REPORT);
LOCKSTEP_SAME(OnStall::kStop, ON_STALL_STOP);
LOCKSTEP_SAME(OnStall::kRestart, ON_STALL_RESTART);
LOCKSTEP_SAME(ErrorCode::kInvalidArgument, ERROR_CODE_INVALID_ARGUMENT);
LOCKSTEP_SAME(ErrorCode::kNotFound, ERROR_CODE_NOT_FOUND);
LOCKSTEP_SAME(ErrorCode::kAlreadyExists, ERROR_CODE_ALREADY_EXISTS);
LOCKSTEP_SAME(ErrorCode::kPermissionDenied, ERROR_CODE_PERMISSION_DENIED);
LOCKSTEP_SAME(ErrorCode::kResourceExhausted, ERROR_CODE_RESOURCE_EXHAUSTED);
LOCKSTEP_SAME(ErrorCode::kFailedPrecondition, ERROR_CODE_FAILED_PRECONDITION);
LOCKSTEP_SAME(ErrorCode::kTimeout, ERROR_CODE_TIMEOUT);
LOCKSTEP_SAME(ErrorCode::kUnavailable, ERROR_CODE_UNAVAILABLE);
LOCKSTEP_SAME(ErrorCode::kPeerLost, ERROR_CODE_PEER_LOST);
LOCKSTEP_SAME(ErrorCode::kIo, ERROR_CODE_IO);
LOCKSTEP_SAME(ErrorCode::kInternal, ERROR_CODE_INTERNAL);
LOCKSTEP_SAME(ErrorCode::kCancelled, ERROR_CODE_CANCELLED);
#undef LOCKSTEP_SAME
// Every value has a name (names.h): a new enumerator without one would be written as "unknown".
static_assert(std::size(kBackendNames) == pb::Backend_ARRAYSIZE - 1);
static_assert(std::size(kActivationNames) == pb::Activation_ARRAYSIZE - 1);
static_assert(std::size(kPrecisionNames) == pb::Precision_ARRAYSIZE - 1);
static_assert(std::size(kOptimizerNames) == pb::OptimizerKind_ARRAYSIZE - 1);
static_assert(std::size(kLrScalingNames) == pb::LrScaling_ARRAYSIZE);  // LR_SCALING_NONE is a value
static_assert(std::size(kSupervisionStateNames) == pb::SupervisionState_ARRAYSIZE);  // so is UNSPECIFIED
static_assert(std::size(kOnStallNames) == pb::OnStall_ARRAYSIZE);  // ON_STALL_REPORT is a value

pb::ErrorCode toPb(ErrorCode c) { return static_cast<pb::ErrorCode>(static_cast<int>(c)); }
Result<ErrorCode> fromPb(pb::ErrorCode c) {
  if (c < pb::ERROR_CODE_INVALID_ARGUMENT || c > pb::ERROR_CODE_CANCELLED) return bad("error code is missing or unknown");
  return static_cast<ErrorCode>(static_cast<int>(c));
}

template <class Domain, class Pb>
Result<Domain> enumFromPb(Pb value, int first, int last, const char* field) {
  const int v = static_cast<int>(value);
  if (v < first || v > last) return bad(std::string(field) + " is missing or unknown (" + std::to_string(v) + ")");
  return static_cast<Domain>(v);
}

// ---- job spec ----

void toPb(const CommandSpec& c, pb::Command* m) {
  for (const auto& arg : c.argv) m->add_argv(arg);
  m->set_working_dir(c.workingDir);
  for (const auto& [name, value] : c.env) {
    auto* e = m->add_env();
    e->set_name(name);
    e->set_value(value);
  }
}

CommandSpec fromPb(const pb::Command& m) {
  CommandSpec c;
  c.argv.assign(m.argv().begin(), m.argv().end());
  c.workingDir = m.working_dir();
  for (const auto& e : m.env()) c.env.emplace_back(e.name(), e.value());
  return c;
}

void toPb(const JobSpec& s, pb::JobSpec* m) {
  m->set_job_id(s.jobId);
  m->set_name(s.name);
  m->set_backend(static_cast<pb::Backend>(s.backend));
  if (s.command) toPb(*s.command, m->mutable_command());
  for (auto l : s.layers) m->add_layers(l);
  m->set_activation(static_cast<pb::Activation>(s.activation));
  m->set_precision(static_cast<pb::Precision>(s.precision));
  if (s.command) {
    // No data set: the program reads its own.
  } else if (const auto* syn = std::get_if<SyntheticDataset>(&s.dataset)) {
    auto* d = m->mutable_dataset()->mutable_synthetic();
    d->set_samples(syn->samples);
    d->set_dim(syn->dim);
    d->set_classes(syn->classes);
    d->set_seed(syn->seed);
  } else {
    const auto& npy = std::get<NpyDataset>(s.dataset);
    auto* d = m->mutable_dataset()->mutable_npy();
    d->set_features_path(npy.featuresPath);
    d->set_labels_path(npy.labelsPath);
  }
  m->set_batch_per_rank(s.batchPerRank);
  m->set_accum_steps(s.accumSteps);
  auto* o = m->mutable_optimizer();
  o->set_kind(static_cast<pb::OptimizerKind>(s.optimizer.kind));
  o->set_lr(s.optimizer.lr);
  o->set_momentum(s.optimizer.momentum);
  o->set_nesterov(s.optimizer.nesterov);
  o->set_weight_decay(s.optimizer.weightDecay);
  o->set_beta1(s.optimizer.beta1);
  o->set_beta2(s.optimizer.beta2);
  o->set_eps(s.optimizer.eps);
  o->set_lr_scaling(static_cast<pb::LrScaling>(s.optimizer.lrScaling));
  o->set_lr_base_batch(s.optimizer.lrBaseBatch);
  m->set_steps(s.steps);
  m->set_epochs(s.epochs);
  setIf(s.targetLoss, m, &pb::JobSpec::set_target_loss);
  m->set_no_shuffle(!s.shuffle);
  m->set_seed(s.seed);
  m->set_bucket_mb(s.bucketMb);
  m->set_checkpoint_every(s.checkpointEvery);
  m->set_rebalance_every(s.rebalanceEvery);
  m->set_max_restarts(s.maxRestarts);
  m->set_on_stall(static_cast<pb::OnStall>(s.onStall));
  m->set_stall_after_s(s.stallAfterS);
  m->set_min_world_size(s.minWorldSize);
  m->set_slurm_job_id(s.slurmJobId);
  m->set_allocated_gpus(s.allocatedGpus);
  m->set_attempt(s.attempt);
  m->set_restart_reason(s.restartReason);
  m->set_checkpoint_dir(s.checkpointDir);
  m->set_keep_checkpoints(s.keepCheckpoints);
  m->set_init_weights_path(s.initWeightsPath);
  m->set_timeout_s(s.timeoutS);
  m->set_world_size(s.worldSize);
  for (const auto& r : s.ranks) {
    auto* p = m->add_ranks();
    p->set_rank(r.rank);
    p->set_node(r.node);
    p->set_local_rank(r.localRank);
    setIf(r.gpuIndex, p, &pb::RankPlacement::set_gpu_index);
  }
  m->set_rendezvous_host(s.rendezvousHost);
  m->set_rendezvous_port(s.rendezvousPort);
  auto* prices = m->mutable_prices();
  prices->set_gpu_hour(s.prices.gpuHour);
  prices->set_core_hour(s.prices.coreHour);
  prices->set_kwh(s.prices.kwh);
  prices->set_currency(s.prices.currency);
  for (const auto& a : s.agents) {
    auto* p = m->add_agents();
    p->set_node(a.node);
    p->set_address(a.address);
    p->set_public_key(a.publicKey);
  }
}

Result<JobSpec> fromPb(const pb::JobSpec& m) {
  JobSpec s;
  s.jobId = m.job_id();
  s.name = m.name();
  LOCKSTEP_ASSIGN_OR_RETURN(s.backend, (enumFromPb<Backend>(m.backend(), 1, 2, "job spec backend")));
  if (m.has_command()) s.command = fromPb(m.command());
  s.layers.assign(m.layers().begin(), m.layers().end());
  // A command job need not say what only the built-in MLP uses: unset enums keep their defaults.
  if (!s.command || m.activation() != pb::ACTIVATION_UNSPECIFIED) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.activation, (enumFromPb<Activation>(m.activation(), 1, 2, "job spec activation")));
  }
  if (!s.command || m.precision() != pb::PRECISION_UNSPECIFIED) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.precision, (enumFromPb<Precision>(m.precision(), 1, 3, "job spec precision")));
  }
  switch (m.dataset().source_case()) {
    case pb::Dataset::kSynthetic: {
      const auto& d = m.dataset().synthetic();
      s.dataset = SyntheticDataset{d.samples(), d.dim(), d.classes(), d.seed()};
      break;
    }
    case pb::Dataset::kNpy:
      s.dataset = NpyDataset{m.dataset().npy().features_path(), m.dataset().npy().labels_path()};
      break;
    case pb::Dataset::SOURCE_NOT_SET:
      if (!s.command) return bad("job spec dataset is required (synthetic or npy)");
      break;
  }
  s.batchPerRank = m.batch_per_rank();
  s.accumSteps = m.accum_steps();
  const auto& o = m.optimizer();
  if (!s.command || o.kind() != pb::OPTIMIZER_KIND_UNSPECIFIED) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.optimizer.kind, (enumFromPb<OptimizerKind>(o.kind(), 1, 2, "job spec optimizer")));
  }
  s.optimizer.lr = o.lr();
  s.optimizer.momentum = o.momentum();
  s.optimizer.nesterov = o.nesterov();
  s.optimizer.weightDecay = o.weight_decay();
  s.optimizer.beta1 = o.beta1();
  s.optimizer.beta2 = o.beta2();
  s.optimizer.eps = o.eps();
  LOCKSTEP_ASSIGN_OR_RETURN(s.optimizer.lrScaling, (enumFromPb<LrScaling>(o.lr_scaling(), 0, 1, "job spec lr scaling")));
  s.optimizer.lrBaseBatch = o.lr_base_batch();
  s.steps = m.steps();
  s.epochs = m.epochs();
  if (m.has_target_loss()) s.targetLoss = m.target_loss();
  s.shuffle = !m.no_shuffle();
  s.seed = m.seed();
  s.bucketMb = m.bucket_mb();
  s.checkpointEvery = m.checkpoint_every();
  s.rebalanceEvery = m.rebalance_every();
  s.maxRestarts = m.max_restarts();
  LOCKSTEP_ASSIGN_OR_RETURN(s.onStall, (enumFromPb<OnStall>(m.on_stall(), 0, 2, "on_stall")));
  s.stallAfterS = m.stall_after_s();
  s.minWorldSize = m.min_world_size();
  s.slurmJobId = m.slurm_job_id();
  s.allocatedGpus = m.allocated_gpus();
  s.attempt = m.attempt();
  s.restartReason = m.restart_reason();
  s.checkpointDir = m.checkpoint_dir();
  s.keepCheckpoints = m.keep_checkpoints();
  s.initWeightsPath = m.init_weights_path();
  s.timeoutS = m.timeout_s();
  s.worldSize = m.world_size();
  for (const auto& p : m.ranks()) {
    RankPlacement r{p.rank(), p.node(), p.local_rank(), std::nullopt};
    if (p.has_gpu_index()) r.gpuIndex = p.gpu_index();
    s.ranks.push_back(std::move(r));
  }
  s.rendezvousHost = m.rendezvous_host();
  s.rendezvousPort = m.rendezvous_port();
  s.prices = Prices{m.prices().gpu_hour(), m.prices().core_hour(), m.prices().kwh(), m.prices().currency()};
  for (const auto& a : m.agents()) s.agents.push_back(JobAgent{a.node(), a.address(), a.public_key()});
  LOCKSTEP_TRY(validateJobSpec(s));
  return s;
}

// ---- node hello ----

void toPb(const NodeHello& h, pb::NodeHello* m) {
  m->set_protocol_version(static_cast<pb::ProtocolVersion>(h.protocolVersion));
  m->set_agent_version(h.agentVersion);
  m->set_host(h.host);
  m->set_cpu_cores(h.cpuCores);
  m->set_memory_total_bytes(h.memoryTotalBytes);
  for (const auto& g : h.gpus) {
    auto* p = m->add_gpus();
    p->set_index(g.index);
    p->set_name(g.name);
    p->set_uuid(g.uuid);
    p->set_memory_total_bytes(g.memoryTotalBytes);
  }
  m->set_gpu_status(h.gpuStatus);
  m->set_last_seq(h.lastSeq);
  m->set_node_name(h.nodeName);
  m->set_instance_id(h.instanceId);
  m->set_sample_hz(h.sampleHz);
  m->set_time_unix_us(h.timeUnixUs);
}

Result<NodeHello> fromPb(const pb::NodeHello& m) {
  NodeHello h;
  h.protocolVersion = static_cast<std::uint32_t>(m.protocol_version());
  h.agentVersion = m.agent_version();
  h.host = m.host();
  h.cpuCores = m.cpu_cores();
  h.memoryTotalBytes = m.memory_total_bytes();
  for (const auto& g : m.gpus()) h.gpus.push_back({g.index(), g.name(), g.uuid(), g.memory_total_bytes()});
  h.gpuStatus = m.gpu_status();
  h.lastSeq = m.last_seq();
  h.nodeName = m.node_name();
  h.instanceId = m.instance_id();
  h.timeUnixUs = m.time_unix_us();
  h.sampleHz = m.sample_hz();
  LOCKSTEP_TRY(validateNodeHello(h));
  return h;
}

// ---- job status ----

void toPb(const RankStatus& r, pb::RankStatus* m) {
  m->set_rank(r.rank);
  m->set_local_rank(r.localRank);
  setIf(r.gpuIndex, m, &pb::RankStatus::set_gpu_index);
  m->set_pid(r.pid);
  m->set_state(static_cast<pb::JobState>(r.state));
  setIf(r.exitCode, m, &pb::RankStatus::set_exit_code);
  setIf(r.signal, m, &pb::RankStatus::set_signal);
  m->set_exit_unknown(r.exitUnknown);
}

Result<RankStatus> fromPb(const pb::RankStatus& m) {
  RankStatus r;
  r.rank = m.rank();
  r.localRank = m.local_rank();
  if (m.has_gpu_index()) r.gpuIndex = m.gpu_index();
  r.pid = m.pid();
  LOCKSTEP_ASSIGN_OR_RETURN(r.state, (enumFromPb<JobState>(m.state(), 1, 5, "rank state")));
  if (m.has_exit_code()) r.exitCode = m.exit_code();
  if (m.has_signal()) r.signal = m.signal();
  r.exitUnknown = m.exit_unknown();
  return r;
}

void toPb(const JobStatus& j, pb::JobStatus* m) {
  toPb(j.spec, m->mutable_spec());
  m->set_state(static_cast<pb::JobState>(j.state));
  for (const auto& r : j.ranks) toPb(r, m->add_ranks());
  m->set_started_unix_us(j.startedUnixUs);
  m->set_ended_unix_us(j.endedUnixUs);
  m->set_message(j.message);
  m->set_rendezvous_port(j.rendezvousPort);
  if (j.supervision.state != SupervisionState::kNone) {
    auto* s = m->mutable_supervision();
    s->set_state(static_cast<pb::SupervisionState>(j.supervision.state));
    s->set_outcome(static_cast<pb::JobState>(j.supervision.outcome));
    s->set_message(j.supervision.message);
    for (const auto& line : j.supervision.attempts) s->add_attempts(line);
  }
  for (const auto& p : j.progress) detail::toPb(p, m->add_progress());
  if (j.stall) detail::toPb(*j.stall, m->mutable_stall());
  m->set_owner(j.owner);
}

Result<Supervision> fromPb(const pb::Supervision& m) {
  Supervision s;
  LOCKSTEP_ASSIGN_OR_RETURN(s.state, (enumFromPb<SupervisionState>(m.state(), 0, 4, "supervision state")));
  if (s.state == SupervisionState::kEnded) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.outcome, (enumFromPb<JobState>(m.outcome(), 1, 5, "supervision outcome")));
  }
  s.message = m.message();
  s.attempts.assign(m.attempts().begin(), m.attempts().end());
  if (s.message.size() > 65536) return bad("supervision message is longer than 64 KiB");
  if (s.attempts.size() > 1024) return bad("supervision has more than 1024 attempts");
  return s;
}

Result<JobStatus> fromPb(const pb::JobStatus& m) {
  JobStatus j;
  LOCKSTEP_ASSIGN_OR_RETURN(j.spec, fromPb(m.spec()));
  LOCKSTEP_ASSIGN_OR_RETURN(j.state, (enumFromPb<JobState>(m.state(), 1, 5, "job state")));
  for (const auto& r : m.ranks()) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto rank, fromPb(r));
    j.ranks.push_back(std::move(rank));
  }
  j.startedUnixUs = m.started_unix_us();
  j.endedUnixUs = m.ended_unix_us();
  j.message = m.message();
  j.rendezvousPort = m.rendezvous_port();
  if (m.has_supervision()) {
    LOCKSTEP_ASSIGN_OR_RETURN(j.supervision, fromPb(m.supervision()));
  }
  if (j.message.size() > 65536) return bad("job status message is longer than 64 KiB");
  j.owner = m.owner();
  if (j.owner.size() > 256) return bad("job status owner is longer than 256 bytes");
  if (m.progress_size() > 65536) return bad("job status has progress of more than 65536 ranks");
  for (const auto& p : m.progress()) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto progress, detail::fromPb(p));
    j.progress.push_back(std::move(progress));
  }
  if (m.has_stall()) {
    LOCKSTEP_ASSIGN_OR_RETURN(j.stall, detail::fromPb(m.stall()));
  }
  return j;
}

// ---- envelopes ----

// libprotobuf prints an ERROR line for each malformed message (invalid UTF-8, say); our callers get
// an Error instead, so a client sending garbage must not fill the agent's log.
void silenceProtobufLog() {
  static const bool silenced = [] {
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel level, const char* file, int line,
                                       const std::string& message) {
      if (level >= google::protobuf::LOGLEVEL_FATAL) std::fprintf(stderr, "[libprotobuf %s:%d] %s\n", file, line, message.c_str());
    });
    return true;
  }();
  (void)silenced;
}

template <class Message>
Result<void> parse(Message& m, std::string_view bytes, std::size_t maxBytes, const char* what) {
  silenceProtobufLog();
  if (bytes.size() > maxBytes) {
    return Error{ErrorCode::kResourceExhausted, std::string(what) + " of " + std::to_string(bytes.size()) +
                                                    " bytes is over the limit of " + std::to_string(maxBytes)};
  }
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return bad(std::string(what) + " is not a valid lockstep.v1 message (" + std::to_string(bytes.size()) +
               " bytes that do not parse)");
  }
  return {};
}

template <class Message>
std::string serialize(const Message& m) {
  std::string out;
  m.SerializeToString(&out);
  return out;
}

}  // namespace

std::string encode(const Request& request) {
  pb::Request m;
  m.set_request_id(request.requestId);
  std::visit(
      [&](const auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, HelloRequest>) {
          m.mutable_hello()->set_protocol_version(static_cast<pb::ProtocolVersion>(body.protocolVersion));
          m.mutable_hello()->set_client_name(body.clientName);
        } else if constexpr (std::is_same_v<T, StartJobRequest>) {
          toPb(body.spec, m.mutable_start_job()->mutable_spec());
          m.mutable_start_job()->set_store_secret(body.storeSecret);
        } else if constexpr (std::is_same_v<T, StopJobRequest>) {
          m.mutable_stop_job()->set_job_id(body.jobId);
          m.mutable_stop_job()->set_grace_ms(body.graceMs);
        } else if constexpr (std::is_same_v<T, FetchRequest>) {
          m.mutable_fetch()->set_after_seq(body.afterSeq);
          m.mutable_fetch()->set_max_messages(body.maxMessages);
          m.mutable_fetch()->set_wait_ms(body.waitMs);
        } else if constexpr (std::is_same_v<T, ListJobsRequest>) {
          m.mutable_list_jobs();
        } else if constexpr (std::is_same_v<T, LogsRequest>) {
          m.mutable_logs()->set_job_id(body.jobId);
          m.mutable_logs()->set_rank(body.rank);
          m.mutable_logs()->set_max_bytes(body.maxBytes);
        } else {
          m.mutable_stacks()->set_job_id(body.jobId);
          setIf(body.rank, m.mutable_stacks(), &pb::StacksRequest::set_rank);
        }
      },
      request.body);
  return serialize(m);
}

Result<Request> decodeRequest(std::string_view bytes, std::size_t maxBytes) {
  pb::Request m;
  LOCKSTEP_TRY(parse(m, bytes, maxBytes, "request"));
  using Body = decltype(Request::body);
  auto body = [&]() -> Result<Body> {
    switch (m.body_case()) {
      case pb::Request::kHello:
        if (m.hello().protocol_version() == 0) return bad("hello: protocol version is required");
        if (m.hello().client_name().size() > 256) return bad("hello: client name is longer than 256 bytes");
        return Body{HelloRequest{static_cast<std::uint32_t>(m.hello().protocol_version()), m.hello().client_name()}};
      case pb::Request::kStartJob: {
        if (!m.start_job().has_spec()) return bad("start job: the job spec is required");
        auto spec = fromPb(m.start_job().spec());
        if (!spec) return spec.error().withContext("start job");
        if (!isValidStoreSecret(m.start_job().store_secret())) return bad("start job: the store secret is not 64 hex digits");
        return Body{StartJobRequest{std::move(spec).value(), m.start_job().store_secret()}};
      }
      case pb::Request::kStopJob:
        LOCKSTEP_TRY(validateJobId(m.stop_job().job_id()));
        return Body{StopJobRequest{m.stop_job().job_id(), m.stop_job().grace_ms()}};
      case pb::Request::kFetch:
        if (m.fetch().wait_ms() > 60000) return bad("fetch: wait_ms is over 60000");
        return Body{FetchRequest{m.fetch().after_seq(), m.fetch().max_messages(), m.fetch().wait_ms()}};
      case pb::Request::kListJobs:
        return Body{ListJobsRequest{}};
      case pb::Request::kLogs:
        LOCKSTEP_TRY(validateJobId(m.logs().job_id()));
        return Body{LogsRequest{m.logs().job_id(), m.logs().rank(), m.logs().max_bytes()}};
      case pb::Request::kStacks: {
        LOCKSTEP_TRY(validateJobId(m.stacks().job_id()));
        StacksRequest stacks{m.stacks().job_id(), std::nullopt};
        if (m.stacks().has_rank()) stacks.rank = m.stacks().rank();
        return Body{std::move(stacks)};
      }
      case pb::Request::BODY_NOT_SET:
        break;
    }
    return bad("request has no body (hello, start_job, stop_job, fetch, list_jobs, logs or stacks)");
  }();
  if (!body) return body.error();
  return Request{m.request_id(), std::move(body).value()};
}

std::string encode(const Reply& reply) {
  pb::Reply m;
  m.set_request_id(reply.requestId);
  std::visit(
      [&](const auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, ErrorReply>) {
          m.mutable_error()->set_code(toPb(body.code));
          m.mutable_error()->set_message(body.message);
        } else if constexpr (std::is_same_v<T, NodeHello>) {
          toPb(body, m.mutable_hello());
        } else if constexpr (std::is_same_v<T, StartJobReply>) {
          m.mutable_start_job()->set_job_id(body.jobId);
          m.mutable_start_job()->set_rendezvous_port(body.rendezvousPort);
          m.mutable_start_job()->set_store_secret(body.storeSecret);
        } else if constexpr (std::is_same_v<T, StopJobReply>) {
          m.mutable_stop_job()->set_job_id(body.jobId);
          m.mutable_stop_job()->set_state(static_cast<pb::JobState>(body.state));
        } else if constexpr (std::is_same_v<T, FetchReply>) {
          auto* f = m.mutable_fetch();
          f->set_instance_id(body.instanceId);
          f->set_first_seq(body.firstSeq);
          f->set_last_seq(body.lastSeq);
          f->set_jobs_version(body.jobsVersion);
          for (const auto& message : body.messages) detail::toPb(message, f->add_messages());
        } else if constexpr (std::is_same_v<T, JobsReply>) {
          auto* jobs = m.mutable_jobs();  // set even when empty: "no jobs" is an answer
          for (const auto& job : body.jobs) toPb(job, jobs->add_jobs());
        } else if constexpr (std::is_same_v<T, LogsReply>) {
          m.mutable_logs()->set_job_id(body.jobId);
          m.mutable_logs()->set_rank(body.rank);
          m.mutable_logs()->set_text(body.text);
          m.mutable_logs()->set_truncated(body.truncated);
        } else {
          detail::toPb(body, m.mutable_stacks());
        }
      },
      reply.body);
  return serialize(m);
}

Result<Reply> decodeReply(std::string_view bytes, std::size_t maxBytes) {
  pb::Reply m;
  LOCKSTEP_TRY(parse(m, bytes, maxBytes, "reply"));
  Reply r;
  r.requestId = m.request_id();
  switch (m.body_case()) {
    case pb::Reply::kError: {
      LOCKSTEP_ASSIGN_OR_RETURN(auto code, fromPb(m.error().code()));
      if (m.error().message().empty()) return bad("error reply: the message is required");
      r.body = ErrorReply{code, m.error().message()};
      break;
    }
    case pb::Reply::kHello: {
      LOCKSTEP_ASSIGN_OR_RETURN(auto hello, fromPb(m.hello()));
      r.body = std::move(hello);
      break;
    }
    case pb::Reply::kStartJob:
      LOCKSTEP_TRY(validateJobId(m.start_job().job_id()));
      if (m.start_job().rendezvous_port() > 65535) return bad("start job reply: the rendezvous port is out of range");
      if (!isValidStoreSecret(m.start_job().store_secret())) return bad("start job reply: the store secret is not 64 hex digits");
      r.body = StartJobReply{m.start_job().job_id(), m.start_job().rendezvous_port(), m.start_job().store_secret()};
      break;
    case pb::Reply::kFetch: {
      FetchReply f{m.fetch().instance_id(), m.fetch().first_seq(), m.fetch().last_seq(), {}, m.fetch().jobs_version()};
      for (const auto& message : m.fetch().messages()) {
        LOCKSTEP_ASSIGN_OR_RETURN(auto decoded, detail::fromPb(message));
        f.messages.push_back(std::move(decoded));
      }
      r.body = std::move(f);
      break;
    }
    case pb::Reply::kJobs: {
      JobsReply jobs;
      for (const auto& job : m.jobs().jobs()) {
        LOCKSTEP_ASSIGN_OR_RETURN(auto decoded, fromPb(job));
        jobs.jobs.push_back(std::move(decoded));
      }
      r.body = std::move(jobs);
      break;
    }
    case pb::Reply::kLogs:
      LOCKSTEP_TRY(validateJobId(m.logs().job_id()));
      r.body = LogsReply{m.logs().job_id(), m.logs().rank(), m.logs().text(), m.logs().truncated()};
      break;
    case pb::Reply::kStacks: {
      LOCKSTEP_ASSIGN_OR_RETURN(auto stacks, detail::fromPb(m.stacks()));
      r.body = std::move(stacks);
      break;
    }
    case pb::Reply::kStopJob: {
      LOCKSTEP_TRY(validateJobId(m.stop_job().job_id()));
      LOCKSTEP_ASSIGN_OR_RETURN(auto state, (enumFromPb<JobState>(m.stop_job().state(), 1, 5, "stop job state")));
      r.body = StopJobReply{m.stop_job().job_id(), state};
      break;
    }
    case pb::Reply::BODY_NOT_SET:
      return bad("reply has no body");
  }
  return r;
}

std::string jobSpecToJson(const JobSpec& spec) {
  pb::JobSpec m;
  toPb(spec, &m);
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &json, options);
  return json;
}

Result<JobSpec> jobSpecFromJson(std::string_view json) {
  if (json.size() > kMaxMessageBytes) return bad("the job spec file is larger than 4 MiB");
  pb::JobSpec m;
  const auto status = google::protobuf::util::JsonStringToMessage(std::string(json), &m);
  if (!status.ok()) return bad("not a lockstep.v1.JobSpec in JSON: " + status.ToString());
  return fromPb(m);
}

std::string encode(const StreamMessage& message) {
  pb::StreamMessage m;
  detail::toPb(message, &m);
  return serialize(m);
}

Result<StreamMessage> decodeStreamMessage(std::string_view bytes, std::size_t maxBytes) {
  pb::StreamMessage m;
  LOCKSTEP_TRY(parse(m, bytes, maxBytes, "stream message"));
  return detail::fromPb(m);
}

}  // namespace lockstep
