#include "jobs/rank_launch.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <filesystem>

#include "lockstep/common/progress.h"
#include "lockstep/jobflags/options.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using Env = std::vector<std::pair<std::string, std::string>>;

std::string visibleGpus(const std::vector<RankPlacement>& local) {
  // In local-rank order, so that each rank's `cuda:LOCAL_RANK` is its own GPU.
  std::vector<RankPlacement> sorted = local;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.localRank < b.localRank; });
  std::string out;
  for (const auto& p : sorted) {
    if (p.gpuIndex) out += (out.empty() ? "" : ",") + std::to_string(*p.gpuIndex);
  }
  return out;
}

std::string valueIn(const Env& env, const std::string& name) {
  for (const auto& [n, v] : env) {
    if (n == name) return v;
  }
  const char* inherited = std::getenv(name.c_str());
  return inherited != nullptr ? inherited : "";
}

}  // namespace

std::uint32_t rankThreads(const NodeLaunch& n, const RankPlacement& p) {
  if (!n.cpus.empty()) return static_cast<std::uint32_t>(rankCpus(n, p).size());
  return std::max(1u, n.cpuCores / static_cast<std::uint32_t>(std::max<std::size_t>(1, n.local.size())));
}

namespace {

// torchrun's variables, the GPUs, and what the lockstep package needs; then the job's own.
Env commandEnv(const NodeLaunch& n, const std::string& nodeName, const RankPlacement& p) {
  const JobSpec& spec = *n.spec;
  const auto [group, groups] = nodeRankOf(spec, nodeName);
  const auto localWorld = static_cast<std::uint32_t>(n.local.size());
  Env env = {{"RANK", std::to_string(p.rank)},
             {"WORLD_SIZE", std::to_string(spec.worldSize)},
             {"LOCAL_RANK", std::to_string(p.localRank)},
             {"LOCAL_WORLD_SIZE", std::to_string(localWorld)},
             {"GROUP_RANK", std::to_string(group)},
             {"GROUP_WORLD_SIZE", std::to_string(groups)},
             {"ROLE_RANK", std::to_string(p.rank)},
             {"ROLE_WORLD_SIZE", std::to_string(spec.worldSize)},
             {"ROLE_NAME", "default"},
             {"MASTER_ADDR", n.masterAddr},
             {"MASTER_PORT", std::to_string(n.masterPort)},
             {"TORCHELASTIC_RUN_ID", spec.jobId},
             {"TORCHELASTIC_RESTART_COUNT", std::to_string(spec.attempt)},
             {"TORCHELASTIC_MAX_RESTARTS", std::to_string(spec.maxRestarts)},
             {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},  // CUDA's indexes are then NVML's, which placement uses
             {"CUDA_VISIBLE_DEVICES", visibleGpus(n.local)},
             {"LOCKSTEP_JOB_ID", spec.jobId},
             {"LOCKSTEP_ATTEMPT", std::to_string(spec.attempt)},
             {"LOCKSTEP_REPORT", n.reportEndpoint},
             {progress::kEnv, rankProgressPath(n.jobDir, p.rank)},
             {progress::kStacksEnv, rankStacksPath(n.jobDir, p.rank)}};
  if (localWorld > 1 || !n.cpus.empty()) env.emplace_back("OMP_NUM_THREADS", std::to_string(rankThreads(n, p)));
  if (!n.cpus.empty()) env.emplace_back("LOCKSTEP_RANK_CPUS", cpuListText(rankCpus(n, p)));
  if (!n.pythonPath.empty()) {
    // boot/ holds a sitecustomize that loads the package's stack dumper into every Python rank,
    // so unmodified scripts get stacks too (docs/stalls.md); it chains to the system's own.
    const std::string ours = n.pythonPath + ":" + n.pythonPath + "/boot";
    const std::string theirs = valueIn(spec.command->env, "PYTHONPATH");
    env.emplace_back("PYTHONPATH", theirs.empty() ? ours : theirs + ":" + ours);
  }
  // The job's own variables win over the inherited ones and ours (validation keeps it off the
  // rank variables), except PYTHONPATH, merged above.
  for (const auto& [name, value] : spec.command->env) {
    if (name == "PYTHONPATH") continue;
    std::erase_if(env, [&](const auto& kv) { return kv.first == name; });
    env.emplace_back(name, value);
  }
  return env;
}

Env trainerEnv(const NodeLaunch& n, const RankPlacement& p) {
  const JobSpec& spec = *n.spec;
  const auto localWorld = static_cast<std::uint32_t>(n.local.size());
  return {{"RANK", std::to_string(p.rank)},
          {"WORLD_SIZE", std::to_string(spec.worldSize)},
          {"LOCAL_RANK", std::to_string(p.localRank)},
          {"LOCAL_WORLD_SIZE", std::to_string(localWorld)},
          {"MASTER_ADDR", n.masterAddr},
          {"MASTER_PORT", std::to_string(n.masterPort)},
          {"LOCKSTEP_AGENT_STORE", "1"},
          {"LOCKSTEP_STORE_SECRET", n.storeSecret},
          {"LOCKSTEP_JOB_ID", spec.jobId},
          {"LOCKSTEP_ATTEMPT", std::to_string(spec.attempt)},
          {"LOCKSTEP_REPORT", n.reportEndpoint},
          {progress::kEnv, rankProgressPath(n.jobDir, p.rank)},
          {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"},
          {"CUDA_VISIBLE_DEVICES", p.gpuIndex ? std::to_string(*p.gpuIndex) : ""},
          {"OPENBLAS_NUM_THREADS", std::to_string(rankThreads(n, p))},
          {"LOCKSTEP_RANK_CPUS", cpuListText(rankCpus(n, p))}};
}

// The job's user: who the process becomes (when that is not the agent's own user), its HOME,
// USER and LOGNAME, and umask 077: what it makes is its user's alone.
void runAsOwner(const NodeLaunch& n, SpawnOptions& spawn) {
  if (n.owner == nullptr) return;
  const Identity& who = *n.owner;
  if (who.uid != ::geteuid() || who.gid != ::getegid()) spawn.credentials = SpawnOptions::Credentials{who.uid, who.gid, who.groups};
  spawn.umask = 077;
  spawn.dropRootCapabilities = true;  // a key with allow-root: root's files, not the node's powers
  for (const auto& [name, value] : {std::pair<std::string, std::string>{"HOME", who.home}, {"USER", who.user}, {"LOGNAME", who.user}}) {
    if (std::none_of(spawn.env.begin(), spawn.env.end(), [&](const auto& kv) { return kv.first == name; })) {
      spawn.env.emplace_back(name, value);
    }
  }
}

}  // namespace

std::string rankProgressPath(const std::string& jobDir, std::uint32_t rank) {
  return (fs::path(jobDir) / ("progress-" + std::to_string(rank))).string();
}

std::string rankStacksPath(const std::string& jobDir, std::uint32_t rank) {
  return (fs::path(jobDir) / ("stacks-" + std::to_string(rank) + ".txt")).string();
}

std::pair<std::uint32_t, std::uint32_t> nodeRankOf(const JobSpec& spec, const std::string& node) {
  std::vector<std::string> nodes;  // in the order of their lowest rank
  std::vector<RankPlacement> byRank = spec.ranks;
  std::sort(byRank.begin(), byRank.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (const auto& p : byRank) {
    if (std::find(nodes.begin(), nodes.end(), p.node) == nodes.end()) nodes.push_back(p.node);
  }
  const auto it = std::find(nodes.begin(), nodes.end(), node);
  if (it == nodes.end()) return {0, 1};  // no placements: one node runs every rank
  return {static_cast<std::uint32_t>(it - nodes.begin()), static_cast<std::uint32_t>(nodes.size())};
}

SpawnOptions rankSpawnOptions(const NodeLaunch& n, const std::string& nodeName, const RankPlacement& placement,
                              const std::string& logPath) {
  SpawnOptions spawn;
  spawn.stdoutPath = logPath;
  spawn.stderrPath = logPath;
  spawn.newProcessGroup = true;
  spawn.stdinFromDevNull = true;
  if (n.spec->command) {
    spawn.argv = n.spec->command->argv;  // argv[0] as the user wrote it; the preflight found its path
    spawn.executable = n.program;
    spawn.env = commandEnv(n, nodeName, placement);
    spawn.workingDir = n.spec->command->workingDir.empty() ? n.jobDir : n.spec->command->workingDir;
  } else {
    spawn.argv = {n.program};
    const auto args = jobflags::rankArgs(*n.spec, n.metricsPath);
    spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
    spawn.env = trainerEnv(n, placement);
  }
  runAsOwner(n, spawn);
  if (!n.hide.empty()) spawn.join = n.join;  // the job's namespaces (jobInitSpawnOptions)
  spawn.cgroupProcsFds = n.cgroupProcsFds;
  spawn.cpus = rankCpus(n, placement);
  return spawn;
}

std::vector<int> rankCpus(const NodeLaunch& n, const RankPlacement& placement) {
  if (n.cpus.empty()) return {};
  const auto at = std::find_if(n.local.begin(), n.local.end(), [&](const auto& p) { return p.rank == placement.rank; });
  const std::size_t first = static_cast<std::size_t>(at - n.local.begin()) * n.cpusPerRank;
  std::vector<int> cpus;
  for (std::size_t i = 0; i < std::max(1u, n.cpusPerRank); ++i) {
    const int cpu = n.cpus[(first + i) % n.cpus.size()];
    if (std::find(cpus.begin(), cpus.end(), cpu) == cpus.end()) cpus.push_back(cpu);
  }
  return cpus;
}

SpawnOptions jobInitSpawnOptions(const NodeLaunch& n) {
  SpawnOptions spawn;
  spawn.argv = {"lockstep-job-init", kJobInitArg};
  spawn.executable = "/proc/self/exe";
  spawn.executableFd = n.agentFd;
  spawn.stdoutPath = spawn.stderrPath = "/dev/null";
  spawn.stdinFromDevNull = true;
  spawn.newProcessGroup = true;
  // Its own job's directory and the report socket's stay; the agent's keys, the job table and
  // the other jobs' files are hidden.
  SpawnOptions::Sandbox sandbox{n.hide, {n.jobDir}, {}, n.privateTmp};
  if (n.reportEndpoint.rfind("ipc://", 0) == 0) {
    // Read-only: a rank may connect to the socket, not replace it (and so hear other jobs).
    sandbox.keep.push_back(fs::path(n.reportEndpoint.substr(6)).parent_path().string());
    sandbox.readOnly.push_back(sandbox.keep.back());
  }
  spawn.sandbox = std::move(sandbox);
  spawn.newPidNamespace = true;
  spawn.cgroupProcsFds = n.cgroupProcsFds;
  runAsOwner(n, spawn);
  return spawn;
}

std::string findPythonPackage() {
  char self[PATH_MAX];
  const ssize_t length = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) return "";
  const fs::path bin = fs::path(std::string(self, static_cast<std::size_t>(length))).parent_path();
  for (const fs::path& dir : {bin.parent_path() / "python", bin.parent_path() / "lib" / "lockstep" / "python"}) {
    std::error_code ec;
    if (fs::exists(dir / "lockstep" / "__init__.py", ec)) return dir.lexically_normal().string();
  }
  return "";
}

}  // namespace lockstep::agent
