#include "lockstep/common/identity.h"

#include <grp.h>
#include <pwd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace lockstep {
namespace {

Identity fromPasswd(const passwd& pw) {
  Identity who;
  who.user = pw.pw_name;
  who.uid = pw.pw_uid;
  who.gid = pw.pw_gid;
  who.home = pw.pw_dir != nullptr ? pw.pw_dir : "/";
  int count = 32;
  std::vector<gid_t> groups(static_cast<std::size_t>(count));
  while (::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0 && count < 65536) {
    groups.resize(static_cast<std::size_t>(count));
  }
  groups.resize(static_cast<std::size_t>(std::max(count, 0)));
  who.groups = std::move(groups);
  return who;
}

}  // namespace

Result<Identity> lookUpUser(const std::string& name) {
  passwd pw{}, *found = nullptr;
  std::vector<char> buffer(16384);
  int err = 0;
  while ((err = ::getpwnam_r(name.c_str(), &pw, buffer.data(), buffer.size(), &found)) == ERANGE &&
         buffer.size() < (1u << 20)) {
    buffer.resize(buffer.size() * 2);
  }
  if (err != 0) return errnoError("cannot look up user " + name, err);
  if (found == nullptr) return Error{ErrorCode::kNotFound, "there is no user " + name};
  return fromPasswd(pw);
}

Identity currentIdentity() {
  passwd pw{}, *found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwuid_r(::geteuid(), &pw, buffer.data(), buffer.size(), &found) == 0 && found != nullptr) {
    return fromPasswd(pw);
  }
  Identity who;  // a uid the user database does not know (a container's)
  who.user = std::to_string(::geteuid());
  who.uid = ::geteuid();
  who.gid = ::getegid();
  who.home = "/";
  return who;
}

FileRightsOf::FileRightsOf(const Identity& who) {
  if (who.uid == ::geteuid() && who.gid == ::getegid()) return;
  const int n = ::getgroups(0, nullptr);
  ownGroups_.resize(static_cast<std::size_t>(std::max(n, 0)));
  if (n > 0) ::getgroups(n, ownGroups_.data());
  switched_ = true;
  // setfsuid and setfsgid return the previous value and set errno on no error: check by asking again.
  if (::syscall(SYS_setgroups, who.groups.size(), who.groups.data()) != 0) {
    ok_ = false;
    why_ = std::string("cannot take on the user's groups: ") + std::strerror(errno);
    return;
  }
  ::syscall(SYS_setfsgid, who.gid);
  ::syscall(SYS_setfsuid, who.uid);
  if (static_cast<uid_t>(::syscall(SYS_setfsuid, -1)) != who.uid ||
      static_cast<gid_t>(::syscall(SYS_setfsgid, -1)) != who.gid) {
    ok_ = false;
    why_ = "cannot take on the user's file-system rights (the agent is not root)";
  }
}

FileRightsOf::~FileRightsOf() {
  if (!switched_) return;
  ::syscall(SYS_setfsuid, ::geteuid());
  ::syscall(SYS_setfsgid, ::getegid());
  ::syscall(SYS_setgroups, ownGroups_.size(), ownGroups_.data());
}

}  // namespace lockstep
