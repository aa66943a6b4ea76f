// lockstepctl: Lockstep without a window. See `lockstepctl --help`.

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/client/agent_client.h"
#include "lockstep/client/elastic.h"
#include "lockstep/client/launch.h"
#include "lockstep/common/files.h"
#include "lockstep/jobflags/options.h"
#include "lockstep/net/keys.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/validate.h"
#include "lockstep/report/report.h"
#include "ctl.h"

namespace lockstep::ctl {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::atomic<int> g_interrupted{0};

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

std::string newJobId() {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  std::random_device random;
  char suffix[8];
  std::snprintf(suffix, sizeof suffix, "%04x", random() & 0xffff);
  return std::string("job-") + stamp + "-" + suffix;
}

// ---- connecting ----

struct Connected {
  std::vector<std::unique_ptr<AgentClient>> clients;
  std::vector<AgentClient*> all() const {
    std::vector<AgentClient*> out;
    for (const auto& c : clients) out.push_back(c.get());
    return out;
  }
};

Result<Connected> connectAgents(const Globals& g) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto known, KnownAgents::load((fs::path(g.configDir) / "known_agents").string()));
  std::vector<std::string> addresses = g.agents;
  if (addresses.empty()) {
    for (const auto& [address, key] : known.all()) addresses.push_back(address);
  }
  if (addresses.empty()) {
    return invalidArgument("no agents: name one with --agent HOST:PORT, after pinning its key with "
                           "`lockstepctl trust HOST:PORT KEY`");
  }
  auto keys = loadKeyPair(g.configDir, "client");
  if (!keys) {
    return Error{ErrorCode::kPermissionDenied, keys.error().message + " (run `lockstepctl keygen` first)"};
  }
  Connected out;
  for (const auto& text : addresses) {
    LOCKSTEP_ASSIGN_OR_RETURN(const AgentAddress address, parseAgentAddress(text));
    const auto pinned = known.keyFor(address.text());
    if (!g.agentKey.empty() && pinned != g.agentKey) {
      return Error{ErrorCode::kPermissionDenied,
                   "agent " + address.text() + " would be reached with key " + fingerprint(g.agentKey) +
                       ", which is not the key pinned for it (" + (pinned ? fingerprint(*pinned) : "none pinned") +
                       "). If you trust that key, run:\n  lockstepctl trust " + address.text() + " " + g.agentKey};
    }
    if (!pinned) {
      return Error{ErrorCode::kPermissionDenied,
                   "agent " + address.text() + " is not trusted: no key is pinned for it. On that node run "
                   "`lockstep-agent --print-key`, check the key, then:\n  lockstepctl trust " + address.text() + " KEY"};
    }
    auto client = AgentClient::connect(address, *keys, *pinned, g.timeout);
    if (!client) return client.error();
    out.clients.push_back(std::move(client).value());
  }
  return out;
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
  auto known = KnownAgents::load((fs::path(g.configDir) / "known_agents").string());
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

// The job's parts: each agent that knows the job, with its status there.
struct Part {
  AgentClient* agent;
  JobStatus status;
};

// With `lost`: agents in it are skipped, and one that does not answer is added to it instead of
// failing the call (a supervised job outlives a lost node).
Result<std::vector<Part>> findJob(const Connected& agents, const std::string& jobId, milliseconds timeout,
                                  std::set<AgentClient*>* lost = nullptr) {
  std::vector<Part> parts;
  for (auto* agent : agents.all()) {
    if (lost && lost->count(agent)) continue;
    auto jobs = agent->listJobs(timeout);
    if (!jobs && lost && (jobs.error().code == ErrorCode::kUnavailable || jobs.error().code == ErrorCode::kTimeout)) {
      lost->insert(agent);
      continue;
    }
    if (!jobs) return jobs.error();
    for (auto& job : jobs->jobs) {
      if (job.spec.jobId == jobId) parts.push_back({agent, std::move(job)});
    }
  }
  if (parts.empty()) return Error{ErrorCode::kNotFound, "no agent knows job " + jobId + " (lockstepctl status lists jobs)"};
  return parts;
}

bool partEnded(const JobStatus& s) { return s.state != JobState::kStarting && s.state != JobState::kRunning; }

// A job's overall state, by the history's rule (failed if any part failed, running while any runs, ...).
JobState overall(const std::vector<Part>& parts) {
  std::vector<JobState> states;
  for (const auto& p : parts) states.push_back(p.status.state);
  return history::combinedState(states);
}

int exitForState(JobState s) {
  return s == JobState::kFailed ? kJobFailed : s == JobState::kStopped ? kJobStopped : kOk;
}

// Stops every part and waits until no rank runs, or the grace period (and a margin) passes.
Result<std::vector<Part>> stopEverywhere(const Connected& agents, const std::string& jobId, std::uint32_t graceMs,
                                         milliseconds timeout, std::set<AgentClient*>* lost = nullptr) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto parts, findJob(agents, jobId, timeout, lost));
  for (auto& part : parts) {
    if (!partEnded(part.status)) LOCKSTEP_TRY(part.agent->stopJob(jobId, graceMs, timeout));
  }
  const auto deadline = Clock::now() + milliseconds(graceMs > 0 ? graceMs : 10000) + std::chrono::seconds(10);
  while (true) {
    LOCKSTEP_ASSIGN_OR_RETURN(parts, findJob(agents, jobId, timeout, lost));
    const bool done = std::all_of(parts.begin(), parts.end(), [](const Part& p) { return partEnded(p.status); });
    if (done) return parts;
    if (Clock::now() > deadline) return timeoutError("job " + jobId + " still has running ranks after the grace period");
    std::this_thread::sleep_for(milliseconds(200));
  }
}

Json rankJson(const Part& part, const RankStatus& r) {
  Json j = {{"rank", r.rank}, {"node", part.agent->hello().nodeName}, {"agent", part.agent->address().text()},
            {"pid", r.pid}, {"state", std::string(jobStateName(r.state))}};
  if (r.gpuIndex) j["gpu"] = *r.gpuIndex;
  if (r.exitCode) j["exit_code"] = *r.exitCode;
  if (r.signal) j["signal"] = *r.signal;
  if (r.exitUnknown) j["exit_unknown"] = true;
  return j;
}

std::string rankExitText(const RankStatus& r) {
  if (r.exitUnknown) return "exit unknown";
  if (r.signal) return "signal " + std::to_string(*r.signal);
  if (r.exitCode) return "exit " + std::to_string(*r.exitCode);
  return "";
}

int printJob(const Globals& g, const std::string& jobId, const std::vector<Part>& parts) {
  const JobState state = overall(parts);
  std::string message;
  for (const auto& p : parts) {
    if (!p.status.message.empty() && message.find(p.status.message) == std::string::npos) {
      message += (message.empty() ? "" : "; ") + p.status.message;
    }
  }
  if (g.json) {
    Json ranks = Json::array();
    for (const auto& p : parts)
      for (const auto& r : p.status.ranks) ranks.push_back(rankJson(p, r));
    const Prices& prices = parts.front().status.spec.prices;
    const Json pricesJson{{"gpu_hour", prices.gpuHour}, {"core_hour", prices.coreHour}, {"kwh", prices.kwh},
                          {"currency", prices.currency}};
    Json out{{"job_id", jobId}, {"state", std::string(jobStateName(state))}, {"message", message},
             {"world_size", parts.front().status.spec.worldSize}, {"prices", pricesJson}, {"ranks", ranks}};
    if (const auto& command = parts.front().status.spec.command) {
      out["command"] = command->argv;
      out["working_dir"] = command->workingDir;
    }
    std::printf("%s\n", out.dump().c_str());
    return kOk;
  }
  std::printf("job %s: %s%s%s\n", jobId.c_str(), std::string(jobStateName(state)).c_str(), message.empty() ? "" : ": ",
              message.c_str());
  if (const auto& command = parts.front().status.spec.command) {
    std::printf("runs %s in %s\n", report::commandLine(command->argv).c_str(),
                command->workingDir.empty() ? "the agent's job directory" : command->workingDir.c_str());
  }
  std::printf("%-6s %-16s %-8s %-10s %s\n", "RANK", "NODE", "PID", "STATE", "EXIT");
  std::vector<std::pair<std::uint32_t, std::string>> rows;
  for (const auto& p : parts) {
    for (const auto& r : p.status.ranks) {
      char line[256];
      std::snprintf(line, sizeof line, "%-6u %-16s %-8u %-10s %s", r.rank, p.agent->hello().nodeName.c_str(), r.pid,
                    std::string(jobStateName(r.state)).c_str(), rankExitText(r).c_str());
      rows.emplace_back(r.rank, line);
    }
  }
  std::sort(rows.begin(), rows.end());
  for (const auto& [rank, line] : rows) std::printf("%s\n", line.c_str());
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

// ---- watch ----

struct RankView {
  std::string node;
  std::uint64_t step = 0;
  std::uint32_t epoch = 0;
  double loss = NAN;
  std::deque<StepReport> window;  // the last few seconds of reports
  std::optional<float> cpuPct;
  std::optional<std::uint64_t> rssBytes;
  std::optional<float> gpuUtil;
  std::optional<std::uint32_t> gpuIndex;
};

struct WatchState {
  std::map<std::uint32_t, RankView> ranks;
  std::map<std::string, std::map<std::uint32_t, float>> gpuUtilByNode;  // node -> gpu -> util
  std::vector<std::string> events;
};

constexpr std::int64_t kWindowUs = 5'000'000;

void absorb(WatchState& w, const std::string& jobId, const StreamMessage& m) {
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, StepReport>) {
          if (p.jobId != jobId) return;
          RankView& v = w.ranks[p.rank];
          v.node = m.node;
          v.step = std::max(v.step, p.step);
          v.epoch = p.epoch;
          if (p.globalLoss) v.loss = *p.globalLoss;
          v.window.push_back(p);
          while (!v.window.empty() && v.window.back().timeUnixUs - v.window.front().timeUnixUs > kWindowUs) {
            v.window.pop_front();
          }
        } else if constexpr (std::is_same_v<T, ProcessSample>) {
          if (p.jobId != jobId) return;
          RankView& v = w.ranks[p.rank];
          v.cpuPct = p.cpuPct;
          v.rssBytes = p.rssBytes;
        } else if constexpr (std::is_same_v<T, GpuSample>) {
          if (p.utilizationPct && p.jobId == jobId) w.gpuUtilByNode[p.node][p.gpuIndex] = *p.utilizationPct;
        } else {
          if (p.jobId != jobId) return;
          w.events.push_back(timeText(p.timeUnixUs) + " " + m.node + ": " + p.message);
        }
      },
      m.payload);
}

Json renderWatch(const WatchState& w, const std::string& jobId, JobState state, bool json, bool tty) {
  Json ranks = Json::array();
  double totalRate = 0;
  std::string table;
  char line[320];
  std::snprintf(line, sizeof line, "%-5s %-14s %8s %6s %10s %11s %8s %6s %9s %6s\n", "RANK", "NODE", "STEP", "EPOCH",
                "LOSS", "SAMPLES/S", "COMM %", "CPU %", "RSS", "GPU %");
  table += line;
  for (const auto& [rank, v] : w.ranks) {
    double rate = NAN, comm = NAN;
    if (v.window.size() >= 2) {
      const double seconds = static_cast<double>(v.window.back().timeUnixUs - v.window.front().timeUnixUs) / 1e6;
      std::uint64_t samples = 0;
      std::int64_t stepUs = 0, exposedUs = 0;
      for (std::size_t i = 1; i < v.window.size(); ++i) samples += v.window[i].samples;
      for (const auto& r : v.window) {
        if (!r.exposedCommTimeUs) continue;  // not measured: the share is over the steps that were
        stepUs += r.stepTimeUs;
        exposedUs += *r.exposedCommTimeUs;
      }
      if (seconds > 0) rate = static_cast<double>(samples) / seconds;
      if (stepUs > 0) comm = 100.0 * static_cast<double>(exposedUs) / static_cast<double>(stepUs);
    }
    if (std::isfinite(rate)) totalRate += rate;
    std::optional<float> gpu;
    if (auto it = w.gpuUtilByNode.find(v.node); it != w.gpuUtilByNode.end() && !it->second.empty()) {
      float sum = 0;
      for (const auto& [i, u] : it->second) sum += u;
      gpu = sum / static_cast<float>(it->second.size());
    }
    Json r = {{"rank", rank}, {"node", v.node}, {"step", v.step}, {"epoch", v.epoch}};
    r["loss"] = std::isfinite(v.loss) ? Json(v.loss) : Json(nullptr);
    r["samples_per_s"] = std::isfinite(rate) ? Json(rate) : Json(nullptr);
    r["comm_overhead_pct"] = std::isfinite(comm) ? Json(comm) : Json(nullptr);
    r["cpu_pct"] = v.cpuPct ? Json(*v.cpuPct) : Json(nullptr);
    r["rss_bytes"] = v.rssBytes ? Json(*v.rssBytes) : Json(nullptr);
    r["gpu_util_pct"] = gpu ? Json(*gpu) : Json(nullptr);
    ranks.push_back(r);
    auto num = [](double x, const char* fmt) {
      char t[32];
      if (!std::isfinite(x)) return std::string("-");
      std::snprintf(t, sizeof t, fmt, x);
      return std::string(t);
    };
    std::snprintf(line, sizeof line, "%-5u %-14s %8llu %6u %10s %11s %8s %6s %9s %6s\n", rank, v.node.c_str(),
                  static_cast<unsigned long long>(v.step), v.epoch, num(v.loss, "%.4f").c_str(),
                  num(rate, "%.0f").c_str(), num(comm, "%.1f").c_str(), num(v.cpuPct ? *v.cpuPct : NAN, "%.0f").c_str(),
                  v.rssBytes ? num(static_cast<double>(*v.rssBytes) / (1 << 20), "%.0f MiB").c_str() : "-",
                  num(gpu ? *gpu : NAN, "%.0f").c_str());
    table += line;
  }
  const std::string stateName(jobStateName(state));
  Json snapshot = {{"job_id", jobId}, {"state", stateName}, {"samples_per_s", totalRate}, {"ranks", ranks}};
  if (json) {
    std::printf("%s\n", snapshot.dump().c_str());
  } else {
    if (tty) std::printf("\033[H\033[J");
    std::printf("job %s: %s, %.0f samples/s in total\n%s", jobId.c_str(), stateName.c_str(), totalRate, table.c_str());
    const std::size_t shown = std::min<std::size_t>(w.events.size(), 5);
    for (std::size_t i = w.events.size() - shown; i < w.events.size(); ++i) std::printf("  %s\n", w.events[i].c_str());
    if (!tty) std::printf("\n");
  }
  std::fflush(stdout);
  return snapshot;
}

// After a job ended: what the agents sent since the last fetch (its last reports and events).
void drain(std::map<AgentClient*, std::uint64_t>& lastSeq, Recorder& recorder, milliseconds timeout) {
  for (auto& [agent, seq] : lastSeq) {
    for (;;) {
      auto batch = agent->fetch(seq, 5000, 0, timeout);
      if (!batch || batch->messages.empty()) break;
      recorder.messages(batch->messages);
      seq = batch->messages.back().seq;
    }
  }
}

int cmdWatch(const Globals& g, const std::vector<std::string>& args) {
  if (args.size() != 1) return fail(invalidArgument("usage: lockstepctl watch JOB"));
  const std::string jobId = args[0];
  auto agents = connectAgents(g);
  if (!agents) return fail(agents.error());
  auto parts = findJob(*agents, jobId, g.timeout);
  if (!parts) return fail(parts.error());
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  WatchState w;
  Recorder recorder(g);
  // Recording: everything the agents still hold of the job. Else their last few thousand
  // messages, so that a running job shows its recent past at once.
  std::map<AgentClient*, std::uint64_t> lastSeq;
  for (const auto& p : *parts) {
    recorder.part(p.agent->hello(), p.status);
    const std::uint64_t last = p.agent->hello().lastSeq;
    lastSeq[p.agent] = !g.historyPath.empty() || last < 20000 ? 0 : last - 20000;
  }
  auto nextRender = Clock::now();
  while (g_interrupted.load() == 0) {
    for (auto& [agent, seq] : lastSeq) {
      auto batch = agent->fetch(seq, 5000, 200, g.timeout);
      if (!batch) return fail(batch.error());
      for (const auto& m : batch->messages) absorb(w, jobId, m);
      recorder.messages(batch->messages);
      if (!batch->messages.empty()) seq = batch->messages.back().seq;
    }
    if (Clock::now() < nextRender) continue;
    nextRender = Clock::now() + std::chrono::seconds(1);
    auto now = findJob(*agents, jobId, g.timeout);
    if (!now) return fail(now.error());
    for (const auto& p : *now) recorder.part(p.agent->hello(), p.status);
    const JobState state = overall(*now);
    renderWatch(w, jobId, state, g.json, tty);
    const bool ended = std::all_of(now->begin(), now->end(), [](const Part& p) { return partEnded(p.status); });
    if (ended) {
      drain(lastSeq, recorder, g.timeout);
      recorder.finish();
      if (!g.json) printJob(g, jobId, *now);
      return exitForState(state);
    }
  }
  return kOk;
}

// ---- supervising a started job (start --wait) ----

// Follows a started job to its end, recording it in the history. A job with max_restarts is
// restarted from its last checkpoint with the ranks left when ranks or nodes are lost, keeping its
// global batch (more rows per rank), up to max_restarts times; then it fails with what happened.
int superviseJob(const Globals& g, const Connected& agents, JobSpec spec, std::map<AgentClient*, std::uint64_t> lastSeq) {
  Recorder recorder(g);
  const bool elastic = spec.maxRestarts > 0;
  std::set<AgentClient*> lost;
  std::set<AgentClient*>* lostIfElastic = elastic ? &lost : nullptr;
  std::vector<std::string> attempts;  // what ended each attempt
  const auto recordParts = [&](const std::vector<Part>& parts) {
    for (const auto& p : parts) recorder.part(p.agent->hello(), p.status);
  };
  // The job first: messages of a job the history does not hold are not kept.
  if (auto parts = findJob(agents, spec.jobId, g.timeout, lostIfElastic)) recordParts(*parts);
  auto nextStatus = Clock::now();
  std::optional<Clock::time_point> failedSince;
  while (true) {
    for (auto& [agent, seq] : lastSeq) {
      if (lost.count(agent)) continue;
      auto batch = agent->fetch(seq, 5000, 100, g.timeout);
      if (!batch) {
        if (!elastic) return fail(batch.error());
        lost.insert(agent);  // the status check below decides what it means for the job
        continue;
      }
      recorder.messages(batch->messages);
      if (!batch->messages.empty()) seq = batch->messages.back().seq;
    }
    if (Clock::now() < nextStatus && g_interrupted.load() == 0) continue;
    nextStatus = Clock::now() + milliseconds(300);
    auto parts = findJob(agents, spec.jobId, g.timeout, lostIfElastic);
    if (!parts) return fail(parts.error());
    recordParts(*parts);
    // A lost agent alone is no failure (it may be a slow answer); its node's peers failing is.
    const bool ended = std::all_of(parts->begin(), parts->end(), [](const Part& p) { return partEnded(p.status); });
    const bool failed = overall(*parts) == JobState::kFailed;
    if (failed && !ended && g_interrupted.load() == 0) {
      // The ranks left see the loss at once and end themselves (exit 3, naming the peer); give
      // them a few seconds, so that their own ends say they survived, then stop the rest.
      if (!failedSince) failedSince = Clock::now();
      if (Clock::now() - *failedSince < std::chrono::seconds(elastic ? 10 : 0)) continue;
      auto stopped = stopEverywhere(agents, spec.jobId, 0, g.timeout, lostIfElastic);
      if (stopped) parts = std::move(stopped);
    }
    if (!(ended || failed || g_interrupted.load() != 0)) continue;
    if (g_interrupted.load() != 0 && !ended) parts = stopEverywhere(agents, spec.jobId, 0, g.timeout, lostIfElastic);
    if (!parts) return fail(parts.error());
    recordParts(*parts);
    drain(lastSeq, recorder, g.timeout);
    failedSince.reset();

    if (failed && elastic && g_interrupted.load() == 0) {
      std::vector<EndedPart> ends;
      for (auto* agent : lost) ends.push_back({agent->hello().nodeName, agent->address().text(), {}, true});
      for (const auto& p : *parts) ends.push_back({p.agent->hello().nodeName, p.agent->address().text(), p.status.ranks});
      const RestartPlan plan = planRestart(spec, ends);
      attempts.push_back("attempt " + std::to_string(spec.attempt) + " with " + std::to_string(spec.worldSize) +
                         " rank" + (spec.worldSize == 1 ? "" : "s") + ": " + plan.lost);
      std::string refusal = plan.refusal;
      if (refusal.empty()) {
        std::vector<AgentClient*> where;
        std::vector<std::uint32_t> counts;
        for (const auto& [node, ranks] : plan.ranksPerNode) {
          for (const auto& p : *parts) {
            if (p.agent->hello().nodeName == node) {
              where.push_back(p.agent);
              counts.push_back(ranks);
              break;
            }
          }
        }
        auto placedAgain = placeJob(where, counts, plan.next, g.timeout);
        Result<void> launched = placedAgain ? validateJobSpec(*placedAgain) : Result<void>(placedAgain.error());
        if (launched) launched = launchJob(where, *placedAgain, g.timeout);
        if (launched) {
          std::printf("job %s: %s; restart %u of %u with %u rank%s from the last checkpoint\n", spec.jobId.c_str(),
                      plan.lost.c_str(), placedAgain->attempt, spec.maxRestarts, placedAgain->worldSize,
                      placedAgain->worldSize == 1 ? "" : "s");
          std::fflush(stdout);
          spec = *placedAgain;
          continue;
        }
        refusal = "the restart did not start: " + launched.error().message;
      }
      attempts.push_back("not restarted: " + refusal);
    }
    recorder.finish();
    printJob(g, spec.jobId, *parts);
    if (!attempts.empty() && !g.json) {
      std::printf("what happened:\n");
      for (const auto& line : attempts) std::printf("  %s\n", line.c_str());
    }
    return exitForState(failed ? JobState::kFailed : overall(*parts));
  }
}

// ---- start ----

int cmdStart(const Globals& g, const std::vector<std::string>& allArgs) {
  std::optional<std::uint32_t> totalRanks, gpusPerAgent;
  std::vector<std::uint32_t> perAgent;
  std::string specFile, jobId;
  bool wait = false;
  std::vector<std::string> jobFlags;
  std::optional<double> gpuHour, coreHour, kwh;  // prices, over a --spec file's
  std::optional<std::string> currency;
  // Everything after `--` is the user's own program and its arguments, run once per rank.
  const auto dashes = std::find(allArgs.begin(), allArgs.end(), "--");
  const std::vector<std::string> args(allArgs.begin(), dashes);
  const std::optional<std::vector<std::string>> command =
      dashes == allArgs.end() ? std::nullopt : std::optional(std::vector<std::string>(dashes + 1, allArgs.end()));
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= args.size()) return std::nullopt;
      return args[++i];
    };
    if (a == "--ranks") {
      auto v = value();
      if (!v) return fail(invalidArgument("--ranks needs a number"));
      totalRanks = static_cast<std::uint32_t>(std::strtoul(v->c_str(), nullptr, 10));
    } else if (a == "--gpus-per-agent") {
      auto v = value();
      char* end = nullptr;
      const unsigned long n = v ? std::strtoul(v->c_str(), &end, 10) : 0;
      if (!v || v->empty() || *end != '\0' || n == 0 || n > 64) {
        return fail(invalidArgument("--gpus-per-agent needs a number of GPUs from 1 to 64"));
      }
      gpusPerAgent = static_cast<std::uint32_t>(n);
    } else if (a == "--ranks-per-agent") {
      auto v = value();
      if (!v) return fail(invalidArgument("--ranks-per-agent needs A,B,..."));
      std::size_t start = 0;
      while (start <= v->size()) {
        const auto comma = v->find(',', start);
        perAgent.push_back(static_cast<std::uint32_t>(std::strtoul(v->substr(start, comma - start).c_str(), nullptr, 10)));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (a == "--spec") {
      auto v = value();
      if (!v) return fail(invalidArgument("--spec needs a file"));
      specFile = *v;
    } else if (a == "--wait") {
      wait = true;
    } else if (a == "--price-gpu-hour" || a == "--price-core-hour" || a == "--price-kwh") {
      auto v = value();
      char* end = nullptr;
      const double price = v ? std::strtod(v->c_str(), &end) : 0;
      if (!v || v->empty() || *end != '\0') return fail(invalidArgument(a + " needs a price, like 2.50"));
      (a == "--price-gpu-hour" ? gpuHour : a == "--price-core-hour" ? coreHour : kwh) = price;
    } else if (a == "--currency") {
      auto v = value();
      if (!v) return fail(invalidArgument("--currency needs a name, like USD"));
      currency = *v;
    } else if (a == "--nproc" || a == "--metrics-out" || a == "--save-weights") {
      return fail(invalidArgument(a + " is for lockstep-trainer run by hand; with agents use --ranks and lockstepctl watch"));
    } else {
      jobFlags.push_back(a);
    }
  }
  if (command && !specFile.empty()) return fail(invalidArgument("give the job as --spec FILE or as -- PROGRAM ARGS, not both"));
  // A flag given as `--flag value` or `--flag=value`.
  const auto given = [&](const std::string& flag) {
    return std::any_of(jobFlags.begin(), jobFlags.end(),
                       [&](const std::string& f) { return f == flag || f.rfind(flag + "=", 0) == 0; });
  };
  if (gpusPerAgent && !given("--backend")) jobFlags.insert(jobFlags.begin(), {"--backend", "cuda"});
  if (specFile.empty() && !given("--job-id")) {
    jobFlags.push_back("--job-id");
    jobFlags.push_back(newJobId());
  }
  JobSpec spec;
  if (command) {
    // A program runs where its user is: this directory, unless --workdir says otherwise.
    if (!given("--workdir")) {
      std::error_code ec;
      jobFlags.push_back("--workdir");
      jobFlags.push_back(fs::current_path(ec).string());
    }
    auto parsed = trainer::parseCommandJobArgs(jobFlags, *command);
    if (!parsed) return fail(parsed.error());
    spec = *parsed;
  } else if (!specFile.empty()) {
    auto text = readFile(specFile, 4u << 20);
    if (!text) return fail(text.error());
    auto parsed = jobSpecFromJson(*text);
    if (!parsed) return fail(parsed.error().withContext(specFile));
    spec = *parsed;
    // Only the id may be given beside the file: any other job flag would be dropped.
    for (std::size_t i = 0; i < jobFlags.size(); ++i) {
      if (jobFlags[i] == "--job-id" && i + 1 < jobFlags.size()) {
        spec.jobId = jobFlags[++i];
      } else if (jobFlags[i].rfind("--job-id=", 0) == 0) {
        spec.jobId = jobFlags[i].substr(9);
      } else {
        return fail(invalidArgument(jobFlags[i] + " goes in the --spec file, not beside it (only --job-id may)"));
      }
    }
  } else {
    auto parsed = trainer::parseTrainerArgs(jobFlags);
    if (!parsed) return fail(parsed.error());
    if (parsed->help) {
      std::fputs(trainer::trainerUsage().c_str(), stdout);
      return kOk;
    }
    spec = parsed->spec;
  }
  spec.prices.gpuHour = gpuHour.value_or(spec.prices.gpuHour);
  spec.prices.coreHour = coreHour.value_or(spec.prices.coreHour);
  spec.prices.kwh = kwh.value_or(spec.prices.kwh);
  spec.prices.currency = currency.value_or(spec.prices.currency);
  auto agents = connectAgents(g);
  if (!agents) return fail(agents.error());
  const std::size_t n = agents->clients.size();
  if (gpusPerAgent) {
    if (totalRanks || !perAgent.empty()) return fail(invalidArgument("--gpus-per-agent goes without --ranks and --ranks-per-agent"));
    if (spec.backend != Backend::kCuda) return fail(invalidArgument("--gpus-per-agent gives each rank a GPU: leave out --backend cpu"));
    perAgent.assign(n, *gpusPerAgent);
  }
  if (perAgent.empty()) {
    const std::uint32_t total = totalRanks.value_or(static_cast<std::uint32_t>(n));
    for (std::size_t a = 0; a < n; ++a) perAgent.push_back(total / n + (a < total % n ? 1 : 0));
  }
  if (perAgent.size() != n) {
    return fail(invalidArgument("--ranks-per-agent gives " + std::to_string(perAgent.size()) + " counts for " +
                                std::to_string(n) + " agents"));
  }
  std::vector<AgentClient*> used;
  std::vector<std::uint32_t> counts;
  for (std::size_t a = 0; a < n; ++a) {
    if (perAgent[a] > 0) {
      used.push_back(agents->clients[a].get());
      counts.push_back(perAgent[a]);
    }
  }
  // Where each agent's stream stood before the job: `--wait` records from there.
  std::map<AgentClient*, std::uint64_t> seqBefore;
  for (auto* agent : used) seqBefore[agent] = agent->hello().lastSeq;
  auto placed = placeJob(used, counts, spec, g.timeout);
  if (!placed) return fail(placed.error());
  if (auto v = validateJobSpec(*placed); !v) return fail(v.error());
  if (auto launched = launchJob(used, *placed, g.timeout); !launched) return fail(launched.error());
  if (g.json) {
    std::printf("%s\n", Json{{"job_id", placed->jobId}, {"world_size", placed->worldSize}}.dump().c_str());
  } else {
    std::string nodes;
    for (auto* agent : used) nodes += (nodes.empty() ? "" : ", ") + agent->hello().nodeName;
    std::printf("started job %s: %u rank%s on %s\n", placed->jobId.c_str(), placed->worldSize,
                placed->worldSize == 1 ? "" : "s", nodes.c_str());
  }
  std::fflush(stdout);
  if (!wait) return kOk;
  std::map<AgentClient*, std::uint64_t> lastSeq;
  for (auto* agent : used) lastSeq[agent] = seqBefore[agent];
  return superviseJob(g, *agents, *placed, lastSeq);
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
