#pragma once
// Who may do what on the agent (docs/security.md): the user a request's key maps to (owners.h),
// whose jobs it sees and acts on (every job for an `admin` key); a job's supervising agent's key
// (supervisor_keys.h), which acts for the user that launched the job, on that job only. The
// authorized keys are kept by the key ring (key_ring.h). It reads the job table through the two
// questions it asks of it (JobLookup). Event loop only.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "access/key_ring.h"
#include "access/owners.h"
#include "base/log.h"
#include "lockstep/common/identity.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

// What of the node's stream a client sees; an unset part limits nothing.
struct StreamScope {
  std::optional<std::string> owner;              // the node's own records and this user's jobs'
  std::optional<std::vector<std::string>> jobs;  // these jobs' records alone (a supervising agent)
};

// Who sent a request: a user's key, with the user its jobs run as, or a supervising agent's key.
struct Caller {
  bool user = false;
  bool admin = false;
  Identity runAs;
  std::string describe;  // for the audit log: the key's comment, fingerprint and user
  // A supervising agent's key: the jobs it supervises here, the only ones whose stream it reads.
  std::vector<std::string> supervised;
  // The user whose jobs it sees; unset: every job (an admin's key, a supervising agent's).
  std::optional<std::string> onlyOwner() const {
    return user && !admin ? std::optional<std::string>(runAs.user) : std::nullopt;
  }
  // What of the node's stream it sees (stream/fetches.h).
  StreamScope streamScope() const {
    if (!user) return StreamScope{std::nullopt, supervised};
    return StreamScope{onlyOwner(), std::nullopt};
  }
};

// What the access policy asks of the job table (the job manager answers them).
struct JobLookup {
  std::function<std::vector<JobStatus>()> list;
  std::function<std::optional<std::string>(const std::string& jobId)> ownerOf;  // unset: no such job
};

class AccessPolicy {
 public:
  // `agent`: the user the agent runs as.
  AccessPolicy(std::string keysPath, std::string node, Identity agent, JobLookup jobs, Log& log);

  // The authorized keys read again if they changed (now, or when a second passed); returns the
  // keys that left them.
  std::vector<std::string> refresh() { return keyRing_.refresh(); }
  std::vector<std::string> refreshEverySecond() { return keyRing_.refreshEverySecond(); }
  // A CURVE handshake: an authorized key, or a key that supervises a job here.
  bool admits(const std::string& key);

  Result<Caller> callerOf(const std::string& key, const Request& request) const;
  // Acting on a job: only its owner's keys, an admin's, or its supervising agent's. pendingOwner:
  // the owner of the job's start still being checked, when the job is not here yet.
  Result<void> mayActOn(const Caller& caller, const std::string& jobId,
                        const std::optional<std::string>& pendingOwner) const;
  // The jobs a key sees: its user's (every job for an admin's key), a supervising agent's own.
  std::vector<JobStatus> visibleJobs(const std::string& key, const Caller& caller) const;
  Error revokedError() const;

  const KeyRing& keyRing() const { return keyRing_; }
  Result<Identity> runAs(const KeyGrant& grant) const { return owners_.runAs(grant); }

 private:
  std::string keysPath_;
  std::string node_;
  JobLookup jobs_;
  KeyRing keyRing_;
  Owners owners_;
};

}  // namespace lockstep::agent
