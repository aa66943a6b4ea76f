#include "support/agent_support.h"

#include "jobs/job_cgroup.h"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include "lockstep/common/files.h"
#include "lockstep/common/process.h"
#include "lockstep/history/history.h"

namespace lockstep::test {

namespace fs = std::filesystem;

std::string agentPath() { return builtBinary("lockstep-agent", LOCKSTEP_AGENT_PATH); }
std::string lockstepctlPath() { return builtBinary("lockstepctl", LOCKSTEPCTL_PATH); }

std::string ipPath() { return ::access("/usr/sbin/ip", X_OK) == 0 ? "/usr/sbin/ip" : "/sbin/ip"; }

NamespacedLink::NamespacedLink(const TempDir& dir) : dir_(dir) {
  const std::string tag = std::to_string(::getpid() % 100000);
  const std::string subnet = "10.233." + std::to_string(::getpid() % 250) + ".";
  ns = "lsN" + tag;
  veth_ = "lsw" + tag;
  hostAddress = subnet + "1";
  nsAddress = subnet + "2";
  const std::string ip = ipPath();
  const auto r = runProcess(
      {"/bin/sh", "-c",
       "set -e; " + ip + " netns add " + ns + "; " + ip + " link add " + veth_ + "h type veth peer name " + veth_ +
           "n; " + ip + " link set " + veth_ + "n netns " + ns + "; " + ip + " addr add " + hostAddress + "/24 dev " +
           veth_ + "h; " + ip + " -n " + ns + " addr add " + nsAddress + "/24 dev " + veth_ + "n; " + ip + " link set " +
           veth_ + "h up; " + ip + " -n " + ns + " link set " + veth_ + "n up; " + ip + " -n " + ns + " link set lo up"},
      {}, dir_, std::chrono::seconds(20));
  made = r.status.success();
  why = r.err;
}

NamespacedLink::~NamespacedLink() {
  const std::string ip = ipPath();
  runProcess({"/bin/sh", "-c", ip + " netns del " + ns + " 2>/dev/null; " + ip + " link del " + veth_ + "h 2>/dev/null; true"},
             {}, dir_, std::chrono::seconds(20));
}

void NamespacedLink::set(bool up) const {
  const auto r = runProcess({ipPath(), "-n", ns, "link", "set", veth_ + "n", up ? "up" : "down"}, {}, dir_,
                            std::chrono::seconds(20));
  if (!r.status.success()) throw std::runtime_error("ip link set: " + r.err);
}

AgentProcess::AgentProcess(const TempDir& dir, const std::string& name, std::vector<std::string> extraArgs, AgentPlace where)
    : dir_(dir), name_(name), extraArgs_(std::move(extraArgs)), netns_(where.netns), env_(std::move(where.env)), stateDir_(dir.file("agent-" + name)) {
  address_ = {where.host, freePort()};
  launch();
}

AgentProcess::~AgentProcess() {
  if (pid_ > 0) terminate();
  // An agent stopped with jobs running leaves them and their cgroups, as it should; the test's
  // must go (as root: elsewhere there are none the test may touch).
  if (::geteuid() == 0) agent::removeCgroupsNamed(agent::partCgroupPrefix(name_, stateDir_));
}

void AgentProcess::launch() {
  std::vector<std::string> argv = {agentPath(), "--state-dir", stateDir_, "--listen", address_.endpoint(), "--name",
                                   name_, "--trainer", trainerPath(), "--stop-grace-ms", "3000"};
  // ip execs the agent after entering the namespace: the pid stays the agent's.
  if (!netns_.empty()) argv.insert(argv.begin(), {ipPath(), "netns", "exec", netns_});
  argv.insert(argv.end(), extraArgs_.begin(), extraArgs_.end());
  // A fixed CPU peak: measuring it (a second of every core) at each test agent's start would slow
  // the tests beside it. Tests of the measurement name --cpu-peak measure.
  if (std::find(extraArgs_.begin(), extraArgs_.end(), "--cpu-peak") == extraArgs_.end()) {
    argv.insert(argv.end(), {"--cpu-peak", std::to_string(kTestCpuPeakGflops)});
  }
  if (std::find(extraArgs_.begin(), extraArgs_.end(), "--job-private-tmp") == extraArgs_.end()) {
    const auto more = privateTmpArgs(stateDir_);
    argv.insert(argv.end(), more.begin(), more.end());
  }
  const std::string tag = name_ + "-" + std::to_string(++launches_);
  pid_ = startProcess(argv, env_, dir_.file("agent-" + tag + ".out"), dir_.file("agent-" + tag + ".err"));
  // Ready once it printed its key (after binding).
  const bool ready = waitUntil(
      [&] { return readText(dir_.file("agent-" + tag + ".out")).find("public key") != std::string::npos; },
      std::chrono::seconds(20));
  if (!ready) throw std::runtime_error("agent did not start: " + readText(dir_.file("agent-" + tag + ".err")));
  publicKey_ = readText(stateDir_ + "/agent.pub");
  publicKey_.erase(publicKey_.find_last_not_of("\n") + 1);
}

void AgentProcess::authorize(const std::string& clientPublicKey) const {
  const std::string path = stateDir_ + "/authorized_keys";
  std::ofstream(path, std::ios::app) << authorizedKeyLine(clientPublicKey, "test client");
  ::chmod(path.c_str(), 0644);  // whatever the umask: the agent refuses a file others may write
}

void AgentProcess::terminate() {
  ::kill(pid_, SIGTERM);
  (void)waitProcess(pid_, std::chrono::seconds(20));
  pid_ = -1;
}

void AgentProcess::kill() {
  ::kill(pid_, SIGKILL);
  (void)waitProcess(pid_, std::chrono::seconds(20));
  pid_ = -1;
}

void AgentProcess::restart() {
  if (pid_ > 0) terminate();
  launch();
}

std::vector<std::string> privateTmpArgs(const std::string& stateDir) {
  const bool hidden = !privateToJobs(stateDir).empty() || !privateToJobs(trainerPath()).empty();
  return hidden ? std::vector<std::string>{"--job-private-tmp", "no"} : std::vector<std::string>{};
}

std::string authorizedKeyLine(const std::string& publicKey, const std::string& comment) {
  return (::geteuid() == 0 ? "user=root allow-root " : "") + publicKey + " " + comment + "\n";
}

ClientKeys::ClientKeys(const TempDir& dir, const std::string& name) : configDir(dir.file("config-" + name)) {
  auto pair = loadOrCreateKeyPair(configDir, "client");
  if (!pair) throw std::runtime_error(pair.error().message);
  keys = *pair;
}

std::unique_ptr<AgentClient> connectTo(const AgentProcess& agent, const ClientKeys& client,
                                       std::chrono::milliseconds timeout) {
  auto c = AgentClient::connect(agent.address(), client.keys, agent.publicKey(), timeout);
  if (!c) throw std::runtime_error(c.error().message);
  return std::move(c).value();
}

std::unique_ptr<AgentClient> connectAuthorized(const AgentProcess& agent, const TempDir& dir) {
  const ClientKeys client(dir);
  agent.authorize(client.keys.publicKey);
  return connectTo(agent, client);
}

ProcessResult Ctl::operator()(std::vector<std::string> args, std::chrono::milliseconds timeout) const {
  args.insert(args.begin(), lockstepctlPath());
  return runProcess(args, {{"LOCKSTEP_CONFIG_DIR", configDir}, {"LOCKSTEP_HISTORY", historyPath()}}, dir, timeout);
}

std::vector<StepReport> Ctl::steps(const std::string& jobId) const {
  auto h = history::History::open(historyPath());
  EXPECT_TRUE(h) << h.error().message;
  std::vector<StepReport> out;
  if (h) {
    EXPECT_TRUE(h->forEachStep(jobId, [&](const StepReport& r, const std::string&) { out.push_back(r); }));
  }
  return out;
}

std::vector<JobEvent> Ctl::events(const std::string& jobId) const {
  auto h = history::History::open(historyPath());
  auto e = h ? h->events(jobId) : Result<std::vector<JobEvent>>(h.error());
  EXPECT_TRUE(e) << e.error().message;
  return e ? *e : std::vector<JobEvent>{};
}

nlohmann::json rankOf(const nlohmann::json& status, std::uint32_t rank) {
  if (!status.is_object() || !status.contains("ranks")) return nullptr;
  for (const auto& r : status["ranks"]) {
    if (r["rank"] == rank) return r;
  }
  return nullptr;
}

bool Ctl::pairWith(const AgentProcess& agent) const {
  const auto key = nlohmann::json::parse((*this)({"keygen", "--json"}).out)["public_key"].get<std::string>();
  agent.authorize(key);
  return (*this)({"trust", agent.address().text(), agent.publicKey()}).status.exitCode == 0;
}

std::vector<pid_t> processesOfJob(const std::string& jobId) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (environOf(pid, "LOCKSTEP_JOB_ID") != jobId) continue;
    const std::string stat = readText("/proc/" + name + "/stat");
    const auto close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z') continue;
    out.push_back(pid);
  }
  return out;
}

std::optional<pid_t> rankProcess(const std::string& jobId, int rank, const std::string& agentStateDir) {
  for (pid_t pid : processesOfJob(jobId)) {
    if (environOf(pid, "RANK") != std::to_string(rank)) continue;
    if (!agentStateDir.empty() && environOf(pid, "LOCKSTEP_REPORT").value_or("").find(agentStateDir) == std::string::npos) {
      continue;
    }
    return pid;
  }
  return std::nullopt;
}

std::optional<pid_t> waitForRankOfAttempt(const std::string& jobId, int rank, std::uint32_t attempt,
                                          std::chrono::milliseconds timeout) {
  std::optional<pid_t> pid;
  const bool found = waitUntil(
      [&] {
        pid = rankProcess(jobId, rank);
        return pid && environOf(*pid, "LOCKSTEP_ATTEMPT") == std::to_string(attempt);
      },
      timeout);
  return found ? pid : std::nullopt;
}

bool hasCheckpointFrom(const std::string& dir, std::uint64_t step) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    unsigned long long n = 0;
    if (std::sscanf(entry.path().filename().string().c_str(), "step-%llu.safetensors", &n) == 1 && n >= step) return true;
  }
  return false;
}

JobSpec smallJob(const std::string& jobId, std::uint32_t worldSize, std::uint64_t steps) {
  JobSpec spec;
  spec.jobId = jobId;
  spec.layers = {32, 64, 10};
  spec.dataset = SyntheticDataset{4096, 32, 10, 3};
  spec.batchPerRank = 32;
  spec.steps = steps;
  spec.worldSize = worldSize;
  spec.timeoutS = 10;
  return spec;
}

JobSpec commandJob(const std::string& jobId, std::uint32_t worldSize, std::vector<std::string> argv,
                   const std::string& workingDir) {
  JobSpec spec;
  spec.jobId = jobId;
  spec.worldSize = worldSize;
  spec.timeoutS = 10;
  spec.command = CommandSpec{std::move(argv), workingDir, {}};
  return spec;
}

std::optional<JobStatus> jobStatusOn(AgentClient& client, const std::string& id) {
  auto jobs = client.listJobs(std::chrono::seconds(5));
  if (!jobs) return std::nullopt;
  for (const auto& j : jobs->jobs) {
    if (j.spec.jobId == id) return j;
  }
  return std::nullopt;
}

namespace {

std::optional<JobStatus> jobOnceSo(AgentClient& client, const std::string& id, bool (*done)(const JobStatus&),
                                   std::chrono::milliseconds within) {
  std::optional<JobStatus> last;
  waitUntil([&] {
    last = jobStatusOn(client, id);
    return last && done(*last);
  }, within);
  return last;
}

}  // namespace

std::optional<JobStatus> jobEnd(AgentClient& client, const std::string& id, std::chrono::milliseconds within) {
  return jobOnceSo(client, id, [](const JobStatus& s) { return jobStateEnded(s.state); }, within);
}

std::optional<JobStatus> jobVerdict(AgentClient& client, const std::string& id, std::chrono::milliseconds within) {
  return jobOnceSo(client, id, [](const JobStatus& s) { return s.supervision.state == SupervisionState::kEnded; }, within);
}

}  // namespace lockstep::test
