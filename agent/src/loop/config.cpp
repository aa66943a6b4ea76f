#include "loop/config.h"

#include <unistd.h>

#include <charconv>
#include <climits>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <optional>

#include "base/host.h"
#include "lockstep/common/files.h"
#include "lockstep/jobflags/options.h"
#include "lockstep/net/keys.h"
#include "prometheus/page.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

Error usage(const std::string& message) { return invalidArgument(message + " (see lockstep-agent --help)"); }

Result<std::uint32_t> number(const std::string& name, const std::string& text, std::uint32_t lo, std::uint32_t hi) {
  std::uint32_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
    return usage(name + ": '" + text + "' must be a whole number from " + std::to_string(lo) + " to " + std::to_string(hi));
  }
  return v;
}

// measure, off, or GFLOP/s.
Result<void> setCpuPeak(AgentConfig& c, const std::string& value) {
  c.cpuPeakOff = value == "off";
  c.cpuPeakGflops.reset();
  if (value == "measure" || value == "off") return {};
  double gflops = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), gflops);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || !(gflops > 0 && gflops <= 1e6)) {
    return usage("--cpu-peak: '" + value + "' must be measure, off, or one core's GFLOP/s (0 to 1000000)");
  }
  c.cpuPeakGflops = gflops;
  return {};
}

Result<void> set(AgentConfig& c, const std::string& key, const std::string& value) {
  if (key == "listen") {
    c.listen = value;
  } else if (key == "state-dir") {
    c.stateDir = value;
  } else if (key == "name") {
    c.name = value;
  } else if (key == "trainer") {
    c.trainer = value;
  } else if (key == "authorized-keys") {
    c.authorizedKeys = value;
  } else if (key == "sample-hz") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.sampleHz, number("--sample-hz", value, 1, 20));
  } else if (key == "stop-grace-ms") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.stopGraceMs, number("--stop-grace-ms", value, 100, 600000));
  } else if (key == "replay-messages") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.replayMessages, number("--replay-messages", value, 1000, 100000000));
  } else if (key == "nvml-library") {
    c.nvmlLibrary = value;
  } else if (key == "path-check-timeout-ms") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.pathCheckTimeoutMs, number("--path-check-timeout-ms", value, 1, 600000));
  } else if (key == "metrics-listen") {
    LOCKSTEP_TRY(parseMetricsListen(value));
    c.metricsListen = value;
  } else if (key == "announce") {
    c.announce = value;
  } else if (key == "metrics-targets") {
    c.metricsTargets = value;
  } else if (key == "slurm-job") {
    if (value.empty() || value.size() > 32 || value.find_first_not_of("0123456789_") != std::string::npos) {
      return usage("--slurm-job: '" + value + "' is not a Slurm job id");
    }
    c.slurmJob = value;
  } else if (key == "keep-jobs") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.keepJobs, number("--keep-jobs", value, 1, 100000));
  } else if (key == "exit-when-idle-s") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.exitWhenIdleS, number("--exit-when-idle-s", value, 0, 86400 * 365));
  } else if (key == "job-sandbox") {
    if (value != "yes" && value != "no") return usage("--job-sandbox: '" + value + "' must be yes or no");
    c.jobSandbox = value == "yes";
  } else if (key == "job-private-tmp") {
    if (value != "yes" && value != "no") return usage("--job-private-tmp: '" + value + "' must be yes or no");
    c.jobPrivateTmp = value == "yes";
  } else if (key == "alert-rules") {
    c.alertRules = value;
  } else if (key == "notify") {
    c.notify.push_back(value);  // repeatable in the file
  } else if (key == "webhook-timeout-ms") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.webhookTimeoutMs, number("--webhook-timeout-ms", value, 100, 60000));
  } else if (key == "webhook-attempts") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.webhookAttempts, number("--webhook-attempts", value, 1, 20));
  } else if (key == "mem-per-rank") {
    LOCKSTEP_ASSIGN_OR_RETURN(c.memPerRank, jobflags::parseSize("--mem-per-rank", value));
  } else if (key == "cpu-overcommit") {
    if (value != "yes" && value != "no") return usage("--cpu-overcommit: '" + value + "' must be yes or no");
    c.cpuOvercommit = value == "yes";
  } else if (key == "job-fences") {
    if (value != "yes" && value != "no") return usage("--job-fences: '" + value + "' must be yes or no");
    c.jobFences = value == "yes";
  } else if (key == "cpu-peak") {
    LOCKSTEP_TRY(setCpuPeak(c, value));
  } else if (key == "command-jobs") {
    if (value != "yes" && value != "no") return usage("--command-jobs: '" + value + "' must be yes or no");
    c.commandJobs = value == "yes";
  } else {
    return usage("unknown setting '" + key + "'");
  }
  return {};
}

Result<void> readConfigFile(AgentConfig& c, const std::string& path, bool mustExist) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (mustExist) return usage("--config " + path + ": no such file");
    return {};
  }
  return forEachSettingsLine(path, 1u << 20, [&](const std::string& line, int n) -> Result<void> {
    const auto eq = line.find('=');
    if (eq == std::string::npos) return invalidArgument(path + " line " + std::to_string(n) + ": expected key = value");
    std::string key = trim(line.substr(0, eq));
    std::replace(key.begin(), key.end(), '_', '-');
    if (auto r = set(c, key, trim(line.substr(eq + 1))); !r) return r.error().withContext(path + " line " + std::to_string(n));
    return {};
  });
}


}  // namespace

std::string AgentConfig::listenHost() const {
  const std::string rest = listen.substr(listen.find("://") + 3);
  return rest.substr(0, rest.rfind(':'));
}

std::string AgentConfig::authorizedKeysPath() const {
  return authorizedKeys.empty() ? (fs::path(stateDir) / "authorized_keys").string() : authorizedKeys;
}
std::string AgentConfig::logPath() const { return (fs::path(stateDir) / "agent.log").string(); }

Result<AgentConfig> parseAgentArgs(const std::vector<std::string>& args) {
  AgentConfig flags;
  std::map<std::string, std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "--help" || a == "-h") {
      flags.help = true;
      continue;
    }
    if (a == "--version") {
      flags.version = true;
      continue;
    }
    if (a == "--print-key") {
      flags.printKey = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) return usage("unexpected argument '" + a + "'");
    std::string value;
    if (const auto eq = a.find('='); eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    } else {
      if (i + 1 >= args.size()) return usage(a + " needs a value");
      value = args[++i];
    }
    given[a.substr(2)] = value;
  }
  if (flags.help || flags.version) return flags;

  AgentConfig c;
  c.printKey = flags.printKey;
  if (auto it = given.find("state-dir"); it != given.end()) c.stateDir = it->second;
  if (c.stateDir.empty()) c.stateDir = defaultAgentStateDir();
  if (auto it = given.find("config"); it != given.end()) {
    c.configFile = it->second;
    LOCKSTEP_TRY(readConfigFile(c, c.configFile, true));
  } else {
    LOCKSTEP_TRY(readConfigFile(c, (fs::path(c.stateDir) / "agent.conf").string(), false));
  }
  for (const auto& [key, value] : given) {
    if (key != "config") LOCKSTEP_TRY(set(c, key, value));  // flags win over the file
  }
  if (c.listen.rfind("tcp://", 0) != 0 || c.listen.rfind(':') <= 6) {
    return usage("--listen " + c.listen + ": expected tcp://HOST:PORT");
  }
  // Port 0: any free one (an agent started by a Slurm job; --announce says which).
  LOCKSTEP_TRY(number("--listen port", c.listen.substr(c.listen.rfind(':') + 1), 0, 65535));
  if (c.name.empty()) c.name = hostName();
  if (c.name.size() > 255) return usage("--name is longer than 255 characters");
  if (c.trainer.empty()) c.trainer = besideThisProgram("lockstep-trainer");
  // Ranks run in other directories (a command job's working directory): every path they are given
  // (report.sock's endpoint, their logs, the trainer) must not depend on the agent's.
  std::error_code ec;
  c.stateDir = fs::absolute(c.stateDir, ec).lexically_normal().string();
  c.trainer = fs::absolute(c.trainer, ec).lexically_normal().string();
  if (!c.announce.empty()) c.announce = fs::absolute(c.announce, ec).lexically_normal().string();
  if (!c.metricsTargets.empty()) {
    if (c.metricsListen.empty()) return usage("--metrics-targets names where --metrics-listen serves: give --metrics-listen too");
    c.metricsTargets = fs::absolute(c.metricsTargets, ec).lexically_normal().string();
  }
  if (!c.alertRules.empty()) c.alertRules = fs::absolute(c.alertRules, ec).lexically_normal().string();
  if (!c.authorizedKeys.empty()) c.authorizedKeys = fs::absolute(c.authorizedKeys, ec).lexically_normal().string();
  return c;
}

std::string agentUsage() {
  return R"(Usage: lockstep-agent [options]

The Lockstep daemon of one node: it starts and stops training ranks (lockstep-trainer, or a job's
own program, such as a PyTorch DDP script) for authorized clients, samples GPUs (NVML) and rank processes, and streams step reports, samples and
job events to clients. All traffic is encrypted and authenticated with ZeroMQ CURVE: a client may
connect only when its public key is in its authorized keys file (one key and a comment per line).

  --listen tcp://HOST:PORT   where clients connect (default tcp://127.0.0.1:7700; port 0: any free one)
  --state-dir DIR            keys, authorized keys, job table, logs (default $XDG_STATE_HOME/lockstep-agent)
  --name NAME                this node's name in job specs (default: the host name)
  --trainer PATH             the built-in trainer (default: lockstep-trainer beside this program)
  --authorized-keys FILE     the client keys it accepts, re-read when it changes
                             (default STATE/authorized_keys)
  --sample-hz N              GPU and process samples per second, 1 to 20 (default 5)
  --stop-grace-ms N          SIGTERM to SIGKILL when stopping a job (default 10000)
  --replay-messages N        streamed messages kept for clients that reconnect (default 600000)
  --nvml-library SONAME      NVML to load (default libnvidia-ml.so.1)
  --path-check-timeout-ms N  how long the paths a job names may take to check, off the event loop
                             (default 5000; a slow network file system may need more)
  --command-jobs yes|no      whether jobs may run their own program instead of lockstep-trainer
                             (default yes; per key: the no-command-jobs option in authorized keys)
  --job-sandbox yes|no       whether ranks see the state directory (the agent's secret key) as an
                             empty one, through a private mount namespace, and run in a PID
                             namespace of their job's (default yes; docs/security.md)
  --job-private-tmp yes|no   whether each job gets a /tmp and /dev/shm of its own (default yes;
                             with the sandbox; no for an agent with --slurm-job): paths a job
                             names may then not lie there
  --metrics-listen HOST:PORT serve Prometheus metrics (OpenMetrics) at http://HOST:PORT/metrics;
                             off by default, a bare PORT is on 127.0.0.1 (docs/cluster.md)
  --metrics-targets FILE     while serving metrics, name their address in FILE for Prometheus'
                             file-based service discovery (file_sd_configs); removed at exit
  --announce FILE            once listening, write `HOST:PORT PUBLIC-KEY` to FILE (mode 600),
                             for clients to find an agent a Slurm job started (docs/cluster.md)
  --slurm-job ID              the Slurm job this agent runs in (lockstepctl start --slurm sets it):
                             on SIGTERM it stops its jobs with Slurm's reason, and exits once they end
  --keep-jobs N              jobs the agent keeps in its table, with their logs and files: the
                             newest N (default 100); an older ended job is dropped, and its id free
  --exit-when-idle-s N       exit after N seconds with no job running, at least 300 before
                             the first (default 0: never)
  --alert-rules FILE         alert rules every job runs under, one per line (docs/alerts.md)
  --notify URL               where every job's alerts are POSTed as JSON (in the config file:
                             one `notify = URL` line each)
  --webhook-timeout-ms N     how long one POST to a webhook may take (default 5000)
  --webhook-attempts N       tries per alert and webhook, with backoff from 0.5 s (default 5)
  --mem-per-rank SIZE        the memory each rank of a job that names none may use (256M, 4G;
                             default: unbounded); a rank over it is killed (docs/fences.md)
  --cpu-overcommit yes|no    when a job asks for more cores than are free, share the least-held
                             ones instead of refusing it (default no: each rank gets its own)
  --job-fences yes|no        whether jobs are fenced (memory, processes, cores, GPUs; default yes);
                             no gives them the node as before, to measure what fences cost
  --cpu-peak measure|off|GFLOPS
                             one core's fp32 GEMM peak, the ceiling CPU jobs' MFU is taken
                             against (default measure: once, on every core at once, kept in
                             STATE/cpu-peak.json; docs/kpis.md)
  --config FILE              settings as `key = value` lines (default STATE/agent.conf if present)
  --print-key                print this agent's public key (creating its key pair) and exit
  --help, --version

The agent prints its public key when it creates it; pin it on clients with
`lockstepctl trust HOST:PORT KEY`. SIGTERM stops the agent and leaves running jobs alone: a
restarted agent adopts them again.
)";
}

}  // namespace lockstep::agent
