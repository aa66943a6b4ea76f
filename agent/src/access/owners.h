#pragma once
// Who a job belongs to (docs/security.md, "Jobs run as their user"). An authorized key maps to a
// Unix user (`user=NAME` in its line): an agent running as root runs the key's jobs as that user
// and refuses a key that names none, or names root without `allow-root`; an agent that is not
// root runs every job as itself and refuses a key naming another user. A job's owner is that
// user; a key sees and acts on its own user's jobs only, unless its line says `admin`.

#include <chrono>
#include <map>
#include <string>

#include "lockstep/common/identity.h"
#include "lockstep/common/result.h"
#include "lockstep/net/keys.h"

namespace lockstep::agent {

struct Owners {
  Identity agent;        // the agent's own user
  std::string node;      // for messages
  std::string keysPath;  // the authorized keys, for messages

  // Who `grant`'s jobs run as here, or why the key may do nothing on this node. Every request
  // asks, on the agent's event loop: a user database that answers slowly (LDAP, sssd) is asked
  // about a user once a minute at most.
  Result<Identity> runAs(const KeyGrant& grant) const;

 private:
  struct Known {
    std::chrono::steady_clock::time_point at;
    Result<Identity> who;
  };
  mutable std::map<std::string, Known> known_;
};

// The refusal for a key that may not act on another user's job.
Error notYours(const std::string& jobId, const std::string& owner, const std::string& user);

}  // namespace lockstep::agent
