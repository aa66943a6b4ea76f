// Who may do what on the agent (owners.h): the user a request's key maps to, whose jobs it sees
// and acts on; a supervising agent's key, which acts for the user that launched the job.

#include <algorithm>
#include <filesystem>

#include "server_impl.h"

namespace lockstep::agent {

Result<Agent::Impl::Access> Agent::Impl::accessOf(const std::string& key, const Request& request) const {
  Access access;
  if (const KeyGrant* grant = keyRing_.grant(key)) {
    LOCKSTEP_ASSIGN_OR_RETURN(access.runAs, owners_.runAs(*grant));
    access.user = true;
    access.admin = grant->admin;
    access.describe = "key " + keyRing_.describe(key) + " of user " + access.runAs.user + (grant->admin ? " (admin)" : "");
    return access;
  }
  // Not an authorized key: a job's supervising agent (supervision.h) may do what it needs, no more.
  const auto jobs = jobs_->list();
  if (jobsSupervisedBy(key, jobs).empty()) return revokedError();
  LOCKSTEP_TRY(supervisorMay(request, key, jobs, config_.name));
  access.describe = "the supervising agent's key " + fingerprint(key);
  return access;
}

Result<void> Agent::Impl::mayActOn(const Access& access, const std::string& jobId) const {
  const auto only = access.onlyOwner();
  if (!only) return {};
  const auto owner = jobs_->ownerOf(jobId);
  if (!owner) {
    for (const auto& [check, pending] : starts_) {
      if (pending.spec.jobId == jobId && pending.owner.user != *only) return notYours(jobId, pending.owner.user, *only);
    }
    return {};  // no such job: the request says so itself
  }
  if (*owner != *only) return notYours(jobId, *owner, *only);
  return {};
}

// The job list a key sees: its user's jobs (every job for an admin's key), a supervising agent's
// own jobs for it; with the supervision of the jobs this agent supervises.
std::vector<JobStatus> Agent::Impl::listFor(const std::string& key, const Access& access) const {
  std::vector<JobStatus> jobs = jobs_->list();
  if (!access.user) {
    const auto mine = jobsSupervisedBy(key, jobs);
    std::erase_if(jobs, [&](const JobStatus& j) { return std::find(mine.begin(), mine.end(), j.spec.jobId) == mine.end(); });
  } else if (const auto only = access.onlyOwner()) {
    std::erase_if(jobs, [&](const JobStatus& j) { return j.owner != *only; });
  }
  for (auto& j : jobs) {
    j.supervision = supervisions_->of(j.spec.jobId);
    withProgress(j);
  }
  return jobs;
}

// The stream as `onlyOwner` may see it: the node's own records, and its jobs' (a job this agent
// no longer knows is nobody's to see).
FetchReply Agent::Impl::fetchFor(const std::optional<std::string>& onlyOwner, std::uint64_t afterSeq,
                                 std::size_t max) const {
  StreamBuffer::Shows shows;
  if (onlyOwner) {
    shows = [this, &onlyOwner](const StreamMessage& m) {
      const std::string& job = jobOf(m.payload);
      return job.empty() || jobs_->ownerOf(job) == onlyOwner;
    };
  }
  FetchReply reply = stream_->fetch(afterSeq, max, instanceId_, shows);
  reply.jobsVersion = jobs_->jobsVersion();
  return reply;
}

}  // namespace lockstep::agent
