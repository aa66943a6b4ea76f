// lockstep-agent: the daemon on each node.

#include <sys/prctl.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/files.h"
#include "lockstep/common/process.h"
#include "lockstep/net/keys.h"
#include "loop/agent.h"
#include "loop/config.h"

namespace {

std::atomic<int> g_stop{0};
void onSignal(int signal) { g_stop.store(signal); }

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep::agent;
  // The agent's ranks are each kept by a copy of this program (lockstep/common/process.h).
  if (argc >= 2 && std::string_view(argv[1]) == lockstep::kKeeperArg) return lockstep::runKeeper(argc, argv);
  // And each job's ranks on this node share a PID namespace whose init is one too.
  if (argc >= 2 && std::string_view(argv[1]) == lockstep::kJobInitArg) return lockstep::runJobInit(argc, argv);
  auto config = parseAgentArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!config) {
    std::fprintf(stderr, "lockstep-agent: error: %s\n", config.error().message.c_str());
    return 2;
  }
  if (config->help) {
    std::fputs(agentUsage().c_str(), stdout);
    return 0;
  }
  if (config->version) {
    std::printf("lockstep-agent %s\n", LOCKSTEP_VERSION);
    return 0;
  }
  if (config->printKey) {
    auto keys = lockstep::loadOrCreateKeyPair(config->stateDir, "agent");
    if (!keys) {
      std::fprintf(stderr, "lockstep-agent: error: %s\n", keys.error().message.c_str());
      return 1;
    }
    std::printf("%s\n", keys->publicKey.c_str());
    return 0;
  }
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  lockstep::raiseOpenFilesLimit();  // a job's supervision holds a connection per node of the job

  // Not dumpable: a process of the same user (a job's rank) cannot read this one's memory or
  // reach its files through /proc/PID/root.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  Log log(config->logPath());
  auto agent = Agent::create(*config, log);
  if (!agent) {
    log.error(agent.error().message);
    return agent.error().code == lockstep::ErrorCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("lockstep-agent: public key %s\n", (*agent)->keys().publicKey.c_str());
  std::fflush(stdout);
  if (auto r = (*agent)->run(g_stop); !r) {
    log.error(r.error().message);
    return 1;
  }
  return 0;
}
