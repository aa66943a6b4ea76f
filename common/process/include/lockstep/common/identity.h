#pragma once
// Unix users: who a job runs as (docs/security.md, "Jobs run as their user"), looked up in the
// system's user database, and a thread's file-system rights borrowed from one of them.

#include <sys/types.h>

#include <string>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep {

struct Identity {
  std::string user;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary, as initgroups(3) would set them (the primary among them)
  std::string home;
  bool operator==(const Identity&) const = default;
};

// `name` from the user database (getpwnam_r, getgrouplist); not found is kNotFound.
Result<Identity> lookUpUser(const std::string& name);
// This process's effective user, with its groups.
Identity currentIdentity();

// While it lives, file-system checks of the calling thread (open, stat, faccessat with
// AT_EACCESS) are made with `who`'s uid, gid and groups, not the process's: setfsuid, setfsgid
// and setgroups as raw system calls, which change one thread (glibc's wrappers change them all).
// Needs CAP_SETUID and CAP_SETGID (an agent running as root); a no-op when `who` is the process's
// own user. The destructor gives the thread its own rights back.
class FileRightsOf {
 public:
  explicit FileRightsOf(const Identity& who);
  ~FileRightsOf();
  FileRightsOf(const FileRightsOf&) = delete;
  FileRightsOf& operator=(const FileRightsOf&) = delete;
  // Whether the rights were taken on (false: they could not be, and checks would run as the
  // process; `why` says why).
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }

 private:
  bool switched_ = false;
  bool ok_ = true;
  std::string why_;
  std::vector<gid_t> ownGroups_;
};

}  // namespace lockstep
