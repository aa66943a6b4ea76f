// What lockstepctl's commands share about agents and jobs: connecting, finding a job's parts,
// stopping it everywhere, printing it, draining what the agents still hold.

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

#include "ctl.h"
#include "lockstep/common/clock.h"
#include "lockstep/kpi/stall.h"
#include "lockstep/net/keys.h"
#include "lockstep/protocol/names.h"
#include "lockstep/report/report.h"

namespace lockstep::ctl {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

std::vector<AgentClient*> Connected::all() const {
  std::vector<AgentClient*> out;
  for (const auto& c : clients) out.push_back(c.get());
  return out;
}

Result<CurveKeyPair> ownKeyPair(const Globals& g) {
  auto keys = loadKeyPair(g.configDir, "client");
  if (!keys) return Error{ErrorCode::kPermissionDenied, keys.error().message + " (run `lockstepctl keygen` first)"};
  return keys;
}

Result<Connected> connectAgents(const Globals& g) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto known, KnownAgents::load(knownAgentsPath(g.configDir)));
  std::vector<std::string> addresses = g.agents;
  if (addresses.empty()) {
    for (const auto& [address, key] : known.all()) addresses.push_back(address);
  }
  if (addresses.empty()) {
    return invalidArgument("no agents: name one with --agent HOST:PORT, after pinning its key with "
                           "`lockstepctl trust HOST:PORT KEY`");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const CurveKeyPair keys, ownKeyPair(g));
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
    auto client = AgentClient::connect(address, keys, *pinned, g.timeout);
    if (!client) return client.error();
    out.clients.push_back(std::move(client).value());
  }
  return out;
}


namespace {

// The attempts of `jobId` whose spec findJob holds from `agent`.
std::vector<JobAttempt> heldAttempts(const Connected& agents, AgentClient* agent, const std::string& jobId) {
  std::vector<JobAttempt> held;
  for (auto it = agents.heldSpecs.lower_bound({agent, JobAttempt{jobId, 0}});
       it != agents.heldSpecs.end() && it->first.first == agent && it->first.second.jobId == jobId; ++it) {
    held.push_back(it->first.second);
  }
  return held;
}

// Keeps a whole spec, or puts the held one back into a status that came without it.
Result<void> holdOrFillSpec(const Connected& agents, AgentClient* agent, JobStatus& status) {
  const std::pair key{agent, JobAttempt{status.spec.jobId, status.spec.attempt}};
  if (!status.specOmitted) {
    // Compared with one other agent's spec of the attempt, if any.
    std::shared_ptr<const JobSpec> spec;
    for (const auto& [heldKey, held] : agents.heldSpecs) {
      if (heldKey.second != key.second || heldKey.first == agent) continue;
      if (*held == status.spec) spec = held;
      break;
    }
    agents.heldSpecs.insert_or_assign(key, spec ? spec : std::make_shared<const JobSpec>(status.spec));
    return {};
  }
  const auto held = agents.heldSpecs.find(key);
  if (held == agents.heldSpecs.end()) {
    return Error{ErrorCode::kInternal, agent->address().text() + " left out the spec of job " + status.spec.jobId +
                                           ", attempt " + std::to_string(status.spec.attempt) + ", which lockstepctl did not name"};
  }
  status.spec = *held->second;
  status.specOmitted = false;
  return {};
}

}  // namespace

Result<std::vector<Part>> findJob(const Connected& agents, const std::string& jobId, milliseconds timeout,
                                  std::set<AgentClient*>* lost) {
  std::vector<Part> parts;
  for (auto* agent : agents.all()) {
    if (lost && lost->count(agent)) continue;
    auto jobs = agent->listJobs(timeout, heldAttempts(agents, agent, jobId));
    if (!jobs && lost && (jobs.error().code == ErrorCode::kUnavailable || jobs.error().code == ErrorCode::kTimeout)) {
      lost->insert(agent);
      continue;
    }
    if (!jobs) return jobs.error();
    for (auto& job : jobs->jobs) {
      if (job.spec.jobId != jobId) continue;
      LOCKSTEP_TRY(holdOrFillSpec(agents, agent, job));
      parts.push_back({agent, std::move(job)});
    }
  }
  if (parts.empty()) return Error{ErrorCode::kNotFound, "no agent knows job " + jobId + " (lockstepctl status lists jobs)"};
  return parts;
}

bool partEnded(const JobStatus& s) { return jobStateEnded(s.state); }

bool allPartsEnded(const std::vector<Part>& parts) {
  return std::all_of(parts.begin(), parts.end(), [](const Part& p) { return partEnded(p.status); });
}

// The newest attempt's parts decide: a node an elastic restart left behind keeps its part of the
// earlier attempt, which failed, while the job it was part of finished.
std::uint32_t newestAttempt(const std::vector<Part>& parts) {
  std::uint32_t newest = 0;
  for (const auto& p : parts) newest = std::max(newest, p.status.spec.attempt);
  return newest;
}

namespace {

std::vector<JobState> newestStates(const std::vector<Part>& parts) {
  const std::uint32_t newest = newestAttempt(parts);
  std::vector<JobState> states;
  for (const auto& p : parts) {
    if (p.status.spec.attempt == newest) states.push_back(p.status.state);
  }
  return states;
}

}  // namespace

const Supervision& supervisionOf(const std::vector<Part>& parts) {
  static const Supervision kNone;
  const JobStatus* supervised = supervisingPart(parts);
  return supervised ? supervised->supervision : kNone;
}

JobState overall(const std::vector<Part>& parts) { return jobOutcome(supervisionOf(parts), newestStates(parts)); }

bool jobOver(const std::vector<Part>& parts) { return jobOver(supervisionOf(parts), newestStates(parts)); }

std::string ownerOf(const std::vector<Part>& parts) {
  std::vector<std::string> owners;
  for (const auto& p : parts) owners.push_back(p.status.owner);
  return combinedOwner(owners);
}

int exitForState(JobState s) {
  return s == JobState::kFailed ? kJobFailed : s == JobState::kStopped ? kJobStopped : kOk;
}

Result<std::vector<Part>> stopEverywhere(const Connected& agents, const std::string& jobId, std::uint32_t graceMs,
                                         milliseconds timeout, std::set<AgentClient*>* lost) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto parts, findJob(agents, jobId, timeout, lost));
  std::vector<AgentClient*> asked;
  for (auto& part : parts) {
    if (!partEnded(part.status) || decidesOutcome(part.status.supervision)) asked.push_back(part.agent);
  }
  for (auto& stopped : stopJobOnEach(asked, jobId, graceMs, timeout)) LOCKSTEP_TRY(stopped);
  const auto deadline = Clock::now() + milliseconds(graceMs > 0 ? graceMs : 10000) + std::chrono::seconds(10);
  // Then its supervisor's verdict (overall), at its next poll: a part whose program failed as its
  // peers went must not say that the job failed.
  constexpr auto kVerdictWait = std::chrono::seconds(3);
  std::optional<Clock::time_point> endedAt;
  while (true) {
    LOCKSTEP_ASSIGN_OR_RETURN(parts, findJob(agents, jobId, timeout, lost));
    const bool ended = allPartsEnded(parts);
    if (ended && !endedAt) endedAt = Clock::now();
    if (ended && (jobOver(parts) || Clock::now() - *endedAt > kVerdictWait)) return parts;
    if (!ended && Clock::now() > deadline) return timeoutError("job " + jobId + " still has running ranks after the grace period");
    std::this_thread::sleep_for(milliseconds(200));
  }
}

namespace {

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

}  // namespace

const JobStatus* supervisingPart(const std::vector<Part>& parts) {
  const JobStatus* standby = nullptr;
  for (const auto& p : parts) {
    const SupervisionState s = p.status.supervision.state;
    if (s == SupervisionState::kStandby) standby = &p.status;
    if (s != SupervisionState::kNone && s != SupervisionState::kStandby) return &p.status;
  }
  return standby;  // the first agent did not answer: the one that takes over
}

std::optional<Stall> stallOf(const std::vector<Part>& parts) {
  std::vector<const JobStatus*> statuses;
  for (const auto& p : parts) statuses.push_back(&p.status);
  return kpi::jobStall(statuses);
}

std::string stallText(const Stall& stall) {
  const auto seconds = std::max<std::int64_t>(0, (unixMicrosNow() - stall.sinceUnixUs) / 1'000'000);
  return "stalled " + std::to_string(seconds) + " s: " + stall.message;
}

namespace {

const RankProgress* progressOf(const Part& part, std::uint32_t rank) {
  for (const auto& p : part.status.progress) {
    if (p.rank == rank) return &p;
  }
  return nullptr;
}

// Where a running rank is, for status: "data of step 15, still 43 s".
std::string whereText(const Part& part, const RankStatus& r) {
  const RankProgress* p = progressOf(part, r.rank);
  if (r.state != JobState::kRunning || !p) return "";
  if (!p->recorded) return "no progress record";
  return kpi::whereIs(*p) + (p->stillMs >= 2000 ? ", still " + std::to_string(p->stillMs / 1000) + " s" : "");
}

}  // namespace

int printJob(const Globals& g, const std::string& jobId, const std::vector<Part>& parts) {
  const JobState state = overall(parts);
  const auto stall = stallOf(parts);
  const JobStatus* supervised = supervisingPart(parts);
  const Supervision* supervision = supervised ? &supervised->supervision : nullptr;
  std::string message;
  const std::uint32_t newest = newestAttempt(parts);
  // The failed parts' words first: a part another node stopped because of them says only that.
  for (const bool failed : {true, false}) {
    for (const auto& p : parts) {
      if (p.status.spec.attempt != newest || (p.status.state == JobState::kFailed) != failed) continue;
      if (!p.status.message.empty() && message.find(p.status.message) == std::string::npos) {
        message += (message.empty() ? "" : "; ") + p.status.message;
      }
    }
  }
  if (g.json) {
    Json ranks = Json::array();
    for (const auto& p : parts)
      for (const auto& r : p.status.ranks) {
        Json rank = rankJson(p, r);
        if (const RankProgress* progress = progressOf(p, r.rank)) {
          rank["progress"] = Json{{"recorded", progress->recorded}, {"reports_steps", progress->reportsSteps},
                                  {"step", progress->step}, {"phase", progress->phase},
                                  {"in_collective", progress->inCollective}, {"collectives", progress->collectives},
                                  {"still_ms", progress->stillMs}, {"allowance_ms", progress->allowanceMs},
                                  {"where", kpi::whereIs(*progress)}, {"process_state", progress->processState}};
        }
        ranks.push_back(std::move(rank));
      }
    const Prices& prices = parts.front().status.spec.prices;
    const Json pricesJson{{"gpu_hour", prices.gpuHour}, {"core_hour", prices.coreHour}, {"kwh", prices.kwh},
                          {"currency", prices.currency}};
    Json out{{"job_id", jobId}, {"state", std::string(jobStateName(state))}, {"restarting", restarting(supervisionOf(parts))},
             {"message", message},
             {"owner", ownerOf(parts)},
             {"world_size", parts.front().status.spec.worldSize}, {"prices", pricesJson}, {"ranks", ranks}};
    if (const auto& slurmJob = parts.front().status.spec.slurmJobId; !slurmJob.empty()) out["slurm_job_id"] = slurmJob;
    if (const auto& command = parts.front().status.spec.command) {
      out["command"] = command->argv;
      out["working_dir"] = command->workingDir;
    }
    if (stall) {
      out["stall"] = Json{{"since_unix_us", stall->sinceUnixUs}, {"message", stall->message}, {"ranks", stall->ranks}};
    }
    if (supervision) {
      out["supervision"] = Json{{"state", std::string(nameOf(supervision->state))},
                                {"message", supervision->message},
                                {"attempts", supervision->attempts}};
    }
    std::printf("%s\n", out.dump().c_str());
    return kOk;
  }
  std::printf("job %s: %s%s%s\n", jobId.c_str(), std::string(jobStateWord(supervisionOf(parts), state)).c_str(),
              message.empty() ? "" : ": ", message.c_str());
  if (stall) std::printf("%s\n", stallText(*stall).c_str());
  if (const std::string owner = ownerOf(parts); !owner.empty()) std::printf("runs as %s\n", owner.c_str());
  if (const auto& slurmJob = parts.front().status.spec.slurmJobId; !slurmJob.empty()) {
    std::printf("in Slurm job %s\n", slurmJob.c_str());
  }
  if (const auto& command = parts.front().status.spec.command) {
    std::printf("runs %s in %s\n", report::commandLine(command->argv).c_str(),
                command->workingDir.empty() ? "the agent's job directory" : command->workingDir.c_str());
  }
  std::printf("%-6s %-16s %-8s %-10s %-14s %s\n", "RANK", "NODE", "PID", "STATE", "EXIT", "WHERE");
  std::vector<std::pair<std::uint32_t, std::string>> rows;
  for (const auto& p : parts) {
    for (const auto& r : p.status.ranks) {
      char line[256];
      std::snprintf(line, sizeof line, "%-6u %-16s %-8u %-10s %-14s %s", r.rank, p.agent->hello().nodeName.c_str(), r.pid,
                    std::string(jobStateName(r.state)).c_str(), rankExitText(r).c_str(), whereText(p, r).c_str());
      rows.emplace_back(r.rank, line);
    }
  }
  std::sort(rows.begin(), rows.end());
  for (const auto& [rank, line] : rows) std::printf("%s\n", line.c_str());
  if (supervision && !supervision->attempts.empty()) {
    std::printf("what happened:\n");
    for (const auto& line : supervision->attempts) std::printf("  %s\n", line.c_str());
  }
  return kOk;
}

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

}  // namespace lockstep::ctl
