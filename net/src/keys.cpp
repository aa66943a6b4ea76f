#include "lockstep/net/keys.h"

#include <sodium.h>
#include <sys/stat.h>
#include <zmq.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "lockstep/common/files.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;

Result<std::string> readKeyFile(const std::string& path, bool secret) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errnoError("cannot read key file " + path, errno);
  if (secret && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    return Error{ErrorCode::kPermissionDenied, "secret key file " + path + " may be read by others (mode " + mode +
                                                   "); run: chmod 600 " + path};
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto text, readFile(path, 4096));
  text = trim(text);
  if (!isValidPublicKey(text)) return invalidArgument(path + " does not hold a Z85 CURVE key (40 characters)");
  return text;
}

}  // namespace

Result<CurveKeyPair> generateKeyPair() {
  char publicKey[41], secretKey[41];
  if (zmq_curve_keypair(publicKey, secretKey) != 0) {
    return internalError(std::string("cannot generate a CURVE key pair: ") + zmq_strerror(zmq_errno()));
  }
  return CurveKeyPair{publicKey, secretKey};
}

bool isValidPublicKey(std::string_view z85) {
  if (z85.size() != 40) return false;
  std::uint8_t raw[32];
  return zmq_z85_decode(raw, std::string(z85).c_str()) != nullptr;
}

std::string fingerprint(std::string_view publicKeyZ85) {
  std::uint8_t raw[32];
  if (!isValidPublicKey(publicKeyZ85) || zmq_z85_decode(raw, std::string(publicKeyZ85).c_str()) == nullptr) {
    return "(not a key)";
  }
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(digest, raw, sizeof raw);
  char text[sodium_base64_ENCODED_LEN(crypto_hash_sha256_BYTES, sodium_base64_VARIANT_ORIGINAL_NO_PADDING)];
  sodium_bin2base64(text, sizeof text, digest, sizeof digest, sodium_base64_VARIANT_ORIGINAL_NO_PADDING);
  return std::string("SHA256:") + text;
}

Result<CurveKeyPair> loadKeyPair(const std::string& dir, const std::string& name) {
  const std::string base = (fs::path(dir) / name).string();
  LOCKSTEP_ASSIGN_OR_RETURN(auto secretKey, readKeyFile(base + ".key", true));
  LOCKSTEP_ASSIGN_OR_RETURN(auto publicKey, readKeyFile(base + ".pub", false));
  // The public key must belong to the secret one, or peers would pin the wrong key.
  char derived[41];
  if (zmq_curve_public(derived, secretKey.c_str()) != 0 || publicKey != derived) {
    return invalidArgument(base + ".pub does not match " + base + ".key; delete both to make a new pair");
  }
  return CurveKeyPair{publicKey, secretKey};
}

Result<CurveKeyPair> loadOrCreateKeyPair(const std::string& dir, const std::string& name, bool* created) {
  const std::string base = (fs::path(dir) / name).string();
  std::error_code ec;
  const bool haveSecret = fs::exists(base + ".key", ec), havePublic = fs::exists(base + ".pub", ec);
  if (created) *created = false;
  if (haveSecret || havePublic) return loadKeyPair(dir, name);
  LOCKSTEP_TRY(makeDirectories(dir, 0700));
  LOCKSTEP_ASSIGN_OR_RETURN(auto pair, generateKeyPair());
  LOCKSTEP_TRY(writeFileAtomic(base + ".key", pair.secretKey + "\n", 0600));
  LOCKSTEP_TRY(writeFileAtomic(base + ".pub", pair.publicKey + "\n", 0644));
  if (created) *created = true;
  return pair;
}

Result<AuthorizedKeys> readAuthorizedKeys(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return AuthorizedKeys{};
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string text, readFile(path, kMaxAuthorizedKeysBytes));
  return parseAuthorizedKeys(text, path);
}

namespace {

// One option of an authorized key's line into `grant`.
Result<void> applyKeyOption(const std::string& option, KeyGrant& grant, const std::string& where) {
  if (option == "no-command-jobs") {
    grant.commandJobs = false;
  } else if (option == "allow-root") {
    grant.allowRoot = true;
  } else if (option == "admin") {
    grant.admin = true;
  } else if (option.rfind("user=", 0) == 0) {
    grant.user = option.substr(5);
    const bool valid = !grant.user.empty() && grant.user.size() <= 32 &&
                       grant.user.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                           std::string::npos &&
                       grant.user[0] != '-';
    if (!valid) return invalidArgument(where + ": user=" + grant.user + " is not a Unix user name");
  } else {
    return invalidArgument(where + ": unknown option '" + option +
                           "' (known: user=NAME, allow-root, admin, no-command-jobs)");
  }
  return {};
}

}  // namespace

Result<AuthorizedKeys> parseAuthorizedKeys(std::string_view text, const std::string& path) {
  AuthorizedKeys keys;
  LOCKSTEP_TRY(forEachSettingsLineIn(text, [&](const std::string& line, int number) -> Result<void> {
    const std::string where = path + " line " + std::to_string(number);
    std::istringstream fields(line);
    KeyGrant grant;
    std::string word, key;
    // Options (comma- or space-separated) until the key.
    while (fields >> word) {
      if (isValidPublicKey(word)) {
        key = word;
        break;
      }
      std::istringstream each(word);
      for (std::string option; std::getline(each, option, ',');) {
        if (auto applied = option.empty() ? Result<void>() : applyKeyOption(option, grant, where); !applied) return applied;
      }
    }
    if (key.empty()) return invalidArgument(where + ": expected a 40-character Z85 public key, then a comment");
    std::getline(fields, grant.comment);
    grant.comment = trim(grant.comment);
    keys.byKey[key] = std::move(grant);
    return {};
  }));
  return keys;
}

Result<KnownAgents> KnownAgents::load(const std::string& path) {
  KnownAgents known;
  known.path_ = path;
  LOCKSTEP_TRY(forEachSettingsLine(path, 16u << 20, [&](const std::string& line, int number) -> Result<void> {
    std::istringstream fields(line);
    std::string address, key;
    fields >> address >> key;
    if (address.empty() || !isValidPublicKey(key)) {
      return invalidArgument(path + " line " + std::to_string(number) + ": expected HOST:PORT and a Z85 public key");
    }
    known.keyByAddress_[address] = key;
    return {};
  }));
  return known;
}

std::optional<std::string> KnownAgents::keyFor(const std::string& address) const {
  auto it = keyByAddress_.find(address);
  if (it == keyByAddress_.end()) return std::nullopt;
  return it->second;
}

Result<void> KnownAgents::trust(const std::string& address, const std::string& key) {
  if (!isValidPublicKey(key)) return invalidArgument("'" + key + "' is not a 40-character Z85 public key");
  keyByAddress_[address] = key;
  std::string text = "# Lockstep agents whose keys this client trusts: HOST:PORT KEY\n";
  for (const auto& [a, k] : keyByAddress_) text += a + " " + k + "\n";
  LOCKSTEP_TRY(makeDirectories(fs::path(path_).parent_path().string(), 0700));
  return writeFileAtomic(path_, text);
}

std::string knownAgentsPath(const std::string& configDir) {
  return (std::filesystem::path(configDir) / "known_agents").string();
}

std::string defaultClientConfigDir() {
  if (const char* dir = std::getenv("LOCKSTEP_CONFIG_DIR"); dir != nullptr && *dir != '\0') return dir;
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && *xdg != '\0') {
    return (fs::path(xdg) / "lockstep").string();
  }
  const char* home = std::getenv("HOME");
  return (fs::path(home ? home : ".") / ".config" / "lockstep").string();
}

std::string defaultAgentStateDir() {
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (fs::path(xdg) / "lockstep-agent").string();
  }
  const char* home = std::getenv("HOME");
  return (fs::path(home ? home : ".") / ".local" / "state" / "lockstep-agent").string();
}

}  // namespace lockstep
