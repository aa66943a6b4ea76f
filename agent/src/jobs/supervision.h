#pragma once
// Supervising jobs on the node side (docs/agent.md, "Supervision"): the agent that ran rank 0 of a
// job's first attempt (the first of the job's agents) carries out what client/supervisor.h decides
// (stop a failed job's other parts, restart it with the ranks left), so that a job goes on when
// no client is connected. One thread per job reaches the job's agents, this one included, with
// this node's key, pinning each agent's key as the job's spec names it; each of those agents lets
// that key list, stop and restart this job, and nothing else (access/supervisor_keys.h). Clients
// only follow: the job's status on this agent carries the supervision's state and its attempts.
// The job's second agent stands by: it mirrors the first's supervision, and takes over where it
// stood when the first stops answering (its node lost).

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/client/supervisor.h"
#include "lockstep/net/keys.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

class AlertDesk;
class Log;


class Supervisions {
 public:
  // Whether the agent's table still holds a job (JobManager::holds; called from supervise, on the
  // agent's loop).
  using Held = std::function<bool(const std::string& jobId)>;
  // `node`: this agent's node name; a job whose second agent it is gets a standby.
  // `alerts`: where the jobs' alerts go (it outlives this). Without `held` (no table), ended
  // supervisions stay.
  Supervisions(std::string node, CurveKeyPair nodeKeys, AlertDesk& alerts, Log& log, Held held = {});
  ~Supervisions();  // stops and joins every thread (the jobs go on; a restarted agent resumes them)
  Supervisions(const Supervisions&) = delete;
  Supervisions& operator=(const Supervisions&) = delete;

  // Whether this agent supervises the job (its first agent) or stands by (its second).
  bool supervises(const JobSpec& spec) const;
  // Whether the job's alert rules and webhooks can run here (alerts/alert_desk.h).
  Result<void> checkAlerts(const JobSpec& spec) const;
  // Begins supervising (or standing by for) the job of `spec` unless it already does. Ended
  // supervisions go first where the agent's table no longer `held` their job (it keeps the newest
  // --keep-jobs ended jobs: their last frames and threads go with them), and where a new job (attempt
  // 0) takes the id of one that ended here: the agent refuses an id its table still holds.
  void supervise(const JobSpec& spec);
  // A user's key asked this agent to stop the job: where it supervises the job (or once it takes
  // over), the job ends stopped however its parts end, and its other parts are asked to stop too,
  // with the same grace.
  void stopAskedByUser(const std::string& jobId, std::string why, std::uint32_t graceMs);
  // The job's supervision as it stands; kNone when this agent does not supervise it.
  Supervision of(const std::string& jobId) const;
  // Whether this agent supervises (or stands by for) the job and it has not ended.
  bool goesOn(const std::string& jobId) const;
  // The job's KPIs, the rows of the ranks asked for and its events, as this agent's supervision last
  // read them from the job's agents (docs/fan-in.md); refused where it does not supervise the job.
  Result<FrameReply> frameOf(const FrameRequest& request) const;

  class Worker;

 private:
  SupervisingRole roleIn(const JobSpec& spec) const;

  std::string node_;
  CurveKeyPair keys_;
  AlertDesk& alerts_;
  Log& log_;
  Held held_;
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Worker>> workers_;  // by job id, kept once ended
  // Ended supervisions let go of (supervise), told to stop: joined once their threads finished, so
  // that the agent's loop never waits on one's call to an agent (its own, say).
  std::vector<std::unique_ptr<Worker>> retiring_;
};

}  // namespace lockstep::agent
