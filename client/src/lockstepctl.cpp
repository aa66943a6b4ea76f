// lockstepctl: Lockstep without a window. See `lockstepctl --help`.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/client/agent_client.h"
#include "lockstep/net/keys.h"
#include "ctl.h"

namespace lockstep::ctl {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* kUsageText = R"(Usage: lockstepctl [--agent HOST:PORT]... [--json] [--timeout-s N] [--config-dir DIR]
                   [--history FILE | --no-history] COMMAND

Commands:
  keygen                       create this client's key pair (once) and print its public key
  trust HOST:PORT KEY          pin an agent's public key (like SSH's known_hosts)
  nodes                        the agents' nodes: cores, memory, GPUs
  start [--ranks N | --ranks-per-agent A,B,... | --gpus-per-agent G] [--wait] [PRICES] JOB FLAGS...
                               start a job of the built-in trainer on the agents (JOB FLAGS are
                               lockstep-trainer's, e.g. --layers 784,1024,10 --steps 200 --lr 0.01,
                               or --spec job.json); prints its id.
  start [PLACEMENT] [--wait] [PRICES] [--workdir DIR] [--env NAME=VALUE]... -- PROGRAM ARGS...
                               run your own program (a PyTorch DDP script, any torchrun-style
                               program) once per rank, with torchrun's environment; it runs in
                               this directory unless --workdir says otherwise. Its job flags:
                               --job-id --name --backend cpu|cuda --target-loss --max-restarts
                               --min-ranks --timeout-s (docs/own-program.md)
                               PRICES, for the job's cost: --price-gpu-hour X --price-core-hour X
                               --price-kwh X --currency USD
                               --wait follows the job to its end; with --max-restarts N it also
                               restarts it from its last checkpoint when ranks or nodes are lost
  stop JOB [--grace-ms N]      stop a job everywhere and wait until its ranks are gone
  status [JOB]                 jobs on the agents, or one job's ranks
  watch JOB                    live per-rank throughput, loss, communication overhead, CPU/GPU use
  logs JOB --rank R [--bytes N]  the end of a rank's log

History (start --wait and watch record every job they see; the app records too):
  history [--search TEXT] [--state STATE] [--since YYYY-MM-DD] [--limit N]
                               past and current jobs, newest first, with their final KPIs
  history delete JOB...        remove jobs and everything recorded of them
  history compact              downsample samples older than the raw horizon now
  report JOB [--format csv|json|html|pdf] --out FILE
                               the job's KPI report (format from FILE's extension by default);
                               csv also writes FILE-gpus.csv with the GPU samples
  compare JOB JOB...           KPIs side by side, and scaling against ranks for jobs of the same
                               workload

FILE is --history, else $LOCKSTEP_HISTORY, else $XDG_DATA_HOME/lockstep/history.db.

Agents are the --agent options, or else every agent pinned in CONFIG/known_agents. Keys live in
CONFIG ($LOCKSTEP_CONFIG_DIR, or $XDG_CONFIG_HOME/lockstep): client.key/.pub and known_agents.
--agent-key KEY checks that an agent's key is the pinned one before connecting. --help and
--version print this text and the version.

Exit codes: 0 done, 1 an agent refused the request, 2 bad usage, 3 an agent did not answer,
4 a key problem (agent not pinned or not matching, or this client not authorized), 5 the job
failed, 6 the job was stopped.
)";

}  // namespace

std::atomic<int> g_interrupted{0};

int exitFor(const Error& e) {
  switch (e.code) {
    case ErrorCode::kUnavailable:
    case ErrorCode::kTimeout: return kUnreachable;
    case ErrorCode::kPermissionDenied: return kRefused;
    case ErrorCode::kInvalidArgument: return kUsage;
    default: return kFailed;
  }
}

int fail(const Error& e) {
  std::fprintf(stderr, "lockstepctl: %s\n", e.message.c_str());
  return exitFor(e);
}

std::string timeText(std::int64_t unixUs) {
  if (unixUs == 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unixUs / 1000000);
  char text[32];
  std::tm local{};
  localtime_r(&t, &local);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &local);
  return text;
}

namespace {

std::string gib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1u << 30));
  return text;
}

// ---- commands ----

int cmdKeygen(const Globals& g) {
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

int cmdNodes(const Globals& g) {
  auto agents = connectAgents(g);
  if (!agents) return fail(agents.error());
  Json all = Json::array();
  for (auto* agent : agents->all()) {
    const NodeHello& h = agent->hello();
    Json gpus = Json::array();
    for (const auto& gpu : h.gpus) {
      gpus.push_back({{"index", gpu.index}, {"name", gpu.name}, {"uuid", gpu.uuid}, {"memory_bytes", gpu.memoryTotalBytes}});
    }
    all.push_back({{"agent", agent->address().text()}, {"node", h.nodeName}, {"host", h.host},
                   {"agent_version", h.agentVersion}, {"cpu_cores", h.cpuCores}, {"memory_bytes", h.memoryTotalBytes},
                   {"gpus", gpus}, {"gpu_status", h.gpuStatus}, {"sample_hz", h.sampleHz}});
    if (g.json) continue;
    std::printf("%s  node %s (host %s, agent %s): %u cores, %s memory\n", agent->address().text().c_str(),
                h.nodeName.c_str(), h.host.c_str(), h.agentVersion.c_str(), h.cpuCores, gib(h.memoryTotalBytes).c_str());
    for (const auto& gpu : h.gpus) {
      std::printf("  GPU %u  %s  %s  %s\n", gpu.index, gpu.name.c_str(), gib(gpu.memoryTotalBytes).c_str(), gpu.uuid.c_str());
    }
    if (h.gpus.empty()) std::printf("  no GPUs%s%s\n", h.gpuStatus.empty() ? "" : ": ", h.gpuStatus.c_str());
  }
  if (g.json) std::printf("%s\n", all.dump().c_str());
  return kOk;
}

int cmdStatus(const Globals& g, const std::vector<std::string>& args) {
  auto agents = connectAgents(g);
  if (!agents) return fail(agents.error());
  if (!args.empty()) {
    auto parts = findJob(*agents, args[0], g.timeout);
    if (!parts) return fail(parts.error());
    return printJob(g, args[0], *parts);
  }
  std::map<std::string, std::vector<Part>> byJob;
  std::vector<std::string> order;
  for (auto* agent : agents->all()) {
    auto jobs = agent->listJobs(g.timeout);
    if (!jobs) return fail(jobs.error());
    for (auto& job : jobs->jobs) {
      const std::string id = job.spec.jobId;
      if (!byJob.count(id)) order.push_back(id);
      byJob[id].push_back({agent, std::move(job)});
    }
  }
  Json all = Json::array();
  if (!g.json) std::printf("%-32s %-9s %-6s %-20s %-20s %s\n", "JOB", "STATE", "RANKS", "STARTED", "ENDED", "MESSAGE");
  for (const auto& id : order) {
    const auto& parts = byJob[id];
    std::size_t ranks = 0, running = 0;
    std::int64_t started = 0, ended = 0;
    std::string message;
    for (const auto& p : parts) {
      ranks += p.status.ranks.size();
      for (const auto& r : p.status.ranks) running += r.state == JobState::kRunning;
      started = started == 0 ? p.status.startedUnixUs : std::min(started, p.status.startedUnixUs);
      ended = std::max(ended, p.status.endedUnixUs);
      if (!p.status.message.empty() && message.empty()) message = p.status.message;
    }
    const std::string state(jobStateName(overall(parts)));
    if (g.json) {
      all.push_back({{"job_id", id}, {"state", state}, {"ranks", ranks}, {"ranks_running", running},
                     {"started_unix_us", started}, {"ended_unix_us", ended}, {"message", message}});
    } else {
      std::printf("%-32s %-9s %-6s %-20s %-20s %s\n", id.c_str(), state.c_str(),
                  (std::to_string(running) + "/" + std::to_string(ranks)).c_str(), timeText(started).c_str(),
                  timeText(ended).c_str(), message.c_str());
    }
  }
  if (g.json) std::printf("%s\n", all.dump().c_str());
  return kOk;
}

int cmdStop(const Globals& g, const std::vector<std::string>& args) {
  std::string jobId;
  std::uint32_t graceMs = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--grace-ms" && i + 1 < args.size()) {
      graceMs = static_cast<std::uint32_t>(std::strtoul(args[++i].c_str(), nullptr, 10));
    } else if (jobId.empty() && args[i].rfind("--", 0) != 0) {
      jobId = args[i];
    } else {
      return fail(invalidArgument("usage: lockstepctl stop JOB [--grace-ms N]"));
    }
  }
  if (jobId.empty()) return fail(invalidArgument("usage: lockstepctl stop JOB [--grace-ms N]"));
  auto agents = connectAgents(g);
  if (!agents) return fail(agents.error());
  auto parts = stopEverywhere(*agents, jobId, graceMs, g.timeout);
  if (!parts) return fail(parts.error());
  printJob(g, jobId, *parts);
  return kOk;
}

int cmdLogs(const Globals& g, const std::vector<std::string>& args) {
  std::string jobId;
  std::optional<std::uint32_t> rank;
  std::uint32_t bytes = 0;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--rank" && i + 1 < args.size()) {
      rank = static_cast<std::uint32_t>(std::strtoul(args[++i].c_str(), nullptr, 10));
    } else if (args[i] == "--bytes" && i + 1 < args.size()) {
      bytes = static_cast<std::uint32_t>(std::strtoul(args[++i].c_str(), nullptr, 10));
    } else if (jobId.empty()) {
      jobId = args[i];
    } else {
      return fail(invalidArgument("usage: lockstepctl logs JOB --rank R [--bytes N]"));
    }
  }
  if (jobId.empty() || !rank) return fail(invalidArgument("usage: lockstepctl logs JOB --rank R [--bytes N]"));
  auto agents = connectAgents(g);
  if (!agents) return fail(agents.error());
  auto parts = findJob(*agents, jobId, g.timeout);
  if (!parts) return fail(parts.error());
  for (const auto& p : *parts) {
    for (const auto& r : p.status.ranks) {
      if (r.rank != *rank) continue;
      auto logs = p.agent->logs(jobId, *rank, bytes, g.timeout);
      if (!logs) return fail(logs.error());
      if (g.json) {
        std::printf("%s\n", Json{{"job_id", jobId}, {"rank", *rank}, {"truncated", logs->truncated}, {"text", logs->text}}
                                .dump().c_str());
      } else {
        std::fwrite(logs->text.data(), 1, logs->text.size(), stdout);
      }
      return kOk;
    }
  }
  return fail(Error{ErrorCode::kNotFound, "job " + jobId + " has no rank " + std::to_string(*rank)});
}

}  // namespace

int run(int argc, char** argv) {
  Globals g;
  g.configDir = defaultClientConfigDir();
  bool noHistory = false;
  std::vector<std::string> rest;
  std::string command;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::optional<std::string> {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "lockstepctl: %s needs a value\n", flag);
        return std::nullopt;
      }
      return std::string(argv[++i]);
    };
    if (a == "--agent") {
      auto v = value("--agent");
      if (!v) return kUsage;
      g.agents.push_back(*v);
      continue;
    }
    if (a == "--agent-key") {
      auto v = value("--agent-key");
      if (!v) return kUsage;
      g.agentKey = *v;
      continue;
    }
    if (a == "--json") {
      g.json = true;
      continue;
    }
    if (a == "--history") {
      auto v = value("--history");
      if (!v) return kUsage;
      g.historyPath = *v;
      continue;
    }
    if (a == "--no-history") {
      noHistory = true;
      continue;
    }
    if (a == "--config-dir") {
      auto v = value("--config-dir");
      if (!v) return kUsage;
      g.configDir = *v;
      continue;
    }
    // After `start`, --timeout-s is the job's (lockstep-trainer's) flag.
    if (a == "--timeout-s" && command != "start") {
      auto v = value("--timeout-s");
      if (!v) return kUsage;
      g.timeout = milliseconds(std::max(1L, std::strtol(v->c_str(), nullptr, 10)) * 1000);
      continue;
    }
    if ((a == "--help" || a == "-h") && command.empty()) {
      std::fputs(kUsageText, stdout);
      return kOk;
    }
    if (a == "--version" && command.empty()) {
      std::printf("lockstepctl %s\n", LOCKSTEP_VERSION);
      return kOk;
    }
    if (command.empty()) {
      command = a;
    } else {
      rest.push_back(a);
    }
  }
  if (!g.agentKey.empty() && g.agents.size() != 1) {
    return fail(invalidArgument("--agent-key goes with exactly one --agent"));
  }
  if (noHistory) {
    g.historyPath.clear();
  } else if (g.historyPath.empty()) {
    g.historyPath = history::History::defaultPath();
  }
  if (command == "history") return cmdHistory(g, rest);
  if (command == "report") return cmdReport(g, rest);
  if (command == "compare") return cmdCompare(g, rest);
  if (command == "keygen") return cmdKeygen(g);
  if (command == "trust") return cmdTrust(g, rest);
  if (command == "nodes") return cmdNodes(g);
  if (command == "start") return cmdStart(g, rest);
  if (command == "stop") return cmdStop(g, rest);
  if (command == "status") return cmdStatus(g, rest);
  if (command == "watch") return cmdWatch(g, rest);
  if (command == "logs") return cmdLogs(g, rest);
  if (command.empty()) {
    std::fputs(kUsageText, stderr);
    return kUsage;
  }
  std::fprintf(stderr, "lockstepctl: unknown command '%s' (see lockstepctl --help)\n", command.c_str());
  return kUsage;
}

}  // namespace lockstep::ctl

namespace {
void onSignal(int signal) { lockstep::ctl::g_interrupted.store(signal); }
}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_handler = onSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return lockstep::ctl::run(argc, argv);
}
