#pragma once
// What ranks push to their agent over the report socket (run/report.sock, a ZeroMQ PULL socket;
// docs/agent.md): step reports, the phases their programs named, and notes for their job's
// events. Each is taken only from a rank of a job here, and bounded: a note's size and count per
// job, phases per rank per second (a token bucket). What is taken joins the node's stream.
// The socket is every job's: a record is taken only from a process of the job it names
// (JobManager::sentByJob: its PID namespace, cgroup and user), which the kernel told when that
// process connected (SO_PEERCRED, which libzmq keeps with each message it reads, "Peer-Address").
// The verdict is kept per connection and claimed job (bounded); a record claiming a job not its
// sender's is refused, counted, and said in the log once per job claimed.
// Event loop only.

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <memory>
#include <string>
#include <utility>
#include <zmq.hpp>

#include "base/log.h"
#include "base/ports.h"
#include "jobs/jobs.h"
#include "lockstep/common/result.h"
#include "stalls/stalls.h"
#include "stream/peaks.h"

namespace lockstep::agent {

class RankInbox {
 public:
  static constexpr std::size_t kMaxReportBytes = 64u << 10;  // a message a rank pushes

  // The endpoint ranks push to (LOCKSTEP_REPORT): STATE/run/report.sock, its directory made.
  static Result<std::string> endpointIn(const std::string& stateDir);

  RankInbox(zmq::context_t& context, JobManager& jobs, Stalls& stalls, Peaks& peaks, StreamPort& stream, Log& log);

  // Binds `endpoint` (from endpointIn) and opens it to every job's user. Throws zmq::error_t.
  Result<void> bind(const std::string& endpoint);
  zmq::pollitem_t pollItem() const { return {socket_->handle(), 0, ZMQ_POLLIN, 0}; }
  // Takes what ranks pushed (up to 1000 messages a call).
  void onReports();

 private:
  struct PhaseBudget {  // a token bucket
    double tokens = 0;
    std::chrono::steady_clock::time_point filled;
    bool said = false;  // the log said this rank's phases are dropped
  };

  // The process that sent a message, and its connection.
  struct Sender {
    std::uintptr_t connection = 0;  // its metadata (its address), the same for all its messages
    int fd = -1;                       // the connection's descriptor (ZMQ_SRCFD)
    pid_t pid = 0;
    uid_t uid = 0;
  };
  // Whether `message`'s sender is a process of job `jobId`; a refusal is counted and said.
  bool fromJob(const zmq::message_t& message, const std::string& jobId, std::uint32_t rank);
  // Forgets the verdicts on connections whose descriptor a new connection took (the monitor's).
  void onConnections();

  void takeNote(const JobEvent& pushed);
  void takePhase(PhaseReport pushed);

  JobManager& jobs_;
  Stalls& stalls_;
  Peaks& peaks_;
  StreamPort& stream_;
  Log& log_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::unique_ptr<zmq::socket_t> monitor_;  // the socket's accepted connections
  std::uint64_t dropped_ = 0;
  std::uint64_t refused_ = 0;  // records a process sent in another job's name
  // Verdicts by connection (descriptor first, to forget it), its peer and the job it claimed.
  std::map<std::tuple<int, std::uintptr_t, pid_t, uid_t, std::string>, bool> verdicts_;
  std::set<std::string> refusalsSaid_;  // the jobs claimed, that the log said so for
  std::map<std::string, std::uint32_t> notesPerJob_;                           // rank notes taken, per job id
  std::map<std::pair<std::string, std::uint32_t>, PhaseBudget> phaseBudgets_;  // by job id and rank
};

}  // namespace lockstep::agent
