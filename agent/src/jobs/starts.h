#pragma once
// StartJob, answered in two halves (docs/agent.md): what the spec alone says is checked at once;
// what it names on the node (data files, a command job's program and working directory) is
// checked by the preflight (preflight.h) off the loop, and the ranks start when its answer comes.
// A StopJob while the paths are checked cancels the start. A restart that a job's supervising
// agent asks for runs as the user whose key launched the job, while that key may still start it.
// Event loop only.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "access/access_policy.h"
#include "base/log.h"
#include "base/ports.h"
#include "jobs/jobs.h"
#include "jobs/preflight.h"
#include "jobs/supervision.h"
#include "lockstep/common/identity.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct StartSettings {
  std::string node;
  std::string agentPublicKey;  // a spec that names this node's agent with another key is refused
  std::string trainerPath;
  bool commandJobs = true;
  bool privateTmp = true;
  std::chrono::milliseconds pathCheckTimeout{5000};
};

class Starts {
 public:
  Starts(StartSettings settings, const AccessPolicy& access, JobManager& jobs, Supervisions& supervisions,
         ReplyPort& replies, Log& log);

  void onStartJob(const std::string& client, const std::string& key, const Caller& caller, std::uint64_t id,
                  JobSpec spec, std::string storeSecret);
  // Readable when a path check finished.
  int wakeFd() const { return preflight_.wakeFd(); }
  // Starts the jobs whose checks passed; refuses the others (and those past their deadline).
  void onPreflight();
  // Whether starts wait for their checks; when the next check's deadline is.
  bool waiting() const { return !pending_.empty(); }
  std::chrono::steady_clock::time_point nextDeadline() const { return preflight_.nextDeadline(); }

  // A StopJob for a job still being checked: it never starts. False when none is.
  bool cancel(const std::string& jobId);
  // A user's key stopped the job: its supervising agent does not restart it.
  void stoppedByUser(const std::string& jobId) { stoppedByUser_.insert(jobId); }
  // The user a job still being checked runs as.
  std::optional<std::string> pendingOwner(const std::string& jobId) const;
  // Refuses, with `why`, the starts of the keys `gone` says left the authorized keys.
  void revoke(const std::function<bool(const std::string& key)>& gone, const Error& why);

 private:
  // A StartJob whose paths are being checked.
  struct Pending {
    std::string client;
    std::string key;  // the client's
    std::uint64_t requestId;
    JobSpec spec;
    std::string storeSecret;
    Identity owner;  // who its ranks run as
  };

  Result<Identity> ownerFor(const std::string& key, const Caller& caller, const JobSpec& spec) const;
  Result<Identity> restartOwner(const JobSpec& spec) const;
  void started(const Pending& pending, const StartJobReply& reply);

  StartSettings settings_;
  const AccessPolicy& access_;
  JobManager& jobs_;
  Supervisions& supervisions_;
  ReplyPort& replies_;
  Log& log_;
  Preflight preflight_;
  std::map<std::uint64_t, Pending> pending_;  // by preflight id
  std::uint64_t nextCheckId_ = 1;
  std::set<std::string> stoppedByUser_;  // jobs a user's key stopped
};

}  // namespace lockstep::agent
