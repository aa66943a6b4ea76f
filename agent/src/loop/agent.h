#pragma once
// The agent: one event loop over the client socket (ZeroMQ ROUTER, CURVE, ZAP-checked), the ranks'
// report socket, the node's sensors, the path checks, the evidence taker and the ranks' exit
// notifications. The loop (agent.cpp) owns what it polls and hands each readiness to the component
// that owns it: requests (requests.h), starts (jobs/starts.h), fetches and the rank inbox
// (stream/), stalls (stalls/stalls.h), access (access/), the Prometheus page (prometheus/publisher.h) and the
// agent's lifecycle (lifecycle.h).
//
// Requests are answered in order of arrival; Fetch may be held (a long poll) until a message newer
// than the client's last arrives or its wait runs out. Bad input of any kind gets an error reply
// (when there is someone to reply to) and the loop goes on.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "base/log.h"
#include "lockstep/common/result.h"
#include "lockstep/net/keys.h"
#include "loop/config.h"

namespace lockstep::agent {

class Agent {
 public:
  // Creates the state dir and key pair, loads NVML, restores the job table, binds the sockets.
  static Result<std::unique_ptr<Agent>> create(const AgentConfig& config, Log& log);
  ~Agent();

  const CurveKeyPair& keys() const;
  // Serves until stop becomes non-zero (the signal handler sets it).
  Result<void> run(const std::atomic<int>& stop);

  class Impl;

 private:
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::agent
