// lockstepctl keygen and trust: this client's key pair, and the agents' keys it pins.

#include <cstdio>
#include <nlohmann/json.hpp>

#include "ctl.h"
#include "ctl_flags.h"
#include "lockstep/net/keys.h"

namespace lockstep::ctl {
namespace {
using Json = nlohmann::ordered_json;
}  // namespace

int cmdKeygen(const Globals& g, const std::vector<std::string>& args) {
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl keygen").parse(args));
  bool created = false;
  auto keys = loadOrCreateKeyPair(g.configDir, "client", &created);
  if (!keys) return fail(keys.error());
  if (g.json) {
    std::printf("%s\n", Json{{"public_key", keys->publicKey}, {"fingerprint", fingerprint(keys->publicKey)},
                             {"created", created}}.dump().c_str());
    return kOk;
  }
  std::printf("%s key pair in %s\npublic key: %s\nfingerprint: %s\n\n", created ? "Created a" : "This client's",
              g.configDir.c_str(), keys->publicKey.c_str(), fingerprint(keys->publicKey).c_str());
  std::printf("To let this client use an agent, add this line to the agent's authorized_keys:\n  %s %s\n",
              keys->publicKey.c_str(), "lockstepctl");
  return kOk;
}

int cmdTrust(const Globals& g, const std::vector<std::string>& args) {
  // Taken as they are, not through Flags: a key's Z85 text may begin with '-'.
  if (args.size() != 2) return fail(invalidArgument("usage: lockstepctl trust HOST:PORT KEY"));
  auto address = parseAgentAddress(args[0]);
  if (!address) return fail(address.error());
  auto known = KnownAgents::load(knownAgentsPath(g.configDir));
  if (!known) return fail(known.error());
  const auto previous = known->keyFor(address->text());
  if (auto r = known->trust(address->text(), args[1]); !r) return fail(r.error());
  if (g.json) {
    std::printf("%s\n", Json{{"agent", address->text()}, {"fingerprint", fingerprint(args[1])}}.dump().c_str());
  } else {
    std::printf("pinned %s to %s%s\n", address->text().c_str(), fingerprint(args[1]).c_str(),
                previous && *previous != args[1] ? (" (was " + fingerprint(*previous) + ")").c_str() : "");
  }
  return kOk;
}

}  // namespace lockstep::ctl
