#pragma once
// Real lockstep-agent processes on loopback for tests, and clients with authorized keys.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lockstep/client/agent_client.h"
#include "lockstep/net/keys.h"
#include "support/test_support.h"

namespace lockstep::test {

std::string agentPath();
std::string lockstepctlPath();

// iproute2's ip (apt: iproute2), for tests with network namespaces.
std::string ipPath();

// A network namespace of its own joined to this process's by a veth pair: `hostAddress` here,
// `nsAddress` inside (a /24 of 10.233.x). Making it takes root (CAP_SYS_ADMIN, CAP_NET_ADMIN);
// `made` says whether it worked and `why` why not. Removed (with its link) on destruction.
class NamespacedLink {
 public:
  explicit NamespacedLink(const TempDir& dir);
  ~NamespacedLink();
  void set(bool up) const;  // the namespace's end of the link

  bool made = false;
  std::string why, ns, hostAddress, nsAddress;

 private:
  const TempDir& dir_;
  std::string veth_;
};

// Where an agent listens: a free port on `host`, inside network namespace `netns` if one is named.
struct AgentPlace {
  std::string host = "127.0.0.1";
  std::string netns;
  Env env;  // more environment for the agent (and so its ranks)
};

// The CPU peak test agents take a CPU rank's MFU against (one core's, GFLOP/s), unless a test
// names --cpu-peak.
inline constexpr int kTestCpuPeakGflops = 50;

class AgentProcess {
 public:
  // Starts an agent named `name` with its own state dir under `dir`, on a free loopback port
  // unless `where` says otherwise.
  AgentProcess(const TempDir& dir, const std::string& name, std::vector<std::string> extraArgs = {},
               AgentPlace where = {});
  ~AgentProcess();

  const AgentAddress& address() const { return address_; }
  const std::string& publicKey() const { return publicKey_; }
  const std::string& stateDir() const { return stateDir_; }
  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  void authorize(const std::string& clientPublicKey) const;

  void terminate();  // SIGTERM, and wait
  void kill();       // SIGKILL, and wait
  void restart();    // same state dir and port

 private:
  void launch();
  const TempDir& dir_;
  std::string name_;
  std::vector<std::string> extraArgs_;
  std::string netns_;
  Env env_;
  std::string stateDir_;
  AgentAddress address_;
  std::string publicKey_;
  pid_t pid_ = -1;
  int launches_ = 0;
};

// A line of an agent's authorized keys for `publicKey`. An agent running as root (as in CI) runs
// a key's jobs as the user its line names: these lines name root, with allow-root (owners.h).
std::string authorizedKeyLine(const std::string& publicKey, const std::string& comment);

// What an agent with state in `stateDir` needs to run the tests' jobs: where the fixtures (the
// test's directory, the built trainer) lie in /tmp, which a job's private /tmp would hide,
// `--job-private-tmp no`; else nothing. AgentProcess adds it unless its arguments say otherwise.
std::vector<std::string> privateTmpArgs(const std::string& stateDir);

// A client key pair in its own config dir.
struct ClientKeys {
  explicit ClientKeys(const TempDir& dir, const std::string& name = "client");
  std::string configDir;
  CurveKeyPair keys;
};

std::unique_ptr<AgentClient> connectTo(const AgentProcess& agent, const ClientKeys& client,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(10));
// A client with a key of its own (in `dir`), authorized on `agent` and connected to it.
std::unique_ptr<AgentClient> connectAuthorized(const AgentProcess& agent, const TempDir& dir);

// lockstepctl with its own config dir and a history file in `dir`.
struct Ctl {
  const TempDir& dir;
  std::string configDir;
  ProcessResult operator()(std::vector<std::string> args,
                           std::chrono::milliseconds timeout = std::chrono::seconds(120)) const;
  std::string historyPath() const { return dir.file("history.db"); }
  // The job's step reports in that history, as recorded (a failure to read it fails the test).
  std::vector<StepReport> steps(const std::string& jobId) const;
  // The job's events in that history (a failure to read it fails the test).
  std::vector<JobEvent> events(const std::string& jobId) const;
  // Makes this client's key, authorizes it on the agent and pins the agent's key: ready to use it.
  bool pairWith(const AgentProcess& agent) const;
};

// Two agents, node-a and node-b, with `env` for them and their ranks (a test knob such as
// LOCKSTEP_TEST_SLOWDOWN); node-b stamps everything `clockShiftUs` late, as a node whose clock is
// ahead (LOCKSTEP_TEST_CLOCK_OFFSET_US).
struct TwoNodes {
  TwoNodes(const TempDir& dir, const Env& env, std::int64_t clockShiftUs)
      : a(dir, "node-a", {}, AgentPlace{.env = env}), b(dir, "node-b", {}, AgentPlace{.env = shifted(env, clockShiftUs)}) {}
  AgentProcess a, b;

 private:
  static Env shifted(Env env, std::int64_t us) {
    env.emplace_back("LOCKSTEP_TEST_CLOCK_OFFSET_US", std::to_string(us));
    return env;
  }
};

// Rank `rank`'s entry of `lockstepctl --json status`'s output (null where there is none).
nlohmann::json rankOf(const nlohmann::json& status, std::uint32_t rank);

// Living (not zombie) processes whose environment says LOCKSTEP_JOB_ID=jobId.
std::vector<pid_t> processesOfJob(const std::string& jobId);
// The pid of rank `rank` of a job (optionally only among the processes started by the agent whose
// state dir is `agentStateDir`).
std::optional<pid_t> rankProcess(const std::string& jobId, int rank, const std::string& agentStateDir = {});
// Waits up to `timeout` for rank `rank` of attempt `attempt` (an elastic restart's) to run: its pid.
std::optional<pid_t> waitForRankOfAttempt(const std::string& jobId, int rank, std::uint32_t attempt,
                                          std::chrono::milliseconds timeout);

// Whether `dir` holds a checkpoint of step `step` or later (retention deletes older ones quickly
// in a fast job, so "step 100 exists" can be missed between two looks).
bool hasCheckpointFrom(const std::string& dir, std::uint64_t step);

// Job `id` as the agent `client` reaches lists it; nullopt when it lists no such job or does not
// answer.
std::optional<JobStatus> jobStatusOn(AgentClient& client, const std::string& id);
// Job `id` once it ended (within `within`); its last status seen otherwise (nullopt: never listed).
std::optional<JobStatus> jobEnd(AgentClient& client, const std::string& id,
                                std::chrono::milliseconds within = std::chrono::seconds(60));
// Job `id` once its supervision ended, with the verdict (within `within`); its last status seen otherwise.
std::optional<JobStatus> jobVerdict(AgentClient& client, const std::string& id,
                                    std::chrono::milliseconds within = std::chrono::seconds(60));

// A small CPU job for agents: an MLP on synthetic data.
JobSpec smallJob(const std::string& jobId, std::uint32_t worldSize, std::uint64_t steps);
// A job of `worldSize` ranks that each run `argv` (no shell, no PATH lookup) in `workingDir`.
JobSpec commandJob(const std::string& jobId, std::uint32_t worldSize, std::vector<std::string> argv,
                   const std::string& workingDir);

}  // namespace lockstep::test
