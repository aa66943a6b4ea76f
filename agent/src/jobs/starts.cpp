#include "jobs/starts.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "base/off_loop.h"
#include "lockstep/client/supervisor.h"
#include "lockstep/common/files.h"

namespace lockstep::agent {

Starts::Starts(StartSettings settings, const AccessPolicy& access, JobManager& jobs, Supervisions& supervisions,
               ReplyPort& replies, Log& log)
    : settings_(std::move(settings)),
      access_(access),
      jobs_(jobs),
      supervisions_(supervisions),
      replies_(replies),
      log_(log),
      preflight_(settings_.pathCheckTimeout) {}

void Starts::onStartJob(const std::string& client, const std::string& key, const Caller& caller, std::uint64_t id,
                        JobSpec spec, std::string storeSecret) {
  const auto refuse = [&](const Error& why) {
    log_.info("refused job " + spec.jobId + ": " + why.message);
    replies_.replyError(client, id, why);
  };
  const std::string& node = settings_.node;
  if (spec.command && !settings_.commandJobs) {
    return refuse(Error{ErrorCode::kPermissionDenied,
                        "node " + node +
                            " runs no jobs of their own program (its agent sets command-jobs = no); "
                            "run lockstep-trainer there, or ask its admin"});
  }
  auto owner = ownerFor(key, caller, spec);
  if (!owner) return refuse(owner.error());
  const SupervisingRole mine = supervisingRole(spec, [&](const JobAgent& a) { return a.node == node; });
  if (mine && mine.agent->publicKey != settings_.agentPublicKey) {
    return refuse(invalidArgument("job " + spec.jobId + " names " + node +
                                  "'s agent with a key that is not this agent's: pin this agent's key again"));
  }
  // Its alert rules and webhooks, on the agent that will evaluate them, before any rank starts.
  if (auto rules = supervisions_.checkAlerts(spec); mine && !rules) return refuse(rules.error());
  if (pendingOwner(spec.jobId)) {
    return refuse(Error{ErrorCode::kAlreadyExists,
                        "job " + spec.jobId + " is already being started on " + node + ": pick another job id"});
  }
  const std::uint64_t check = nextCheckId_++;
  const PathFacts facts{node, settings_.trainerPath, std::getenv("PATH") != nullptr ? std::getenv("PATH") : "", *owner,
                        settings_.privateTmp};
  auto paths = [spec, facts] { return checkJobPaths(spec, facts); };
  if (auto submitted = preflight_.submit(check, std::move(paths), node); !submitted) {
    return refuse(submitted.error());
  }
  log_.info("job " + spec.jobId + ": start asked by " + caller.describe + ", to run as " + owner->user);
  pending_.emplace(check, Pending{client, key, id, std::move(spec), std::move(storeSecret), std::move(owner).value()});
}

// A supervising agent's key restarts only what a user's started here (supervisorMay checked),
// with the rights that user still has.
Result<Identity> Starts::ownerFor(const std::string& key, const Caller& caller, const JobSpec& spec) const {
  if (!caller.user) return restartOwner(spec);
  if (spec.command && !access_.keyRing().allowsCommandJobs(key)) {
    return Error{ErrorCode::kPermissionDenied, "this client's key may not start jobs that run their own program on " +
                                                   settings_.node +
                                                   " (its authorized keys give it the no-command-jobs option)"};
  }
  return caller.runAs;
}

// Who a restart the job's supervising agent asks for runs as: the user the key that launched it
// maps to now. Refused when a user stopped the job, or that key lost the right to start it (left
// the authorized keys, or may run no program of its own).
Result<Identity> Starts::restartOwner(const JobSpec& spec) const {
  if (stoppedByUser_.count(spec.jobId)) {
    return Error{ErrorCode::kFailedPrecondition,
                 "job " + spec.jobId + " was stopped by a user on " + settings_.node + ": it is not restarted"};
  }
  auto launcher = readFile(jobs_.launcherPath(spec.jobId), 256);
  const KeyGrant* grant = access_.keyRing().grant(launcher ? launcher->substr(0, launcher->find('\n')) : "");
  if (grant == nullptr || (spec.command && !grant->commandJobs)) {
    return Error{ErrorCode::kPermissionDenied, "the key that launched job " + spec.jobId +
                                                   " may no longer start it on " + settings_.node +
                                                   ": it is not restarted"};
  }
  return access_.runAs(*grant);
}

std::optional<std::string> Starts::pendingOwner(const std::string& jobId) const {
  for (const auto& [check, pending] : pending_) {
    if (pending.spec.jobId == jobId) return pending.owner.user;
  }
  return std::nullopt;
}

// A client that gave up waiting for StartJob's answer undoes it so.
bool Starts::cancel(const std::string& jobId) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->second.spec.jobId != jobId) continue;
    log_.info("job " + jobId + ": stopped before it started");
    replies_.replyError(
        it->second.client, it->second.requestId,
        Error{ErrorCode::kCancelled, "job " + jobId + " was stopped on " + settings_.node + " before it started"});
    pending_.erase(it);
    return true;
  }
  return false;
}

void Starts::revoke(const std::function<bool(const std::string&)>& gone, const Error& why) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (gone(it->second.key)) {
      log_.info("job " + it->second.spec.jobId + ": not started, its client's key was revoked");
      replies_.replyError(it->second.client, it->second.requestId, why);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

void Starts::onPreflight() {
  for (auto& done : preflight_.take()) {
    auto waiting = takePending(pending_, done.id);
    if (!waiting) continue;
    const Pending& pending = *waiting;
    Result<StartJobReply> started = done.result
                                        ? jobs_.start(pending.spec, *done.result, pending.owner, pending.storeSecret)
                                        : Result<StartJobReply>(done.result.error());
    if (started) {
      this->started(pending, *started);
    } else {
      log_.info("refused job " + pending.spec.jobId + ": " + started.error().message);
      replies_.replyError(pending.client, pending.requestId, started.error());
    }
  }
}

void Starts::started(const Pending& pending, const StartJobReply& reply) {
  // A new job under the id of one a user stopped here (and the table dropped) may restart.
  if (pending.spec.attempt == 0) stoppedByUser_.erase(pending.spec.jobId);
  // Who launched it, for the restarts its supervising agent may ask for (restartOwner).
  if (access_.keyRing().allows(pending.key)) {
    const std::string path = jobs_.launcherPath(pending.spec.jobId);
    auto kept = makeDirectories(std::filesystem::path(path).parent_path().string(), 0700);
    if (kept) kept = writeFileAtomic(path, pending.key + "\n", 0600);
    if (!kept) log_.error("job " + pending.spec.jobId + ": cannot keep who launched it: " + kept.error().message);
  }
  supervisions_.supervise(pending.spec);
  replies_.reply(pending.client, Reply{pending.requestId, reply});
}

}  // namespace lockstep::agent
