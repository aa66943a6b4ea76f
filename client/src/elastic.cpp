#include "lockstep/client/elastic.h"

#include <algorithm>
#include <map>
#include <set>

#include <csignal>
#include <cstring>

namespace lockstep {

bool rankLost(const RankStatus& r, bool ownProgram) {
  if (r.exitUnknown) return true;
  if (r.state == JobState::kStopped) return false;
  // A program of the user's own says nothing by its exit code: the rank whose end failed the job
  // was lost; the ones its agent then stopped (state stopped, whatever their code) survived.
  if (ownProgram) return r.state == JobState::kFailed;
  if (r.signal) return *r.signal != SIGTERM;
  return r.exitCode && *r.exitCode != 0 && *r.exitCode != 3 && *r.exitCode != 128 + SIGTERM;
}

std::string rankEndText(const RankStatus& r) {
  if (r.exitUnknown) return "its process vanished";
  if (r.signal) return "killed by signal " + std::to_string(*r.signal) + " (" + strsignal(*r.signal) + ")";
  return r.exitCode ? "exited with code " + std::to_string(*r.exitCode) : "ended";
}

RestartPlan planRestart(const JobSpec& spec, const std::vector<EndedPart>& parts) {
  RestartPlan plan;
  std::uint32_t survivors = 0;
  const auto note = [&](const std::string& what) { plan.lost += (plan.lost.empty() ? "" : "; ") + what; };
  for (const auto& p : parts) {
    if (p.agentLost) {
      note("node " + p.node + " (agent " + p.agent + ") stopped answering");
      continue;
    }
    std::uint32_t alive = 0;
    for (const auto& r : p.ranks) {
      if (rankLost(r, spec.isCommand())) {
        note("rank " + std::to_string(r.rank) + " on " + p.node + " " + rankEndText(r));
      } else {
        ++alive;
      }
    }
    if (alive > 0) {
      plan.ranksPerNode.emplace_back(p.node, alive);
      survivors += alive;
    }
  }
  for (const JobState ended : {JobState::kFailed, JobState::kStopped}) {  // a failure's words, else a stop's
    for (const auto& p : parts) {
      if (plan.lost.empty() && !p.agentLost && p.state == ended && !p.message.empty()) plan.lost = p.message;
    }
  }
  if (plan.lost.empty()) plan.lost = "the job failed";

  const std::uint64_t global = spec.globalBatch();
  const std::uint32_t minimum = std::max(1u, spec.minWorldSize);
  const bool stopsOnStall = std::any_of(parts.begin(), parts.end(), [](const EndedPart& p) {
    return !p.agentLost && p.message.rfind(kStallStopMessage, 0) == 0;
  });
  if (stopsOnStall) {
    plan.refusal = "it stalled, and --on-stall stop ends it";
  } else if (spec.maxRestarts == 0) {
    plan.refusal = "the job allows no restarts (--max-restarts)";
  } else if (spec.attempt >= spec.maxRestarts) {
    plan.refusal = "no restarts left (" + std::to_string(spec.maxRestarts) + " allowed)";
  } else if (survivors < minimum) {
    plan.refusal = std::to_string(survivors) + " rank" + (survivors == 1 ? "" : "s") + " left, under the minimum of " +
                   std::to_string(minimum);
  } else if (!spec.isCommand() && global % (std::uint64_t{survivors} * spec.accumSteps) != 0) {
    plan.refusal = "the global batch of " + std::to_string(global) + " does not divide among " +
                   std::to_string(survivors) + " ranks";
  }
  if (!plan.refusal.empty()) return plan;
  plan.next = spec;
  plan.next.attempt = spec.attempt + 1;
  plan.next.restartReason = plan.lost;
  // The program decides its own batch; the trainer keeps the global batch over fewer ranks.
  if (!spec.isCommand()) {
    plan.next.batchPerRank = static_cast<std::uint32_t>(global / (std::uint64_t{survivors} * spec.accumSteps));
  }
  plan.next.ranks.clear();
  plan.next.rendezvousHost.clear();
  plan.next.rendezvousPort = 0;
  return plan;
}

namespace {

// The host of HOST:PORT (an IPv6 literal in brackets keeps them).
std::string hostOf(const std::string& address) {
  const auto colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

// Whether `next`'s ranks are on the nodes and GPUs `ended` had, no more of them on any node.
bool placedWithin(const JobSpec& next, const JobSpec& ended) {
  if (next.ranks.empty() || next.ranks.size() != next.worldSize || next.worldSize > ended.worldSize) return false;
  std::map<std::string, std::uint32_t> room;
  std::set<std::pair<std::string, std::uint32_t>> gpus;
  for (const auto& r : ended.ranks) {
    ++room[r.node];
    if (r.gpuIndex) gpus.insert({r.node, *r.gpuIndex});
  }
  for (const auto& r : next.ranks) {
    if (room[r.node]-- == 0) return false;
    if (r.gpuIndex && !gpus.count({r.node, *r.gpuIndex})) return false;
  }
  return true;
}

}  // namespace

bool isRestartOf(const JobSpec& next, const JobSpec& ended) {
  if (next.attempt != ended.attempt + 1 || next.attempt > ended.maxRestarts) return false;
  if (!placedWithin(next, ended)) return false;
  // The ranks meet at one of the job's own nodes, nowhere else.
  if (!next.rendezvousHost.empty() &&
      std::none_of(ended.agents.begin(), ended.agents.end(),
                   [&](const JobAgent& a) { return hostOf(a.address) == next.rendezvousHost; })) {
    return false;
  }
  JobSpec same = next;
  same.attempt = ended.attempt;
  same.restartReason = ended.restartReason;
  same.batchPerRank = ended.batchPerRank;
  same.worldSize = ended.worldSize;
  same.ranks = ended.ranks;
  same.rendezvousHost = ended.rendezvousHost;
  same.rendezvousPort = ended.rendezvousPort;
  return same == ended;
}

}  // namespace lockstep
