#pragma once
// The agent's event loop's state (server.h): private to agent/, shared by server.cpp (requests,
// the loop), server_reports.cpp (what ranks push) and server_stalls.cpp (the stall watch, evidence
// and `stacks`).

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "evidence.h"
#include "jobs.h"
#include "key_ring.h"
#include "lockstep/net/connection_watch.h"
#include "lockstep/net/zmq_util.h"
#include "lockstep/protocol/types.h"
#include "metrics.h"
#include "nvml.h"
#include "owners.h"
#include "preflight.h"
#include "sampler.h"
#include "server.h"
#include "stalls.h"
#include "stream_buffer.h"
#include "supervision.h"

namespace lockstep::agent {

using Clock = std::chrono::steady_clock;

inline constexpr std::size_t kMaxReportBytes = 64u << 10;  // a message a rank pushes

class Agent::Impl {
 public:
  Impl(const AgentConfig& config, Log& log)
      : config_(config), log_(log), keyRing_(config_.authorizedKeysPath(), log), context_(1) {}

  Result<void> init();
  Result<void> loop(const std::atomic<int>& stop);
  const CurveKeyPair& keys() const { return keys_; }

 private:
  // A StartJob whose paths are being checked off the loop (preflight.h).
  struct PendingStart {
    std::string client;
    std::string key;  // the client's
    std::uint64_t requestId;
    JobSpec spec;
    std::string storeSecret;
    Identity owner;  // who its ranks run as
  };

  struct PendingFetch {
    std::string client;
    std::string key;
    std::uint64_t requestId;
    std::uint64_t afterSeq;
    std::size_t max;
    Clock::time_point deadline;
    std::optional<std::string> owner;  // shown only this user's jobs' messages; unset: all
  };

  // Who sent a request (server_access.cpp): a user's key, with the user its jobs run as, or a
  // supervising agent's key (supervision.h), which acts for the job's launcher.
  struct Access {
    bool user = false;
    bool admin = false;
    Identity runAs;
    std::string describe;  // for the audit log: the key's comment, fingerprint and user
    // The user whose jobs it sees; unset: every job (an admin's key, a supervising agent's).
    std::optional<std::string> onlyOwner() const {
      return user && !admin ? std::optional<std::string>(runAs.user) : std::nullopt;
    }
  };

  // Evidence being taken (evidence.h): for a client's `stacks`, or for a stall that began.
  struct PendingEvidence {
    std::string client;  // empty: for a stall
    std::uint64_t requestId = 0;
    std::optional<StallWatch::Change> stall;
  };

  void onRequest();
  void onFetch(const std::string& client, const std::string& key, const Access& access, std::uint64_t id,
               const FetchRequest& body);
  void watchConnections(bool events);
  // server_stalls.cpp
  void onStacks(const std::string& client, std::uint64_t id, const StacksRequest& request);
  void tickStalls();
  void onEvidence();
  void stallEvidenced(const StallWatch::Change& change, const StacksReply& evidence);
  std::vector<EvidenceTarget> evidenceTargets(const WatchedJob& job, std::optional<std::uint32_t> rank) const;
  void withProgress(JobStatus& job) const;
  void onStartJob(const std::string& client, const std::string& key, const Access& access, std::uint64_t id,
                  JobSpec spec, std::string storeSecret);
  // server_access.cpp
  Result<Access> accessOf(const std::string& key, const Request& request) const;
  Result<void> mayActOn(const Access& access, const std::string& jobId) const;
  FetchReply fetchFor(const std::optional<std::string>& onlyOwner, std::uint64_t afterSeq, std::size_t max) const;
  void onPreflight();
  bool cancelPendingStart(const std::string& jobId);
  void onReports();
  void takeNote(const JobEvent& pushed);
  void takePhase(PhaseReport pushed);
  void onSamples();
  void answerFetches(bool onlyExpired);
  void reply(const std::string& client, const Reply& reply);
  void replyError(const std::string& client, std::uint64_t requestId, const Error& error);
  NodeHello hello() const;
  bool authorized(const std::string& key);
  void revoke(const std::vector<std::string>& keys);
  Error revokedError() const;
  void append(StreamBuffer::Payload payload);
  Result<void> serveMetrics();
  Result<void> announce() const;
  Result<void> writeMetricsTargets() const;
  void publishMetrics();
  bool stillEnding();
  std::string slurmEndReason() const;
  bool idleTooLong();
  std::vector<JobStatus> listFor(const std::string& key, const Access& access) const;
  std::string launcherPath(const std::string& jobId) const;
  Result<Identity> restartOwner(const JobSpec& spec) const;

  AgentConfig config_;
  Log& log_;
  KeyRing keyRing_;
  Owners owners_;
  CurveKeyPair keys_;
  std::uint64_t instanceId_ = 0;
  std::int64_t clockShiftUs_ = 0;  // LOCKSTEP_TEST_CLOCK_OFFSET_US (server.cpp)
  std::unique_ptr<Nvml> nvml_;
  std::string gpuStatus_;
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;
  std::unique_ptr<zmq::socket_t> router_;
  std::unique_ptr<ConnectionWatch> watch_;  // bounds what one client's connection can make libzmq hold
  std::vector<Clock::time_point> trims_;    // when to give the heap back after a cut
  std::unique_ptr<zmq::socket_t> reports_;
  std::unique_ptr<StreamBuffer> stream_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<Sampler> sampler_;
  std::deque<PendingFetch> fetches_;
  std::unique_ptr<Preflight> preflight_;
  std::map<std::uint64_t, PendingStart> starts_;  // by preflight id
  std::uint64_t nextPreflightId_ = 1;
  std::uint64_t droppedReports_ = 0;
  std::map<std::string, std::uint32_t> notesPerJob_;  // rank notes taken, per job id
  struct PhaseBudget {  // a token bucket (server_reports.cpp)
    double tokens = 0;
    Clock::time_point filled;
    bool said = false;  // the log said this rank's phases are dropped
  };
  std::map<std::pair<std::string, std::uint32_t>, PhaseBudget> phaseBudgets_;  // by job id and rank
  bool reserveFailing_ = false;
  std::set<std::string> stoppedByUser_;  // jobs a user's key stopped
  std::unique_ptr<MetricsPage> metricsPage_;      // with --metrics-listen
  std::unique_ptr<MetricsServer> metricsServer_;
  Clock::time_point nextMetrics_;
  std::uint64_t fetchedUpTo_ = 0;  // the newest seq a client has asked for what follows
  std::optional<Clock::time_point> endingSince_, endedAt_, idleSince_;
  bool hadJob_ = false;  // for --exit-when-idle-s
  StallWatch stalls_;
  Clock::time_point nextStallTick_;
  EvidenceTaker evidence_;
  std::map<std::uint64_t, PendingEvidence> evidencePending_;  // by submission id
  std::uint64_t nextEvidenceId_ = 1;
  std::unique_ptr<Supervisions> supervisions_;  // last: its threads end before the rest goes
};

}  // namespace lockstep::agent
