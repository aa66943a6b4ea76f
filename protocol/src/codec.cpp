#include "lockstep/protocol/codec.h"

#include <cmath>
#include <cstdio>
#include <iterator>

#include "lockstep/common/store_secret.h"
#include "lockstep/protocol/names.h"
#include "lockstep/protocol/validate.h"
#include "lockstep/v1/lockstep.pb.h"
#include "stall_pb.h"
#include "spec_pb.h"
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
LOCKSTEP_SAME(Precision::kFp16, PRECISION_FP16);
LOCKSTEP_SAME(Precision::kFp8, PRECISION_FP8);
LOCKSTEP_SAME(FlopsBasis::kDeclared, FLOPS_BASIS_DECLARED);
LOCKSTEP_SAME(FlopsBasis::kTokens, FLOPS_BASIS_TOKENS);
LOCKSTEP_SAME(FlopsBasis::kLayers, FLOPS_BASIS_LAYERS);
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
LOCKSTEP_SAME(JobEventKind::kAlertFiring, JOB_EVENT_KIND_ALERT_FIRING);
LOCKSTEP_SAME(JobEventKind::kAlertResolved, JOB_EVENT_KIND_ALERT_RESOLVED);
LOCKSTEP_SAME(JobEventKind::kAlertUndelivered, JOB_EVENT_KIND_ALERT_UNDELIVERED);
LOCKSTEP_SAME(JobEventKind::kPeak, JOB_EVENT_KIND_PEAK);
LOCKSTEP_SAME(OnStall::kReport, ON_STALL_REPORT);
LOCKSTEP_SAME(OnStall::kStop, ON_STALL_STOP);
LOCKSTEP_SAME(OnStall::kRestart, ON_STALL_RESTART);
LOCKSTEP_SAME(Shard::kNone, SHARD_NONE);
LOCKSTEP_SAME(Shard::kOptimizer, SHARD_OPTIMIZER);
LOCKSTEP_SAME(Shard::kGradients, SHARD_GRADIENTS);
LOCKSTEP_SAME(Shard::kParameters, SHARD_PARAMETERS);
LOCKSTEP_SAME(Sync::kAllReduce, SYNC_ALL_REDUCE);
LOCKSTEP_SAME(Sync::kParameterServer, SYNC_PARAMETER_SERVER);
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
static_assert(std::size(kFlopsBasisNames) == pb::FlopsBasis_ARRAYSIZE - 1);
static_assert(std::size(kOptimizerNames) == pb::OptimizerKind_ARRAYSIZE - 1);
static_assert(std::size(kLrScalingNames) == pb::LrScaling_ARRAYSIZE);  // LR_SCALING_NONE is a value
static_assert(std::size(kSupervisionStateNames) == pb::SupervisionState_ARRAYSIZE);  // so is UNSPECIFIED
static_assert(std::size(kOnStallNames) == pb::OnStall_ARRAYSIZE);  // ON_STALL_REPORT is a value
static_assert(std::size(kShardNames) == pb::Shard_ARRAYSIZE);      // so is SHARD_NONE
static_assert(std::size(kSyncNames) == pb::Sync_ARRAYSIZE);        // and SYNC_ALL_REDUCE

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

// Walks the spec's one description (spec_codec.cpp).
using detail::fromPb;
using detail::toPb;

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
  m->set_free_cores(h.freeCores);
  m->set_free_memory_bytes(h.freeMemoryBytes);
  for (const auto& off : h.fencesOff) m->add_fences_off(off);
  if (h.cpuCorePeakFlops) m->set_cpu_core_peak_flops(*h.cpuCorePeakFlops);
  m->set_cpu_peak_basis(h.cpuPeakBasis);
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
  h.freeCores = m.free_cores();
  h.freeMemoryBytes = m.free_memory_bytes();
  h.fencesOff.assign(m.fences_off().begin(), m.fences_off().end());
  if (m.has_cpu_core_peak_flops()) h.cpuCorePeakFlops = m.cpu_core_peak_flops();
  h.cpuPeakBasis = m.cpu_peak_basis();
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
  if (j.specOmitted) {  // which job at which attempt, nothing else
    m->mutable_spec()->set_job_id(j.spec.jobId);
    m->mutable_spec()->set_attempt(j.spec.attempt);
  } else {
    toPb(j.spec, m->mutable_spec());
  }
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
  for (const auto cpu : j.cpus) m->add_cpus(cpu);
  m->set_memory_limit_bytes(j.memoryLimitBytes);
  m->set_spec_omitted(j.specOmitted);
  m->set_stop_asked(j.stopAsked);
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
  j.specOmitted = m.spec_omitted();
  if (j.specOmitted) {
    // Only which job at which attempt: the client holds the rest.
    LOCKSTEP_TRY(validateJobId(m.spec().job_id()));
    j.spec.jobId = m.spec().job_id();
    j.spec.attempt = m.spec().attempt();
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(j.spec, fromPb(m.spec()));
  }
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
  if (m.cpus_size() > 65536) return bad("job status holds more than 65536 cores");
  j.cpus.assign(m.cpus().begin(), m.cpus().end());
  j.memoryLimitBytes = m.memory_limit_bytes();
  j.stopAsked = m.stop_asked();
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

void toPb(const FrameReply& f, pb::FrameReply* m) {
  m->set_job_id(f.jobId);
  m->set_time_unix_us(f.timeUnixUs);
  m->set_ended(f.ended);
  m->set_state(static_cast<pb::JobState>(f.state));
  m->set_kpis(f.kpis);
  for (const auto& e : f.events) detail::toPb(e, m->add_events());
  m->set_last_event(f.lastEvent);
  if (f.stall) detail::toPb(*f.stall, m->mutable_stall());
}

// The KPIs' bytes are read by kpi/frame.h; here only what the frame carries beside them.
Result<FrameReply> fromPb(const pb::FrameReply& m) {
  LOCKSTEP_TRY(validateJobId(m.job_id()));
  if (static_cast<std::size_t>(m.events_size()) > kMaxFrameEvents) {
    return bad("frame: more than " + std::to_string(kMaxFrameEvents) + " events");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto state, (enumFromPb<JobState>(m.state(), 1, 5, "frame's job state")));
  FrameReply f{m.job_id(), m.time_unix_us(), m.ended(), state, m.kpis(), {}, m.last_event(), std::nullopt};
  for (const auto& e : m.events()) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto event, detail::fromPb(e));
    if (!std::holds_alternative<JobEvent>(event.payload) || jobOf(event.payload) != f.jobId) {
      return bad("frame: an event that is not one of job " + f.jobId + "'s");
    }
    const std::uint64_t after = f.events.empty() ? 0 : f.events.back().seq;
    if (event.seq <= after || event.seq > f.lastEvent) {
      return bad("frame: its events are not numbered upwards to its last (" + std::to_string(f.lastEvent) + ")");
    }
    f.events.push_back(std::move(event));
  }
  if (m.has_stall()) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto stall, detail::fromPb(m.stall()));
    f.stall = std::move(stall);
  }
  return f;
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
          for (const auto& job : body.jobsLeftOut) m.mutable_fetch()->add_jobs_left_out(job);
        } else if constexpr (std::is_same_v<T, ListJobsRequest>) {
          auto* list = m.mutable_list_jobs();
          for (const auto& known : body.knownSpecs) {
            auto* k = list->add_known_specs();
            k->set_job_id(known.jobId);
            k->set_attempt(known.attempt);
          }
        } else if constexpr (std::is_same_v<T, LogsRequest>) {
          m.mutable_logs()->set_job_id(body.jobId);
          m.mutable_logs()->set_rank(body.rank);
          m.mutable_logs()->set_max_bytes(body.maxBytes);
        } else if constexpr (std::is_same_v<T, StacksRequest>) {
          m.mutable_stacks()->set_job_id(body.jobId);
          setIf(body.rank, m.mutable_stacks(), &pb::StacksRequest::set_rank);
        } else {
          auto* f = m.mutable_frame();
          f->set_job_id(body.jobId);
          f->set_ranks_from(body.ranksFrom);
          f->set_ranks_count(body.ranksCount);
          f->set_events_after(body.eventsAfter);
          f->set_node_blocks(body.nodeBlocks);
          f->set_held_unix_us(body.heldUnixUs);
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
      case pb::Request::kFetch: {
        if (m.fetch().wait_ms() > 60000) return bad("fetch: wait_ms is over 60000");
        if (static_cast<std::size_t>(m.fetch().jobs_left_out_size()) > kMaxJobsLeftOut) {
          return bad("fetch: more than " + std::to_string(kMaxJobsLeftOut) + " jobs left out");
        }
        FetchRequest fetch{m.fetch().after_seq(), m.fetch().max_messages(), m.fetch().wait_ms(), {}};
        for (const auto& job : m.fetch().jobs_left_out()) {
          LOCKSTEP_TRY(validateJobId(job));
          fetch.jobsLeftOut.push_back(job);
        }
        return Body{std::move(fetch)};
      }
      case pb::Request::kListJobs: {
        if (static_cast<std::size_t>(m.list_jobs().known_specs_size()) > kMaxKnownSpecs) {
          return bad("list jobs: more than " + std::to_string(kMaxKnownSpecs) + " known specs");
        }
        ListJobsRequest list;
        for (const auto& k : m.list_jobs().known_specs()) {
          LOCKSTEP_TRY(validateJobId(k.job_id()));
          list.knownSpecs.push_back({k.job_id(), k.attempt()});
        }
        return Body{std::move(list)};
      }
      case pb::Request::kLogs:
        LOCKSTEP_TRY(validateJobId(m.logs().job_id()));
        return Body{LogsRequest{m.logs().job_id(), m.logs().rank(), m.logs().max_bytes()}};
      case pb::Request::kStacks: {
        LOCKSTEP_TRY(validateJobId(m.stacks().job_id()));
        StacksRequest stacks{m.stacks().job_id(), std::nullopt};
        if (m.stacks().has_rank()) stacks.rank = m.stacks().rank();
        return Body{std::move(stacks)};
      }
      case pb::Request::kFrame: {
        const auto& f = m.frame();
        LOCKSTEP_TRY(validateJobId(f.job_id()));
        if (f.ranks_count() > kMaxFrameRanks) {
          return bad("frame: ranks_count is over " + std::to_string(kMaxFrameRanks) + "; ask for the ranks in view");
        }
        return Body{FrameRequest{f.job_id(), f.ranks_from(), f.ranks_count(), f.events_after(), f.node_blocks(), f.held_unix_us()}};
      }
      case pb::Request::BODY_NOT_SET:
        break;
    }
    return bad("request has no body (hello, start_job, stop_job, fetch, list_jobs, logs, stacks or frame)");
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
        } else if constexpr (std::is_same_v<T, StacksReply>) {
          detail::toPb(body, m.mutable_stacks());
        } else {
          toPb(body, m.mutable_frame());
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
    case pb::Reply::kFrame: {
      LOCKSTEP_ASSIGN_OR_RETURN(auto frame, fromPb(m.frame()));
      r.body = std::move(frame);
      break;
    }
    case pb::Reply::BODY_NOT_SET:
      return bad("reply has no body");
  }
  return r;
}

std::string jobSpecToJson(const JobSpec& spec, bool oneLine) {
  pb::JobSpec m;
  toPb(spec, &m);
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = !oneLine;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &json, options);
  return json;
}

Result<JobSpec> jobSpecFromJson(std::string_view json) {
  // A spec's JSON (a file, the history's and the agent's own records) is larger than its message:
  // 32,768 ranks on nodes with 255-character names, indented, are about 12 MB.
  if (json.size() > (32u << 20)) return bad("the job spec file is larger than 32 MiB");
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
