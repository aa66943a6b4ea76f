#include "dist_env.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "lockstep/common/store_secret.h"
#include "lockstep/protocol/spec_fields.h"

namespace lockstep::trainer {
namespace {

Result<std::uint32_t> envNumber(const char* name, std::uint32_t fallback, std::uint32_t max) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  std::uint32_t v = 0;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || ptr != end || v > max) {
    return invalidArgument(std::string(name) + "='" + text + "' is not a whole number up to " + std::to_string(max));
  }
  return v;
}

// MASTER_ADDR and MASTER_PORT, which a world of more than one needs.
Result<void> readMaster(DistEnv& env) {
  const char* addr = std::getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') return invalidArgument("MASTER_ADDR is required when WORLD_SIZE > 1");
  env.masterAddr = addr;
  LOCKSTEP_ASSIGN_OR_RETURN(auto port, envNumber("MASTER_PORT", 0, 65535));
  if (port == 0) return invalidArgument("MASTER_PORT is required when WORLD_SIZE > 1 (a free TCP port on rank 0's host)");
  env.masterPort = static_cast<std::uint16_t>(port);
  return {};
}

}  // namespace

Result<DistEnv> distEnvFromEnvironment() {
  DistEnv env;
  const bool distributed = std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr;
  LOCKSTEP_ASSIGN_OR_RETURN(env.attempt, envNumber("LOCKSTEP_ATTEMPT", 0, 1u << 20));
  if (const char* report = std::getenv("LOCKSTEP_REPORT")) env.reportEndpoint = report;
  if (!distributed) return env;
  LOCKSTEP_ASSIGN_OR_RETURN(env.rank, envNumber("RANK", 0, 65535));
  LOCKSTEP_ASSIGN_OR_RETURN(env.worldSize, envNumber("WORLD_SIZE", 1, spec::kMaxWorldSize));
  LOCKSTEP_ASSIGN_OR_RETURN(env.localRank, envNumber("LOCAL_RANK", env.rank, 65535));
  LOCKSTEP_ASSIGN_OR_RETURN(env.localWorldSize, envNumber("LOCAL_WORLD_SIZE", env.worldSize, 4096));
  if (env.worldSize == 0) return invalidArgument("WORLD_SIZE must be at least 1");
  if (env.rank >= env.worldSize) {
    return invalidArgument("RANK=" + std::to_string(env.rank) + " is not below WORLD_SIZE=" + std::to_string(env.worldSize));
  }
  if (env.localRank >= env.localWorldSize) {
    return invalidArgument("LOCAL_RANK=" + std::to_string(env.localRank) + " is not below LOCAL_WORLD_SIZE=" +
                           std::to_string(env.localWorldSize));
  }
  if (env.worldSize > 1) LOCKSTEP_TRY(readMaster(env));
  const char* agentStore = std::getenv("LOCKSTEP_AGENT_STORE");
  env.storeHostedByLauncher = agentStore != nullptr && std::string(agentStore) == "1";
  if (const char* secret = std::getenv("LOCKSTEP_STORE_SECRET"); secret != nullptr) {
    if (!isValidStoreSecret(secret)) {
      return invalidArgument("LOCKSTEP_STORE_SECRET is not 64 hex digits (the agent and the --nproc launcher set it; "
                             "ranks started by hand may share one, from `openssl rand -hex 32`)");
    }
    env.storeSecret = secret;
  }
  return env;
}

Result<double> testSlowdown(std::uint32_t rank) {
  const char* text = std::getenv("LOCKSTEP_TEST_SLOWDOWN");
  if (text == nullptr || *text == '\0') return 1.0;
  unsigned slowRank = 0;
  double factor = 0;
  if (std::sscanf(text, "%u:%lf", &slowRank, &factor) != 2 || !(factor >= 1.0) || factor > 100.0) {
    return invalidArgument(std::string("LOCKSTEP_TEST_SLOWDOWN='") + text + "': expected RANK:FACTOR with FACTOR 1 to 100");
  }
  return slowRank == rank ? factor : 1.0;
}

namespace {

struct CommDelay {
  static constexpr int kEveryRank = -1;
  int rank = -2;  // none
  std::chrono::microseconds delay{0};
  std::uint64_t fromStep = 0;
};

CommDelay commDelayFromEnvironment() {
  CommDelay d;
  const char* text = std::getenv("LOCKSTEP_TEST_COMM_DELAY");
  long long micros = 0;
  unsigned long long step = 0;
  if (text != nullptr && std::strncmp(text, "all:", 4) == 0 && std::sscanf(text + 4, "%lld:%llu", &micros, &step) == 2) {
    d.rank = CommDelay::kEveryRank;
  } else if (text == nullptr || std::sscanf(text, "%d:%lld:%llu", &d.rank, &micros, &step) != 3 || d.rank < 0) {
    return CommDelay{};
  }
  if (micros < 0) return CommDelay{};
  d.delay = std::chrono::microseconds(micros);
  d.fromStep = step;
  return d;
}

}  // namespace

std::chrono::microseconds testCommDelay(int rank, std::uint64_t step) {
  static const CommDelay test = commDelayFromEnvironment();
  const bool mine = test.rank == rank || test.rank == CommDelay::kEveryRank;
  return mine && step >= test.fromStep ? test.delay : std::chrono::microseconds(0);
}

}  // namespace lockstep::trainer
