#include "stream/rank_inbox.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>

#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"
#include "lockstep/net/zmq_util.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/stream.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxNoteBytes = 4096;
constexpr std::uint32_t kMaxNotesPerJob = 64;
// Phases are long (a checkpoint, an evaluation): more than 20 a second is a phase() around
// something small in a loop, which would flood the stream and the history. A bucket of 60 lets a
// burst through that a rank's reports bunched up in (a flush, an agent that was slow).
constexpr double kPhasesPerRankSecond = 20, kPhaseBurst = 60;

// What a rank may push: its step reports, its phases, and notes for its job's events (the
// trainer's bucket plans), no other kind of record.
struct RankPush : RecordSink {
  std::optional<StepReport> report;
  std::optional<PhaseReport> phase;
  std::optional<JobEvent> note;
  void onStep(const std::string&, const StepReport& r) override { report = r; }
  void onPhase(const std::string&, const PhaseReport& p) override { phase = p; }
  void onEvent(const std::string&, const JobEvent& e) override {
    if (e.kind == JobEventKind::kNote && e.rank && e.message.size() <= kMaxNoteBytes) note = e;
  }
};

}  // namespace

// In a directory of its own: jobs' sandboxes keep that directory, so a restarted agent's new
// socket is the one their ranks reach.
Result<std::string> RankInbox::endpointIn(const std::string& stateDir) {
  LOCKSTEP_TRY(makeDirectories((fs::path(stateDir) / "run").string(), 0700));
  const std::string socket = (fs::path(stateDir) / "run" / "report.sock").string();
  if (socket.size() > 100) {
    return invalidArgument("--state-dir " + stateDir + " is too long for a UNIX socket path (" +
                           std::to_string(socket.size()) + " bytes); use a shorter one");
  }
  return "ipc://" + socket;
}

RankInbox::RankInbox(zmq::context_t& context, JobManager& jobs, Stalls& stalls, StreamPort& stream, Log& log)
    : jobs_(jobs),
      stalls_(stalls),
      stream_(stream),
      log_(log),
      socket_(std::make_unique<zmq::socket_t>(context, zmq::socket_type::pull)) {}

Result<void> RankInbox::bind(const std::string& endpoint) {
  const std::string path = endpoint.substr(std::string("ipc://").size());
  socket_->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(kMaxReportBytes));
  socket_->set(zmq::sockopt::rcvhwm, 100000);
  socket_->set(zmq::sockopt::linger, 0);
  ::unlink(path.c_str());  // left by an agent that did not exit cleanly
  socket_->bind(endpoint);
  // Every job's ranks connect, whatever their user: they reach run/ only from their sandboxes,
  // since the state directory itself is the agent's alone (0700).
  if (::chmod(path.c_str(), 0666) != 0 || ::chmod(fs::path(path).parent_path().c_str(), 0711) != 0) {
    return errnoError("cannot open " + path + " to the jobs' users", errno);
  }
  return {};
}

void RankInbox::onReports() {
  // Ranks push StreamMessages holding their reports; the agent numbers them in its stream.
  for (int i = 0; i < 1000; ++i) {
    auto frames = receiveMultipart(*socket_, 1);
    if (!frames) {
      if (frames.error().code == ErrorCode::kUnavailable) return;
      ++dropped_;
      continue;
    }
    auto message = decodeStreamMessage((*frames)[0].to_string_view(), kMaxReportBytes);
    RankPush pushed;
    if (message) visitRecord(*message, pushed);
    if (pushed.note && jobs_.knowsRank(pushed.note->jobId, *pushed.note->rank)) {
      takeNote(*pushed.note);
      continue;
    }
    if (pushed.phase && jobs_.knowsRank(pushed.phase->jobId, pushed.phase->rank)) {
      takePhase(std::move(*pushed.phase));
      continue;
    }
    const auto& report = pushed.report;
    if (!report || !jobs_.knowsRank(report->jobId, report->rank)) {
      if (dropped_++ % 1000 == 0) {
        log_.info("dropped a rank report: " +
                  (message ? std::string("not a report of a rank here") : message.error().message));
      }
      continue;
    }
    jobs_.noteStep(report->jobId, report->rank, report->step);
    stalls_.noteStep(report->jobId, report->rank, report->stepTimeUs);
    stream_.append(std::move(*pushed.report));
  }
}

// A rank's note joins its job's events: its text and rank only, printable, stamped by this agent,
// at most kMaxNotesPerJob per job.
void RankInbox::takeNote(const JobEvent& pushed) {
  if (notesPerJob_.size() > 1024) notesPerJob_.clear();  // bounded; a job may then note 64 more
  const std::uint32_t taken = notesPerJob_[pushed.jobId]++;
  if (taken == kMaxNotesPerJob) log_.info("job " + pushed.jobId + " sent more than 64 notes; the rest are dropped");
  if (taken >= kMaxNotesPerJob) return;
  JobEvent note;
  note.jobId = pushed.jobId;
  note.kind = JobEventKind::kNote;
  note.rank = pushed.rank;
  note.timeUnixUs = unixMicrosNow();
  for (const char c : pushed.message) note.message += (c >= 0x20 && c != 0x7f) || (c & 0x80) ? c : ' ';
  stream_.append(std::move(note));
}

// A rank's phase joins the stream (validated by the codec), kPhasesPerRankSecond a second per rank
// on average, in bursts of up to kPhaseBurst.
void RankInbox::takePhase(PhaseReport pushed) {
  if (phaseBudgets_.size() > 65536) phaseBudgets_.clear();  // bounded; each rank then starts afresh
  const auto now = std::chrono::steady_clock::now();
  PhaseBudget& budget =
      phaseBudgets_.try_emplace({pushed.jobId, pushed.rank}, PhaseBudget{kPhaseBurst, now, false}).first->second;
  budget.tokens = std::min(
      kPhaseBurst, budget.tokens + std::chrono::duration<double>(now - budget.filled).count() * kPhasesPerRankSecond);
  budget.filled = now;
  if (budget.tokens < 1) {
    if (!budget.said) {
      log_.info("job " + pushed.jobId + " rank " + std::to_string(pushed.rank) + " closes more than " +
                std::to_string(static_cast<int>(kPhasesPerRankSecond)) + " phases a second; the rest are dropped");
    }
    budget.said = true;
    return;
  }
  budget.tokens -= 1;
  stream_.append(std::move(pushed));
}

}  // namespace lockstep::agent
