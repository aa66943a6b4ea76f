#include "access/access_policy.h"

#include <algorithm>

#include "access/supervisor_keys.h"
#include "lockstep/net/keys.h"

namespace lockstep::agent {

AccessPolicy::AccessPolicy(std::string keysPath, std::string node, Identity agent, JobLookup jobs, Log& log)
    : keysPath_(std::move(keysPath)), node_(std::move(node)), jobs_(std::move(jobs)), keyRing_(keysPath_, log) {
  owners_.agent = std::move(agent);
  owners_.node = node_;
  owners_.keysPath = keysPath_;
}

bool AccessPolicy::admits(const std::string& key) {
  const bool ok = keyRing_.allows(key) || !jobsSupervisedBy(key, jobs_.list()).empty();
  if (!ok) keyRing_.noteRefusedHandshake(key);
  return ok;
}

Result<Caller> AccessPolicy::callerOf(const std::string& key, const Request& request) const {
  Caller caller;
  if (const KeyGrant* grant = keyRing_.grant(key)) {
    LOCKSTEP_ASSIGN_OR_RETURN(caller.runAs, owners_.runAs(*grant));
    caller.user = true;
    caller.admin = grant->admin;
    caller.describe =
        "key " + keyRing_.describe(key) + " of user " + caller.runAs.user + (grant->admin ? " (admin)" : "");
    return caller;
  }
  // Not an authorized key: a job's supervising agent (supervisor_keys.h) may do what it needs, no more.
  const auto jobs = jobs_.list();
  caller.supervised = jobsSupervisedBy(key, jobs);
  if (caller.supervised.empty()) return revokedError();
  LOCKSTEP_TRY(supervisorMay(request, key, jobs, node_));
  caller.describe = "the supervising agent's key " + fingerprint(key);
  return caller;
}

Result<void> AccessPolicy::mayActOn(const Caller& caller, const std::string& jobId,
                                    const std::optional<std::string>& pendingOwner) const {
  const auto only = caller.onlyOwner();
  if (!only) return {};
  const auto owner = jobs_.ownerOf(jobId);
  if (!owner) {
    if (pendingOwner && *pendingOwner != *only) return notYours(jobId, *pendingOwner, *only);
    return {};  // no such job: the request says so itself
  }
  if (*owner != *only) return notYours(jobId, *owner, *only);
  return {};
}

std::vector<JobStatus> AccessPolicy::visibleJobs(const std::string& key, const Caller& caller) const {
  std::vector<JobStatus> jobs = jobs_.list();
  if (!caller.user) {
    const auto mine = jobsSupervisedBy(key, jobs);
    std::erase_if(jobs,
                  [&](const JobStatus& j) { return std::find(mine.begin(), mine.end(), j.spec.jobId) == mine.end(); });
  } else if (const auto only = caller.onlyOwner()) {
    std::erase_if(jobs, [&](const JobStatus& j) { return j.owner != *only; });
  }
  return jobs;
}

Error AccessPolicy::revokedError() const {
  return Error{ErrorCode::kPermissionDenied,
               "this client's key is no longer in the authorized keys of node " + node_ + " (" + keysPath_ + ")"};
}

}  // namespace lockstep::agent
