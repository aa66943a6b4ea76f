// lockstepctl: Lockstep without a window. The global options, the usage text and the commands'
// dispatch; each command lives in a ctl_*.cpp of its own (ctl.h). See `lockstepctl --help`.

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "ctl.h"
#include "ctl_flags.h"
#include "lockstep/net/keys.h"
#include "lockstep/present/present.h"

namespace lockstep::ctl {
namespace {

const char* kUsageText = R"(Usage: lockstepctl [--agent HOST:PORT]... [--json] [--timeout-s N] [--config-dir DIR]
                   [--history FILE | --no-history] COMMAND

Commands:
  keygen                       create this client's key pair (once) and print its public key
  trust HOST:PORT KEY          pin an agent's public key (like SSH's known_hosts)
  nodes                        the agents' nodes: cores, memory, GPUs, what is free, the fences
  start [--ranks N | --ranks-per-agent A,B,... | --gpus-per-agent G] [--wait] [PRICES] JOB FLAGS...
                               start a job of the built-in trainer on the agents (JOB FLAGS are
                               lockstep-trainer's, e.g. --layers 784,1024,10 --steps 200 --lr 0.01,
                               or --spec job.json); prints its id.
  start [PLACEMENT] [--wait] [PRICES] [--workdir DIR] [--env NAME=VALUE]... -- PROGRAM ARGS...
                               run your own program (a PyTorch DDP script, any torchrun-style
                               program) once per rank, with torchrun's environment; it runs in
                               this directory unless --workdir says otherwise. Its job flags:
                               --job-id --name --backend cpu|cuda --target-loss --max-restarts
                               --min-ranks --timeout-s --on-stall --stall-after-s
                               (docs/own-program.md)
                               ALERTS, either kind of job: --alert 'RULE' (repeatable), e.g.
                               'exposed_comm > 40% for 2m -> notify'; --notify URL (repeatable;
                               alone: the default rules failed, stalled, restarted, finished);
                               --budget AMOUNT stops the job with a checkpoint (docs/alerts.md)
                               FENCES, either kind of job, what each rank may take of its node:
                               --mem-per-rank SIZE (256M, 4G; killed above it), --cpus-per-rank N
                               (cores of its own; default 1), --max-processes-per-rank N
                               (default 4096); a node without them free refuses (docs/fences.md)
                               PRICES, for the job's cost: --price-gpu-hour X --price-core-hour X
                               --price-kwh X --currency USD
                               --wait follows the job to its end. With --max-restarts N, rank 0's
                               agent restarts it from its last checkpoint when ranks or nodes are
                               lost, with or without a client (status JOB says what happened)
  stop JOB [--grace-ms N]      stop a job everywhere and wait until its ranks are gone
  status [JOB]                 jobs on the agents, or one job's ranks
  watch JOB [--fan-in [--ranks FROM-TO]]
                               live per-rank throughput, loss, communication overhead, CPU/GPU use;
                               --fan-in: from the job's supervising agent alone, which reads every
                               node's stream (a large job: docs/fan-in.md), the rows of ranks 0-63
                               or --ranks and of the slowest; not recorded in history
  logs JOB --rank R [--bytes N]  the end of a rank's log
  stacks JOB [--rank R]        what the job's ranks are doing now: where each is (its progress),
                               its process state, threads, Python stacks or a native backtrace
                               (gdb), and the end of its log (docs/stalls.md)
  alerts [JOB]                 the alerts the agents raised: each rule's firing and resolution,
                               its value, the ranks and nodes it is about, and webhooks that did
                               not take one (docs/alerts.md)

History (start --wait and watch record every job they see; the app records too):
  history [--search TEXT] [--state STATE] [--since YYYY-MM-DD] [--limit N]
                               past and current jobs, newest first, with their final KPIs
  history delete JOB...        remove jobs and everything recorded of them
  history compact              downsample samples older than the raw horizon now
  report JOB [--format csv|json|html|pdf] --out FILE
                               the job's KPI report (format from FILE's extension by default);
                               csv also writes FILE-gpus.csv with the GPU samples
  trace JOB [--from T] [--to T] --out FILE.json[.gz]
                               the job's steps as a Chrome trace (Perfetto, chrome://tracing):
                               a process per rank, its phases, counters; every node on this
                               machine's clock; T: a time into the job (90s, 5m) or
                               YYYY-MM-DDTHH:MM:SS
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

nlohmann::ordered_json jsonFigure(const std::optional<double>& value, double scale) {
  return value && std::isfinite(*value) ? nlohmann::ordered_json(*value * scale) : nlohmann::ordered_json(nullptr);
}

std::string column(const std::string& text, int width) {
  const auto characters = static_cast<int>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
  const std::string pad(static_cast<std::size_t>(std::max(0, std::abs(width) - characters)), ' ');
  return width < 0 ? text + pad : pad + text;
}

std::string timeText(std::int64_t unixUs) {
  if (unixUs == 0) return std::string(present::kUnknown);
  const std::time_t t = static_cast<std::time_t>(unixUs / 1000000);
  char text[32];
  std::tm local{};
  localtime_r(&t, &local);
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S", &local);
  return text;
}

namespace {

using Command = int (*)(const Globals&, const std::vector<std::string>&);
const std::vector<std::pair<std::string, Command>> kCommands = {
    {"keygen", cmdKeygen}, {"trust", cmdTrust},     {"nodes", cmdNodes},     {"start", cmdStart},
    {"stop", cmdStop},     {"status", cmdStatus},   {"watch", cmdWatch},     {"logs", cmdLogs},
    {"stacks", cmdStacks}, {"alerts", cmdAlerts},
    {"history", cmdHistory}, {"report", cmdReport}, {"trace", cmdTrace}, {"compare", cmdCompare},
};

// The global options (before or after the command, never after `--`, where a program's own
// arguments start), and the command with its own arguments in order.
Result<std::pair<std::string, std::vector<std::string>>> splitGlobals(const std::vector<std::string>& args, Globals& g,
                                                                      bool& noHistory, bool& help, bool& version) {
  std::string command;
  std::vector<std::string> rest;
  std::vector<std::string> globals;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string name = a.substr(0, a.find('='));
    if (a == "--") {
      rest.insert(rest.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    // After `start`, --timeout-s is the job's (lockstep-trainer's) flag.
    const bool global = name == "--agent" || name == "--agent-key" || name == "--history" || name == "--config-dir" ||
                        (name == "--timeout-s" && command != "start");
    if (global) {
      globals.push_back(a);
      if (a == name && i + 1 < args.size()) globals.push_back(args[++i]);
    } else if (a == "--json" || a == "--no-history" ||
               (command.empty() && (a == "--help" || a == "-h" || a == "--version"))) {
      globals.push_back(a);
    } else if (command.empty()) {
      command = a;
    } else {
      rest.push_back(a);
    }
  }
  std::uint32_t timeoutS = static_cast<std::uint32_t>(g.timeout.count() / 1000);
  bool shortHelp = false;
  LOCKSTEP_TRY(Flags("see lockstepctl --help")
                   .texts("--agent", &g.agents)
                   .text("--agent-key", &g.agentKey)
                   .text("--history", &g.historyPath)
                   .text("--config-dir", &g.configDir)
                   .whole("--timeout-s", &timeoutS, 1, 86400)
                   .on("--json", &g.json)
                   .on("--no-history", &noHistory)
                   .on("--help", &help)
                   .on("-h", &shortHelp)
                   .on("--version", &version)
                   .parse(globals));
  help = help || shortHelp;
  g.timeout = std::chrono::seconds(timeoutS);
  return std::pair{command, rest};
}

}  // namespace

int run(int argc, char** argv) {
  Globals g;
  g.configDir = defaultClientConfigDir();
  bool noHistory = false, help = false, version = false;
  auto split = splitGlobals(std::vector<std::string>(argv + 1, argv + argc), g, noHistory, help, version);
  if (!split) return fail(split.error());
  const auto& [command, rest] = *split;
  if (help) {
    std::fputs(kUsageText, stdout);
    return kOk;
  }
  if (version) {
    std::printf("lockstepctl %s\n", LOCKSTEP_VERSION);
    return kOk;
  }
  if (!g.agentKey.empty() && g.agents.size() != 1) {
    return fail(invalidArgument("--agent-key goes with exactly one --agent"));
  }
  if (noHistory) {
    g.historyPath.clear();
  } else if (g.historyPath.empty()) {
    g.historyPath = history::History::defaultPath();
  }
  if (command.empty()) {
    std::fputs(kUsageText, stderr);
    return kUsage;
  }
  for (const auto& [name, handler] : kCommands) {
    if (name == command) return handler(g, rest);
  }
  std::fprintf(stderr, "lockstepctl: unknown command '%s' (see lockstepctl --help)\n", command.c_str());
  return kUsage;
}

}  // namespace lockstep::ctl
