#pragma once
// The agent's authorized keys, kept the way sshd keeps them (docs/security.md):
// - the file is read again whenever its content changes, not only its mtime (a chmod that makes
//   an unreadable file readable changes no mtime), from the loop every second and at every
//   handshake;
// - a key that leaves the file loses its open sessions: the agent asks allows() for every request;
// - a file that cannot be used (unreadable, malformed, not a regular file, writable by group or
//   others, owned by another user than the agent's or root, in a directory that is) keeps the
//   last good set, and says so once; a missing file authorizes nobody;
// - refused handshakes are logged at most kRefusalsLoggedPerMinute a minute, then counted, so a
//   stranger cannot flush the log.

#include <chrono>
#include <string>
#include <vector>

#include "lockstep/net/keys.h"

namespace lockstep::agent {

class Log;

class KeyRing {
 public:
  static constexpr int kRefusalsLoggedPerMinute = 10;

  KeyRing(std::string path, Log& log) : path_(std::move(path)), log_(log) {}

  // Reads the file again if its content changed; returns the keys it no longer authorizes.
  std::vector<std::string> refresh();
  // refresh() when the last one is more than a second old.
  std::vector<std::string> refreshEverySecond();

  bool allows(const std::string& key) const { return keys_.allows(key); }
  bool allowsCommandJobs(const std::string& key) const { return keys_.allowsCommandJobs(key); }
  // The key's options; nullptr for a key that is not authorized.
  const KeyGrant* grant(const std::string& key) const { return keys_.grant(key); }
  // "its comment (SHA256:…)", for log lines that say who did what.
  std::string describe(const std::string& key) const;
  void noteRefusedHandshake(const std::string& key);

 private:
  Result<std::string> readChecked() const;
  void problem(const std::string& why);

  std::string path_;
  Log& log_;
  AuthorizedKeys keys_;
  bool loaded_ = false;
  std::string text_;     // what keys_ was parsed from
  std::string problem_;  // the last failure said, so that it is said once
  std::string settling_; // content that removes keys, applied once it is read again a second on
  std::chrono::steady_clock::time_point settlingSince_{};
  std::chrono::steady_clock::time_point lastRefresh_{};
  std::chrono::steady_clock::time_point refusalWindow_{};
  int refusalsLogged_ = 0;
  std::uint64_t refusalsUnlogged_ = 0;
};

// Why `path` (a file or directory the agent trusts) may not be trusted: writable by group or
// others, or owned by someone other than the agent's user or root; "" when it may.
std::string strictModesProblem(const std::string& path, unsigned mode, unsigned owner);

}  // namespace lockstep::agent
