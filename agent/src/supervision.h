#pragma once
// Supervising jobs on the node side (docs/agent.md, "Supervision"): the agent that ran rank 0 of a
// job's first attempt (the first of the job's agents) carries out what client/supervisor.h decides
// (stop a failed job's other parts, restart it with the ranks left), so that a job goes on when
// no client is connected. One thread per job reaches the job's agents, this one included, with
// this node's key, pinning each agent's key as the job's spec names it; each of those agents lets
// that key list, stop and restart this job, and nothing else (server.cpp). Clients only follow:
// the job's status on this agent carries the supervision's state and its attempts.

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/net/keys.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

class Log;

class Supervisions {
 public:
  Supervisions(CurveKeyPair nodeKeys, Log& log);
  ~Supervisions();  // stops and joins every thread (the jobs go on; a restarted agent resumes them)
  Supervisions(const Supervisions&) = delete;
  Supervisions& operator=(const Supervisions&) = delete;

  // Begins supervising the job of `spec` unless it already is.
  void supervise(const JobSpec& spec);
  // The job's supervision as it stands; kNone when this agent does not supervise it.
  Supervision of(const std::string& jobId) const;

  class Worker;

 private:
  CurveKeyPair keys_;
  Log& log_;
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Worker>> workers_;  // by job id, kept once ended
};

// The jobs of `jobs` that `key` supervises (it is their first agent's key).
std::vector<std::string> jobsSupervisedBy(const std::string& key, const std::vector<JobStatus>& jobs);

// What a supervising agent's key may ask of this agent: hello; list, stop and restart (a later
// attempt of the same program: elastic.h's isRestartOf) the jobs it supervises; nothing else.
Result<void> supervisorMay(const Request& request, const std::string& key, const std::vector<JobStatus>& jobs,
                           const std::string& node);

}  // namespace lockstep::agent
