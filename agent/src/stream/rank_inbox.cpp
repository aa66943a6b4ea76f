#include "stream/rank_inbox.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
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
// Verdicts kept on who sent what: one per connection and job it claims (a rank's connection claims
// its own only); beyond this many they are all forgotten, and found again as records come.
constexpr std::size_t kMaxVerdicts = 4096;
constexpr std::size_t kMaxRefusalsSaid = 1024;  // jobs claimed that the log says so for, once each

// "HOST:UID:GID:PID", libzmq's Peer-Address of a connection over a UNIX socket (from SO_PEERCRED
// when it accepted the connection): its uid and pid.
bool peerOf(const char* address, pid_t* pid, uid_t* uid) {
  if (address == nullptr) return false;
  const std::string text = address;
  const auto last = text.rfind(':');
  const auto gid = last == std::string::npos || last == 0 ? std::string::npos : text.rfind(':', last - 1);
  const auto first = gid == std::string::npos || gid == 0 ? std::string::npos : text.rfind(':', gid - 1);
  if (first == std::string::npos) return false;
  const auto number = [](const std::string& digits, long long* out) {
    if (digits.empty() || digits.size() > 10 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
    *out = std::stoll(digits);
    return true;
  };
  long long p = 0, u = 0;
  if (!number(text.substr(first + 1, gid - first - 1), &u) || !number(text.substr(last + 1), &p)) return false;
  if (p <= 0 || p > std::numeric_limits<pid_t>::max() || u > std::numeric_limits<uid_t>::max()) return false;
  *pid = static_cast<pid_t>(p);
  *uid = static_cast<uid_t>(u);
  return true;
}

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

RankInbox::RankInbox(zmq::context_t& context, JobManager& jobs, Stalls& stalls, Peaks& peaks, StreamPort& stream,
                     Log& log)
    : jobs_(jobs),
      stalls_(stalls),
      peaks_(peaks),
      stream_(stream),
      log_(log),
      socket_(std::make_unique<zmq::socket_t>(context, zmq::socket_type::pull)),
      monitor_(std::make_unique<zmq::socket_t>(context, zmq::socket_type::pair)) {
  // The connections it accepts, by descriptor: a verdict on one is forgotten when another takes its
  // descriptor (a new connection's comes before any of its messages).
  const std::string at = "inproc://lockstep.rank-inbox." + std::to_string(reinterpret_cast<std::uintptr_t>(this));
  if (zmq_socket_monitor(socket_->handle(), at.c_str(), ZMQ_EVENT_ACCEPTED) != 0) throw zmq::error_t();
  monitor_->set(zmq::sockopt::linger, 0);
  monitor_->connect(at);
}

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
  onConnections();  // also when no record asks (the monitor holds at most 1000 events)
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
    const zmq::message_t& frame = (*frames)[0];
    if (pushed.note && jobs_.knowsRank(pushed.note->jobId, *pushed.note->rank)) {
      if (fromJob(frame, pushed.note->jobId, *pushed.note->rank)) takeNote(*pushed.note);
      continue;
    }
    if (pushed.phase && jobs_.knowsRank(pushed.phase->jobId, pushed.phase->rank)) {
      if (fromJob(frame, pushed.phase->jobId, pushed.phase->rank)) takePhase(std::move(*pushed.phase));
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
    if (!fromJob(frame, report->jobId, report->rank)) continue;
    jobs_.noteStep(report->jobId, report->rank, report->step);
    stalls_.noteStep(report->jobId, report->rank, report->stepTimeUs);
    const auto hardware = [&] { return jobs_.hardwareOf(report->jobId, report->rank); };
    if (auto said = peaks_.stamp(*pushed.report, hardware)) stream_.append(std::move(*said));  // its peak is ours to say
    stream_.append(std::move(*pushed.report));
  }
}

// The sender as libzmq kept it with the message (SO_PEERCRED when it accepted the connection), else
// as the connection's descriptor says now. Then the verdict kept for that connection and job, or
// the job manager's.
bool RankInbox::fromJob(const zmq::message_t& message, const std::string& jobId, std::uint32_t rank) {
  onConnections();
  Sender sender;
  sender.fd = zmq_msg_get(message.handle(), ZMQ_SRCFD);
  const char* peer = zmq_msg_gets(message.handle(), "Peer-Address");
  bool known = peerOf(peer, &sender.pid, &sender.uid);
  if (known) {
    sender.connection = reinterpret_cast<std::uintptr_t>(peer);
  } else if (sender.fd >= 0) {  // a libzmq that keeps no peer credentials
    ucred cred{};
    socklen_t size = sizeof cred;
    known = ::getsockopt(sender.fd, SOL_SOCKET, SO_PEERCRED, &cred, &size) == 0 && cred.pid > 0;
    sender.pid = cred.pid;
    sender.uid = cred.uid;
  }
  bool ok = false;
  if (known) {
    const auto key = std::make_tuple(sender.fd, sender.connection, sender.pid, sender.uid, jobId);
    if (const auto kept = verdicts_.find(key); kept != verdicts_.end()) {
      ok = kept->second;
    } else {
      ok = jobs_.sentByJob(jobId, sender.pid, sender.uid);
      if (verdicts_.size() >= kMaxVerdicts) verdicts_.clear();
      verdicts_.emplace(key, ok);
    }
  }
  if (ok) return true;
  ++refused_;
  if (refusalsSaid_.size() < kMaxRefusalsSaid && refusalsSaid_.insert(jobId).second) {
    log_.info("refused a record claiming job " + jobId + " rank " + std::to_string(rank) + " from " +
              (known ? "pid " + std::to_string(sender.pid) + " (uid " + std::to_string(sender.uid) + ")"
                     : std::string("a process the kernel did not name")) +
              ", not a process of that job; such records are dropped and counted");
  } else if (refused_ % 10000 == 0) {
    log_.info("refused " + std::to_string(refused_) + " records from processes not of the job they named");
  }
  return false;
}

void RankInbox::onConnections() {
  zmq::message_t event, endpoint;
  while (monitor_->recv(event, zmq::recv_flags::dontwait)) {
    if (event.more()) (void)monitor_->recv(endpoint, zmq::recv_flags::none);
    if (event.size() < 6) continue;
    std::uint16_t id = 0;
    std::uint32_t fd = 0;
    std::memcpy(&id, event.data(), sizeof id);
    std::memcpy(&fd, static_cast<const char*>(event.data()) + 2, sizeof fd);
    if (id != ZMQ_EVENT_ACCEPTED) continue;
    const int taken = static_cast<int>(fd);
    for (auto it = verdicts_.lower_bound(std::make_tuple(taken, std::uintptr_t{0},
                                                          std::numeric_limits<pid_t>::min(), uid_t{0}, std::string()));
         it != verdicts_.end() && std::get<0>(it->first) == taken;) {
      it = verdicts_.erase(it);
    }
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
