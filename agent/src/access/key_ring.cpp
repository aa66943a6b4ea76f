#include "access/key_ring.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "base/log.h"
#include "lockstep/common/fd.h"
#include "lockstep/common/files.h"

namespace lockstep::agent {

using Clock = std::chrono::steady_clock;

std::string strictModesProblem(const std::string& path, unsigned mode, unsigned owner) {
  char octal[8];
  std::snprintf(octal, sizeof octal, "%04o", mode & 07777);
  if ((mode & 022) != 0) {
    return path + " is writable by group or others (mode " + octal + "): anyone among them could " +
           "replace what the agent trusts there; chmod go-w " + path;
  }
  if (owner != ::geteuid() && owner != 0) {
    return path + " is owned by uid " + std::to_string(owner) + ", not by the agent's user (uid " +
           std::to_string(::geteuid()) + ") or root; chown it";
  }
  return {};
}

Result<std::string> KeyRing::readChecked() const {
  const std::filesystem::path file(path_);
  const std::string dir = file.has_parent_path() ? file.parent_path().string() : ".";
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return errnoError("cannot look at " + dir, errno);
  if (auto why = strictModesProblem(dir, st.st_mode, st.st_uid); !why.empty()) return invalidArgument(why);
  // A regular file (a FIFO planted there must not stall the loop), trusted only if StrictModes say so.
  LOCKSTEP_ASSIGN_OR_RETURN(const int raw, openRegularFile(path_, "the authorized keys file"));
  UniqueFd fd(raw);
  if (::fstat(fd.get(), &st) != 0) return errnoError("cannot look at " + path_, errno);
  if (auto why = strictModesProblem(path_, st.st_mode, st.st_uid); !why.empty()) return invalidArgument(why);
  return readOpenFile(fd.get(), path_, kMaxAuthorizedKeysBytes);
}

void KeyRing::problem(const std::string& why) {
  if (why == problem_) return;
  problem_ = why;
  log_.error("cannot use the authorized keys: " + why + "; " +
             (loaded_ ? "keeping the " + std::to_string(keys_.byKey.size()) + " key(s) read before"
                      : std::string("no client is authorized until it is fixed")));
}

std::vector<std::string> KeyRing::refresh() {
  lastRefresh_ = Clock::now();
  auto text = readChecked();
  if (!text && text.error().code == ErrorCode::kNotFound) text = std::string();  // nobody
  if (!text) {
    problem(text.error().message);
    return {};
  }
  if (loaded_ && *text == text_) {
    if (!problem_.empty()) log_.info("the authorized keys in " + path_ + " can be used again");
    problem_.clear();
    return {};
  }
  auto parsed = parseAuthorizedKeys(*text, path_);
  if (!parsed) {
    problem(parsed.error().message);
    return {};
  }
  std::vector<std::string> removed;
  for (const auto& [key, grant] : keys_.byKey) {
    if (!parsed->allows(key)) removed.push_back(key);
  }
  // A removal takes effect once the same content is read a second later: an edit that truncates
  // and rewrites the file in place must not, read half-way, end everyone's sessions.
  const auto now = Clock::now();
  if (!removed.empty() && (*text != settling_ || now - settlingSince_ < std::chrono::seconds(1))) {
    if (*text != settling_) settlingSince_ = now;
    settling_ = *text;
    return {};
  }
  for (const auto& key : removed) {
    log_.info("key " + describe(key) + " left " + path_ + ": its open sessions are refused from now on");
  }
  keys_ = std::move(parsed).value();
  text_ = std::move(text).value();
  if (loaded_ || !keys_.byKey.empty()) {
    log_.info("authorized keys: " + std::to_string(keys_.byKey.size()) + " key(s) from " + path_);
  }
  loaded_ = true;
  problem_.clear();
  return removed;
}

std::vector<std::string> KeyRing::refreshEverySecond() {
  if (Clock::now() - lastRefresh_ < std::chrono::seconds(1)) return {};
  return refresh();
}

std::string KeyRing::describe(const std::string& key) const {
  const KeyGrant* grant = keys_.grant(key);
  const std::string comment = grant == nullptr || grant->comment.empty() ? "(no comment)" : grant->comment;
  return "'" + comment + "' (" + fingerprint(key) + ")";
}

void KeyRing::noteRefusedHandshake(const std::string& key) {
  const auto now = Clock::now();
  if (now - refusalWindow_ >= std::chrono::minutes(1)) {
    if (refusalsUnlogged_ > 0) {
      log_.info("refused " + std::to_string(refusalsUnlogged_) + " more handshake(s) in the last minute, not logged one by one");
    }
    refusalWindow_ = now;
    refusalsLogged_ = 0;
    refusalsUnlogged_ = 0;
  }
  if (refusalsLogged_ >= kRefusalsLoggedPerMinute) {
    ++refusalsUnlogged_;
    return;
  }
  ++refusalsLogged_;
  log_.info("refused a client with key " + key + " (" + fingerprint(key) + "): not in " + path_ +
            (refusalsLogged_ == kRefusalsLoggedPerMinute ? " (further refusals this minute are counted, not logged)" : ""));
}

}  // namespace lockstep::agent
