// lockstepctl nodes, status, stop and logs: what the agents run, and a job's ranks.

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "ctl.h"
#include "ctl_flags.h"
#include "lockstep/kpi/stall.h"
#include "lockstep/present/present.h"

namespace lockstep::ctl {
namespace {

using Json = nlohmann::ordered_json;

std::string gib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1u << 30));
  return text;
}

}  // namespace

int cmdNodes(const Globals& g, const std::vector<std::string>& args) {
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl nodes").parse(args));
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
                   {"gpus", gpus}, {"gpu_status", h.gpuStatus}, {"sample_hz", h.sampleHz},
                   {"free_cores", h.freeCores}, {"free_memory_bytes", h.freeMemoryBytes}, {"fences_off", h.fencesOff},
                   {"cpu_core_peak_flops", h.cpuCorePeakFlops ? Json(*h.cpuCorePeakFlops) : Json(nullptr)},
                   {"cpu_peak_basis", h.cpuPeakBasis}});
    if (g.json) continue;
    const std::string free = h.freeMemoryBytes > 0 || h.memoryTotalBytes == 0
                                 ? std::to_string(h.freeCores) + " cores, " + gib(h.freeMemoryBytes)
                                 : "not said (an agent from before fences)";
    std::printf("%s  node %s (host %s, agent %s): %u cores, %s memory; free: %s\n", agent->address().text().c_str(),
                h.nodeName.c_str(), h.host.c_str(), h.agentVersion.c_str(), h.cpuCores, gib(h.memoryTotalBytes).c_str(),
                free.c_str());
    for (const auto& off : h.fencesOff) std::printf("  fence off, %s\n", off.c_str());
    if (h.cpuCorePeakFlops) {
      std::printf("  CPU peak %s per core (%s)\n", present::flopsRate(h.cpuCorePeakFlops).c_str(), h.cpuPeakBasis.c_str());
    } else if (!h.cpuPeakBasis.empty()) {
      std::printf("  CPU peak unknown: %s\n", h.cpuPeakBasis.c_str());
    }
    for (const auto& gpu : h.gpus) {
      std::printf("  GPU %u  %s  %s  %s\n", gpu.index, gpu.name.c_str(), gib(gpu.memoryTotalBytes).c_str(), gpu.uuid.c_str());
    }
    if (h.gpus.empty()) std::printf("  no GPUs%s%s\n", h.gpuStatus.empty() ? "" : ": ", h.gpuStatus.c_str());
  }
  if (g.json) std::printf("%s\n", all.dump().c_str());
  return kOk;
}

int cmdStatus(const Globals& g, const std::vector<std::string>& argv) {
  std::vector<std::string> args;
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl status [JOB]").arguments(&args, 0, 1).parse(argv));
  auto agents = args.empty() ? connectAgents(g) : connectAgentsFor(g, args[0]);
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
  if (!g.json) {
    std::printf("%-32s %-10s %-12s %-6s %-20s %-20s %s\n", "JOB", "STATE", "OWNER", "RANKS", "STARTED", "ENDED", "MESSAGE");
  }
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
    const auto stall = stallOf(parts);
    if (stall && message.empty()) {
      const std::string text = stallText(*stall);
      message = text.substr(0, text.find('\n'));  // its first line
    }
    const JobState state = overall(parts);
    const Supervision& supervision = supervisionOf(parts);
    if (g.json) {
      all.push_back({{"job_id", id}, {"state", std::string(jobStateName(state))}, {"restarting", restarting(supervision)},
                     {"owner", ownerOf(parts)}, {"ranks", ranks}, {"ranks_running", running},
                     {"started_unix_us", started}, {"ended_unix_us", ended}, {"message", message},
                     {"stalled", stall.has_value()}});
    } else {
      std::printf("%-32s %-10s %-12s %-6s %s %s %s\n", id.c_str(), std::string(jobStateWord(supervision, state)).c_str(),
                  ownerOf(parts).c_str(),
                  (std::to_string(running) + "/" + std::to_string(ranks)).c_str(), column(timeText(started), -20).c_str(),
                  column(timeText(ended), -20).c_str(), message.c_str());
    }
  }
  if (g.json) std::printf("%s\n", all.dump().c_str());
  return kOk;
}

int cmdStop(const Globals& g, const std::vector<std::string>& args) {
  std::vector<std::string> job;
  std::uint32_t graceMs = 0;
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl stop JOB [--grace-ms N]")
                           .whole("--grace-ms", &graceMs, 0, 3'600'000)
                           .arguments(&job, 1)
                           .parse(args));
  const std::string& jobId = job[0];
  auto agents = connectAgentsFor(g, jobId);
  if (!agents) return fail(agents.error());
  auto parts = stopEverywhere(*agents, jobId, graceMs, g.timeout);
  if (!parts) return fail(parts.error());
  endSlurmJob(g, jobId);
  printJob(g, jobId, *parts);
  return kOk;
}

int cmdLogs(const Globals& g, const std::vector<std::string>& args) {
  std::vector<std::string> job;
  std::optional<std::uint32_t> rank;
  std::uint32_t bytes = 0;
  const char* usage = "usage: lockstepctl logs JOB --rank R [--bytes N]";
  LOCKSTEP_TRY_OR_FAIL(Flags(usage)
                           .whole("--rank", &rank, 0, 1u << 20)
                           .whole("--bytes", &bytes, 0, 64u << 20)
                           .arguments(&job, 1)
                           .parse(args));
  if (!rank) return fail(invalidArgument(std::string("--rank is missing; ") + usage));
  const std::string& jobId = job[0];
  auto agents = connectAgentsFor(g, jobId);
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

int cmdStacks(const Globals& g, const std::vector<std::string>& args) {
  std::vector<std::string> job;
  std::optional<std::uint32_t> rank;
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl stacks JOB [--rank R]").whole("--rank", &rank, 0, 1u << 20).arguments(&job, 1).parse(args));
  const std::string& jobId = job[0];
  auto agents = connectAgentsFor(g, jobId);
  if (!agents) return fail(agents.error());
  auto parts = findJob(*agents, jobId, g.timeout);
  if (!parts) return fail(parts.error());
  std::vector<RankEvidence> all;
  for (const auto& p : *parts) {
    const bool here = std::any_of(p.status.ranks.begin(), p.status.ranks.end(), [&](const RankStatus& r) {
      return r.state == JobState::kRunning && (!rank || r.rank == *rank);
    });
    if (!here) continue;
    // Taking stacks waits for them (up to about 45 s on a node): a minute, or the user's longer timeout.
    auto taken = p.agent->stacks(jobId, rank, std::max(g.timeout, std::chrono::milliseconds(60000)));
    if (!taken) return fail(taken.error());
    all.insert(all.end(), taken->ranks.begin(), taken->ranks.end());
  }
  if (all.empty()) {
    return fail(notFound("job " + jobId + (rank ? " has no running rank " + std::to_string(*rank) : " has no running ranks") +
                         " (lockstepctl status " + jobId + " says where they are)"));
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  if (g.json) {
    Json out = Json::array();
    for (const auto& e : all) {
      Json rankJson{{"rank", e.rank}, {"pid", e.pid}, {"node", e.node}, {"time_unix_us", e.timeUnixUs},
                    {"where", kpi::whereIs(e.progress)}, {"still_ms", e.progress.stillMs},
                    {"process_state", e.processState}, {"threads", e.threads}, {"python_stacks", e.pythonStacks},
                    {"native_backtrace", e.nativeBacktrace}, {"log_tail", e.logTail}, {"note", e.note}};
      rankJson["cpu_moving"] = e.cpuMoving ? Json(*e.cpuMoving) : Json(nullptr);
      out.push_back(std::move(rankJson));
    }
    std::printf("%s\n", Json{{"job_id", jobId}, {"ranks", out}}.dump().c_str());
    return kOk;
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::printf("%s%s", i > 0 ? "\n" : "", kpi::evidenceText(all[i]).c_str());
  }
  return kOk;
}

}  // namespace lockstep::ctl
