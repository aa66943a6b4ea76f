// lockstepctl start: place a job on the agents, launch it, and with --wait follow it to its end.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>

#include "ctl.h"
#include "lockstep/client/supervisor.h"
#include "ctl_flags.h"
#include "lockstep/client/launch.h"
#include "lockstep/common/files.h"
#include "lockstep/jobflags/options.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/validate.h"

namespace lockstep::ctl {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

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

// ---- following a started job (start --wait) ----

// Follows a started job to its end, recording it in the history. The job's supervising agent stops
// a failed job's other parts and restarts it with the ranks left (client/supervisor.h); this
// prints each restart it sees, and ends when the supervision ends (or, unsupervised, the parts).
int followJob(const Globals& g, const Connected& agents, const JobSpec& spec, std::map<AgentClient*, std::uint64_t> lastSeq) {
  Recorder recorder(g);
  std::set<AgentClient*> lost;  // a lost node is the supervisor's to handle, not an error here
  const auto recordParts = [&](const std::vector<Part>& parts) {
    for (const auto& p : parts) {
      recorder.part(p.agent->hello(), p.status);
      recorder.clock(*p.agent);
    }
  };
  // The job first: messages of a job the history does not hold are not kept.
  if (auto parts = findJob(agents, spec.jobId, g.timeout, &lost)) recordParts(*parts);
  std::uint32_t attempt = spec.attempt;
  bool stopAsked = false;
  auto nextStatus = Clock::now();
  while (true) {
    for (auto& [agent, seq] : lastSeq) {
      if (lost.count(agent)) continue;
      auto batch = agent->fetch(seq, 5000, 100, g.timeout);
      if (!batch) {
        lost.insert(agent);
        continue;
      }
      recorder.messages(batch->messages);
      if (!batch->messages.empty()) seq = batch->messages.back().seq;
    }
    const bool interrupted = g_interrupted.load() != 0;
    if (Clock::now() < nextStatus && !interrupted) continue;
    nextStatus = Clock::now() + milliseconds(300);
    auto parts = findJob(agents, spec.jobId, g.timeout, &lost);
    if (!parts) return fail(withSlurmState(g, spec.slurmJobId, parts.error()));
    recordParts(*parts);
    if (interrupted && !stopAsked) {
      stopAsked = true;
      if (auto stopped = stopEverywhere(agents, spec.jobId, 0, g.timeout, &lost); !stopped) return fail(stopped.error());
      continue;
    }
    bool restarted = false;
    for (const auto& p : *parts) {
      const JobSpec& s = p.status.spec;
      if (s.attempt <= attempt) continue;
      attempt = s.attempt;
      restarted = true;
      std::printf("job %s: %s; restart %u of %u with %u rank%s from the last checkpoint\n", spec.jobId.c_str(),
                  s.restartReason.c_str(), s.attempt, s.maxRestarts, s.worldSize, s.worldSize == 1 ? "" : "s");
      std::fflush(stdout);
    }
    // A restart that raced the stop (it reached a node before the stop did) is stopped too.
    if (stopAsked && restarted) {
      if (auto stopped = stopEverywhere(agents, spec.jobId, 0, g.timeout, &lost); !stopped) return fail(stopped.error());
      continue;
    }
    // After a stop, stopEverywhere waited for the verdict as long as it is worth waiting.
    if (!jobOver(*parts) && !(stopAsked && allPartsEnded(*parts))) continue;
    const JobStatus* supervised = supervisingPart(*parts);
    drain(lastSeq, recorder, g.timeout);
    recorder.finish();
    if (!supervised && !g.json) {
      const JobAgent* supervisor = supervisorOf(spec);
      for (auto* agent : lost) {
        if (supervisor && agent->hello().nodeName == supervisor->node) {
          std::printf("job %s: its supervising agent, node %s's, stopped answering: nothing restarts it\n",
                      spec.jobId.c_str(), supervisor->node.c_str());
        }
      }
    }
    if (stopAsked) endSlurmJob(g, spec.jobId);
    printJob(g, spec.jobId, *parts);
    return exitForState(overall(*parts));
  }
}

Result<void> checkSlurmFlags(const Globals& g, SlurmStart& slurm, std::optional<std::uint32_t> nodes,
                             std::optional<std::uint32_t> gpusPerNode, bool ranksGiven,
                             std::optional<std::uint32_t>& gpusPerAgent) {
  const slurm::Allocation& a = slurm.allocation;
  if (!slurm.on) {
    if (nodes || gpusPerNode || a.cpusPerNode || !a.time.empty() || !a.partition.empty() || !a.account.empty() ||
        !slurm.logsDir.empty()) {
      return invalidArgument("--nodes, --gpus-per-node, --cpus-per-node, --time, --partition, --account and --slurm-logs go with --slurm");
    }
    return {};
  }
  if (!g.agents.empty()) return invalidArgument("--slurm starts the job's own agents: leave out --agent");
  if (!slurm.logsDir.empty()) {
    std::error_code ec;
    slurm.logsDir = std::filesystem::absolute(slurm.logsDir, ec).lexically_normal().string();
  }
  if (gpusPerAgent) return invalidArgument("with --slurm, give --gpus-per-node instead of --gpus-per-agent");
  slurm.allocation.nodes = nodes.value_or(1);
  slurm.allocation.gpusPerNode = gpusPerNode.value_or(0);
  // One rank per allocated GPU, unless --ranks or --ranks-per-agent say how many.
  if (!ranksGiven) gpusPerAgent = gpusPerNode;
  return {};
}

// Places the job on the agents, launches it, and with --wait follows it.
int launchOn(const Globals& g, const Connected& agents, JobSpec& spec, std::optional<std::uint32_t> totalRanks,
             std::optional<std::uint32_t> gpusPerAgent, std::vector<std::uint32_t> perAgent, bool wait) {
  const std::size_t n = agents.clients.size();
  if (gpusPerAgent) {
    if (totalRanks || !perAgent.empty()) return fail(invalidArgument("--gpus-per-agent goes without --ranks and --ranks-per-agent"));
    if (spec.backend != Backend::kCuda) return fail(invalidArgument("--gpus-per-agent gives each rank a GPU: leave out --backend cpu"));
    perAgent.assign(n, *gpusPerAgent);
  }
  if (perAgent.empty()) {
    const std::uint32_t total = totalRanks.value_or(static_cast<std::uint32_t>(n));
    perAgent = spreadRanks(total, n);
  }
  if (perAgent.size() != n) {
    return fail(invalidArgument("--ranks-per-agent gives " + std::to_string(perAgent.size()) + " counts for " +
                                std::to_string(n) + " agents"));
  }
  std::vector<AgentClient*> used;
  std::vector<std::uint32_t> counts;
  for (std::size_t a = 0; a < n; ++a) {
    if (perAgent[a] > 0) {
      used.push_back(agents.clients[a].get());
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
  return followJob(g, agents, *placed, lastSeq);
}

}  // namespace

// ---- start ----

int cmdStart(const Globals& g, const std::vector<std::string>& allArgs) {
  std::optional<std::uint32_t> totalRanks, gpusPerAgent;
  std::vector<std::uint32_t> perAgent;
  std::string specFile, jobId;
  bool wait = false;
  std::vector<std::string> jobFlags;
  std::optional<double> gpuHour, coreHour, kwh;  // prices, over a --spec file's
  std::optional<std::string> currency;
  SlurmStart slurm;
  std::optional<std::uint32_t> nodes, gpusPerNode;
  // Everything after `--` is the user's own program and its arguments, run once per rank.
  const auto dashes = std::find(allArgs.begin(), allArgs.end(), "--");
  const std::vector<std::string> args(allArgs.begin(), dashes);
  const std::optional<std::vector<std::string>> command =
      dashes == allArgs.end() ? std::nullopt : std::optional(std::vector<std::string>(dashes + 1, allArgs.end()));
  LOCKSTEP_TRY_OR_FAIL(Flags("see lockstepctl --help")
                           .whole("--ranks", &totalRanks, 1, 1u << 20)
                           .whole("--gpus-per-agent", &gpusPerAgent, 1, 64)
                           .wholes("--ranks-per-agent", &perAgent, 0, 1u << 20)
                           .text("--spec", &specFile)
                           .on("--wait", &wait)
                           .price("--price-gpu-hour", &gpuHour)
                           .price("--price-core-hour", &coreHour)
                           .price("--price-kwh", &kwh)
                           .text("--currency", &currency)
                           .on("--slurm", &slurm.on)
                           .whole("--nodes", &nodes, 1, 4096)
                           .whole("--gpus-per-node", &gpusPerNode, 1, 64)
                           .whole("--cpus-per-node", &slurm.allocation.cpusPerNode, 1, 4096)
                           .text("--time", &slurm.allocation.time)
                           .text("--partition", &slurm.allocation.partition)
                           .text("--account", &slurm.allocation.account)
                           .whole("--slurm-linger-s", &slurm.lingerS, 1, 3600)
                           .whole("--slurm-wait-s", &slurm.waitS, 1, 7 * 86400)
                           .text("--slurm-logs", &slurm.logsDir)
                           .passOn(&jobFlags)
                           .parse(args));
  if (command && !specFile.empty()) return fail(invalidArgument("give the job as --spec FILE or as -- PROGRAM ARGS, not both"));
  if (auto checked = checkSlurmFlags(g, slurm, nodes, gpusPerNode, totalRanks || !perAgent.empty(), gpusPerAgent); !checked) return fail(checked.error());
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
    auto parsed = jobflags::parseCommandJobArgs(jobFlags, *command);
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
    auto parsed = jobflags::parseJobArgs(jobFlags);
    if (!parsed) return fail(parsed.error());
    if (parsed->help) {
      std::fputs(jobflags::trainerUsage().c_str(), stdout);
      return kOk;
    }
    spec = parsed->spec;
  }
  spec.prices.gpuHour = gpuHour.value_or(spec.prices.gpuHour);
  spec.prices.coreHour = coreHour.value_or(spec.prices.coreHour);
  spec.prices.kwh = kwh.value_or(spec.prices.kwh);
  spec.prices.currency = currency.value_or(spec.prices.currency);
  const std::string where =
      g.historyPath == history::History::defaultPath() ? "" : " --history '" + g.historyPath + "'";
  if (auto free = history::checkNewJobId(g.historyPath, spec.jobId, "lockstepctl" + where + " history delete " + spec.jobId);
      !free) {
    return fail(free.error());
  }
  auto agents = slurm.on ? startSlurmAgents(g, slurm, spec) : connectAgents(g);
  if (!agents) return fail(agents.error());
  const int started = launchOn(g, *agents, spec, totalRanks, gpusPerAgent, perAgent, wait);
  // A job that did not launch leaves no allocation behind.
  if (slurm.on && started != kOk && started != kJobFailed && started != kJobStopped) endSlurmJob(g, spec.jobId);
  return started;
}

}  // namespace lockstep::ctl
