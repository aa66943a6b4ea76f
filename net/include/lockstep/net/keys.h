#pragma once
// CURVE keys and who may talk to whom.
//
// Keys are Z85 text (40 characters for 32 bytes), as libzmq uses them. A key pair lives in two
// files: NAME.key (the secret key, mode 0600, refused when others may read it) and NAME.pub.
// Fingerprints look like SSH's: "SHA256:" and the unpadded base64 of the SHA-256 of the key bytes.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/common/result.h"

namespace lockstep {

struct CurveKeyPair {
  std::string publicKey;  // Z85
  std::string secretKey;  // Z85
};

Result<CurveKeyPair> generateKeyPair();
bool isValidPublicKey(std::string_view z85);
std::string fingerprint(std::string_view publicKeyZ85);

// Loads dir/name.key and dir/name.pub, creating the pair (and dir, mode 0700) when neither exists.
// `created` tells which happened.
Result<CurveKeyPair> loadOrCreateKeyPair(const std::string& dir, const std::string& name, bool* created = nullptr);
Result<CurveKeyPair> loadKeyPair(const std::string& dir, const std::string& name);

// An authorized-keys file, like SSH's: one Z85 public key per line followed by a comment, with
// options before the key, separated by commas or spaces (`user=alice,no-command-jobs KEY comment`
// or `user=alice no-command-jobs KEY comment`); blank lines and lines starting with '#' are
// ignored. A missing file authorizes nobody. The options:
//   user=NAME        the Unix user the key's jobs run as (an agent running as root needs one)
//   allow-root       user=root (uid 0) is allowed for this key
//   admin            the key sees and stops every user's jobs, not only its user's
//   no-command-jobs  the key may not start jobs that run their own program
struct KeyGrant {
  std::string comment;
  std::string user;  // "" when the line names none
  bool commandJobs = true;
  bool allowRoot = false;
  bool admin = false;
};
struct AuthorizedKeys {
  std::map<std::string, KeyGrant> byKey;
  bool allows(std::string_view key) const { return byKey.count(std::string(key)) > 0; }
  bool allowsCommandJobs(std::string_view key) const {
    const KeyGrant* g = grant(key);
    return g != nullptr && g->commandJobs;
  }
  const KeyGrant* grant(std::string_view key) const {
    auto it = byKey.find(std::string(key));
    return it == byKey.end() ? nullptr : &it->second;
  }
};
inline constexpr std::uint64_t kMaxAuthorizedKeysBytes = 1u << 20;
Result<AuthorizedKeys> readAuthorizedKeys(const std::string& path);
// The same over the file's text; `path` names it in errors.
Result<AuthorizedKeys> parseAuthorizedKeys(std::string_view text, const std::string& path);

// Pinned agent keys, like SSH's known_hosts: "HOST:PORT KEY [comment]" per line.
class KnownAgents {
 public:
  static Result<KnownAgents> load(const std::string& path);
  std::optional<std::string> keyFor(const std::string& address) const;
  // Pins `key` for `address` (replacing an older pin) and rewrites the file atomically.
  Result<void> trust(const std::string& address, const std::string& key);
  const std::map<std::string, std::string>& all() const { return keyByAddress_; }

 private:
  std::string path_;
  std::map<std::string, std::string> keyByAddress_;
};

// $XDG_CONFIG_HOME/lockstep (or ~/.config/lockstep), or $LOCKSTEP_CONFIG_DIR when set.
std::string defaultClientConfigDir();
// Where a client with config dir `configDir` pins agent keys: CONFIG/known_agents.
std::string knownAgentsPath(const std::string& configDir);
// $XDG_STATE_HOME/lockstep-agent (or ~/.local/state/lockstep-agent).
std::string defaultAgentStateDir();

}  // namespace lockstep
