#include "stall_pb.h"

#include "lockstep/protocol/validate.h"

namespace lockstep::detail {
namespace {

namespace pb = ::lockstep::v1;

constexpr std::size_t kMaxShortText = 256;             // a phase, a process state
constexpr std::size_t kMaxEvidenceText = 256 * 1024;   // stacks, threads, a backtrace, a log's end
constexpr int kMaxRanks = 65536;

Result<void> bounded(const std::string& text, std::size_t max, const char* what) {
  if (text.size() > max) return invalidArgument(std::string(what) + " is longer than " + std::to_string(max) + " bytes");
  return {};
}

}  // namespace

void toPb(const RankProgress& p, pb::RankProgress* m) {
  m->set_rank(p.rank);
  m->set_recorded(p.recorded);
  m->set_reports_steps(p.reportsSteps);
  m->set_step(p.step);
  m->set_phase(p.phase);
  m->set_announced(p.announced);
  m->set_phase_ms(p.phaseMs);
  m->set_collectives(p.collectives);
  m->set_in_collective(p.inCollective);
  m->set_bucket(p.bucket);
  m->set_buckets(p.buckets);
  m->set_still_ms(p.stillMs);
  m->set_allowance_ms(p.allowanceMs);
  m->set_process_state(p.processState);
  m->set_collective_kind(p.collectiveKind);
}

Result<RankProgress> fromPb(const pb::RankProgress& m) {
  LOCKSTEP_TRY(bounded(m.phase(), kMaxShortText, "a rank's phase"));
  LOCKSTEP_TRY(bounded(m.process_state(), kMaxShortText, "a rank's process state"));
  if (m.phase_ms() < 0 || m.still_ms() < 0 || m.allowance_ms() < 0) return invalidArgument("a rank's progress has a negative time");
  return RankProgress{m.rank(),         m.recorded(),     m.reports_steps(), m.step(),
                      m.phase(),        m.announced(),    m.phase_ms(),      m.collectives(),
                      m.in_collective(), m.bucket(),      m.buckets(),       m.still_ms(),
                      m.allowance_ms(), m.process_state(), m.collective_kind()};
}

void toPb(const Stall& s, pb::Stall* m) {
  m->set_since_unix_us(s.sinceUnixUs);
  m->set_message(s.message);
  for (auto rank : s.ranks) m->add_ranks(rank);
}

Result<Stall> fromPb(const pb::Stall& m) {
  LOCKSTEP_TRY(bounded(m.message(), 64 * 1024, "a stall's message"));
  if (m.ranks_size() > kMaxRanks) return invalidArgument("a stall names more than 65536 ranks");
  return Stall{m.since_unix_us(), m.message(), {m.ranks().begin(), m.ranks().end()}};
}

void toPb(const StacksReply& r, pb::StacksReply* m) {
  m->set_job_id(r.jobId);
  for (const auto& e : r.ranks) {
    auto* out = m->add_ranks();
    out->set_rank(e.rank);
    out->set_pid(e.pid);
    out->set_node(e.node);
    out->set_time_unix_us(e.timeUnixUs);
    toPb(e.progress, out->mutable_progress());
    out->set_process_state(e.processState);
    if (e.cpuMoving) out->set_cpu_moving(*e.cpuMoving);
    out->set_threads(e.threads);
    out->set_python_stacks(e.pythonStacks);
    out->set_native_backtrace(e.nativeBacktrace);
    out->set_log_tail(e.logTail);
    out->set_note(e.note);
  }
}

Result<StacksReply> fromPb(const pb::StacksReply& m) {
  LOCKSTEP_TRY(validateJobId(m.job_id()));
  if (m.ranks_size() > kMaxRanks) return invalidArgument("a stacks reply names more than 65536 ranks");
  StacksReply r{m.job_id(), {}};
  for (const auto& e : m.ranks()) {
    for (const auto* text : {&e.threads(), &e.python_stacks(), &e.native_backtrace(), &e.log_tail(), &e.note()}) {
      LOCKSTEP_TRY(bounded(*text, kMaxEvidenceText, "a rank's evidence"));
    }
    LOCKSTEP_TRY(bounded(e.node(), kMaxShortText, "a rank's node"));
    LOCKSTEP_TRY(bounded(e.process_state(), kMaxShortText, "a rank's process state"));
    LOCKSTEP_ASSIGN_OR_RETURN(auto progress, fromPb(e.progress()));
    RankEvidence out{e.rank(), e.pid(), e.node(), e.time_unix_us(), std::move(progress), e.process_state(),
                     std::nullopt, e.threads(), e.python_stacks(), e.native_backtrace(), e.log_tail(), e.note()};
    if (e.has_cpu_moving()) out.cpuMoving = e.cpu_moving();
    r.ranks.push_back(std::move(out));
  }
  return r;
}

}  // namespace lockstep::detail
