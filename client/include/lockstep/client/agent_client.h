#pragma once
// A connection to one lockstep-agent: CURVE with this client's key pair and the agent's pinned
// public key, requests with timeouts, and errors that say why a connection did not work (no agent
// listening, the agent refusing this client's key, or an agent whose key is not the pinned one).
// lockstepctl, the app and the agents' supervision use it. Not thread-safe: one thread per client
// (the clients of a process share one ZeroMQ context, and its one I/O thread).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "lockstep/common/clock.h"
#include "lockstep/common/result.h"
#include "lockstep/net/keys.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

inline constexpr std::uint16_t kDefaultAgentPort = 7700;
// How clients measure an agent's clock (AgentClient::measureClock): so many exchanges, this often.
inline constexpr int kClockExchanges = 8;
inline constexpr std::chrono::minutes kClockEvery{1};

struct AgentAddress {
  std::string host;
  std::uint16_t port = kDefaultAgentPort;
  std::string text() const { return host + ":" + std::to_string(port); }
  std::string endpoint() const { return "tcp://" + host + ":" + std::to_string(port); }
};

// "HOST:PORT" or "HOST" (port 7700).
Result<AgentAddress> parseAgentAddress(const std::string& text);

class AgentClient {
 public:
  // Connects and says hello. Errors: kUnavailable (nobody answers), kPermissionDenied (the agent
  // refused this client's key, or does not hold the pinned key), kTimeout.
  static Result<std::unique_ptr<AgentClient>> connect(const AgentAddress& address, const CurveKeyPair& clientKeys,
                                                      const std::string& agentPublicKey,
                                                      std::chrono::milliseconds timeout);
  // Opens the connection without waiting for the agent: connect() without its hello, for one
  // thread that greets many agents at once (sendHello, then receiveHello), so that a silent agent
  // does not hold up the others. hello() is empty until a hello is answered.
  static Result<std::unique_ptr<AgentClient>> open(const AgentAddress& address, const CurveKeyPair& clientKeys,
                                                   const std::string& agentPublicKey);
  ~AgentClient();
  AgentClient(const AgentClient&) = delete;
  AgentClient& operator=(const AgentClient&) = delete;

  const AgentAddress& address() const;
  const std::string& agentKey() const;  // the agent's public key, as pinned
  const NodeHello& hello() const;

  Result<NodeHello> refreshHello(std::chrono::milliseconds timeout);
  // The agent's clock against this one's (common/clock.h), as NTP estimates it: `exchanges`
  // hellos, timed here, each carrying the agent's time; the one with the shortest round trip
  // counts. kFailedPrecondition from an agent that says no time; `timeout` bounds each exchange.
  Result<ClockOffset> measureClock(int exchanges, std::chrono::milliseconds timeout);
  // storeSecret: rank 0's agent's (its StartJobReply), for the others; "" for rank 0's agent.
  Result<StartJobReply> startJob(const JobSpec& spec, const std::string& storeSecret, std::chrono::milliseconds timeout);
  Result<StopJobReply> stopJob(const std::string& jobId, std::uint32_t graceMs, std::chrono::milliseconds timeout);
  // Long poll: the agent answers once something newer than afterSeq exists, or after waitMs.
  // `jobsLeftOut` (at most kMaxJobsLeftOut): jobs whose records the caller reads fanned in.
  Result<FetchReply> fetch(std::uint64_t afterSeq, std::uint32_t maxMessages, std::uint32_t waitMs,
                           std::chrono::milliseconds timeout, std::vector<std::string> jobsLeftOut = {});
  // `knownSpecs`: the specs this caller holds from an earlier reply on this connection; their
  // statuses come with the spec left out (JobStatus::specOmitted), the rest in full.
  Result<JobsReply> listJobs(std::chrono::milliseconds timeout, std::vector<JobAttempt> knownSpecs = {});

  // A request in two halves, for one thread that asks many agents: send to each, then receive each
  // answer, so that the agents answer at once, not one after another. The answer is received by
  // `deadline` (one that came already is taken past it); `timeout` is what an error says was
  // allowed. One request at a time: a send leaves the answer of the one before it unread.
  using Clock = std::chrono::steady_clock;
  Result<void> sendFetch(std::uint64_t afterSeq, std::uint32_t maxMessages);
  Result<FetchReply> receiveFetch(Clock::time_point deadline, std::chrono::milliseconds timeout);
  Result<void> sendHello();
  Result<NodeHello> receiveHello(Clock::time_point deadline, std::chrono::milliseconds timeout);  // keeps it: hello()
  Result<void> sendListJobs(std::vector<JobAttempt> knownSpecs);
  Result<JobsReply> receiveListJobs(Clock::time_point deadline, std::chrono::milliseconds timeout);
  Result<void> sendStopJob(const std::string& jobId, std::uint32_t graceMs);
  Result<StopJobReply> receiveStopJob(Clock::time_point deadline, std::chrono::milliseconds timeout);
  Result<LogsReply> logs(const std::string& jobId, std::uint32_t rank, std::uint32_t maxBytes,
                         std::chrono::milliseconds timeout);
  // What the job's ranks here are doing (their stacks; docs/stalls.md). Taking them may need up to
  // about 45 s: give a timeout of a minute.
  Result<StacksReply> stacks(const std::string& jobId, std::optional<std::uint32_t> rank, std::chrono::milliseconds timeout);
  // A job's KPIs fanned in at its supervising agent (docs/fan-in.md): kpi::decodeFrame reads the
  // reply's `kpis`. Refused by an agent that does not supervise the job.
  Result<FrameReply> frame(const FrameRequest& request, std::chrono::milliseconds timeout);

  class Impl;

 private:
  explicit AgentClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Asks every one of `agents` to stop job `jobId` before taking any answer, so that each node's part
// hears of the stop at once. Asked one after another, a node's ranks could end before their agent
// heard: a stopped rank's peers see it go, and a program of the user's own then fails. One result
// per agent, in their order.
std::vector<Result<StopJobReply>> stopJobOnEach(const std::vector<AgentClient*>& agents, const std::string& jobId,
                                                std::uint32_t graceMs, std::chrono::milliseconds timeout);

}  // namespace lockstep
