#include "access/owners.h"

namespace lockstep::agent {

Result<Identity> Owners::runAs(const KeyGrant& grant) const {
  const auto denied = [](std::string why) { return Error{ErrorCode::kPermissionDenied, std::move(why)}; };
  if (agent.uid != 0) {
    if (grant.user.empty() || grant.user == agent.user) return agent;
    return denied("the agent on " + node + " runs as " + agent.user + ", not root, so it runs jobs only as " +
                  agent.user + ": this key's user=" + grant.user + " (" + keysPath +
                  ") needs an agent run as root (docs/security.md)");
  }
  if (grant.user.empty()) {
    return denied("the agent on " + node + " runs as root, so it runs each key's jobs as the Unix user the key names: "
                  "its admin adds user=NAME before this key in " + keysPath + " (docs/security.md)");
  }
  const auto now = std::chrono::steady_clock::now();
  auto it = known_.find(grant.user);
  if (it == known_.end() || now - it->second.at > std::chrono::minutes(1)) {
    if (known_.size() > 4096) known_.clear();  // as many users as keys name, in practice
    it = known_.insert_or_assign(grant.user, Known{now, lookUpUser(grant.user)}).first;
  }
  const Result<Identity>& who = it->second.who;
  if (!who) {
    return denied("this key's user=" + grant.user + " (" + keysPath + ") is not a user on " + node + ": " +
                  who.error().message);
  }
  if (who->uid == 0 && !grant.allowRoot) {
    return denied("this key's user=" + grant.user + " is root (uid 0) on " + node +
                  ": jobs run as root only for a key whose line also says allow-root (" + keysPath + ")");
  }
  return who;
}

Error notYours(const std::string& jobId, const std::string& owner, const std::string& user) {
  return Error{ErrorCode::kPermissionDenied, "job " + jobId + " belongs to " + owner + ": this key (user " + user +
                                                 ") sees and acts on " + user +
                                                 "'s jobs only; a key whose line says admin acts on all"};
}

}  // namespace lockstep::agent
