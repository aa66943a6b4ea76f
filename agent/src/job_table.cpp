// The job table on disk (jobs.json in the state directory, written on every change) and what a
// restarted agent makes of it: the jobs it re-adopts, and their ranks found again by their
// environment.

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "job.h"
#include "job_cgroup.h"
#include "lockstep/common/clock.h"
#include "lockstep/protocol/codec.h"
#include "rank_processes.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

}  // namespace

void JobManager::persist() {
  // Keep the newest finished jobs only.
  while (order_.size() > options_.keepFinishedJobs) {
    const auto oldest = std::find_if(order_.begin(), order_.end(), [&](const std::string& id) {
      return !jobs_.at(id)->running() && !jobs_.at(id)->anyRankRunning();
    });
    if (oldest == order_.end()) break;
    std::error_code ec;
    fs::remove_all(jobs_.at(*oldest)->dir, ec);
    fs::remove(launcherPath(*oldest), ec);
    jobs_.erase(*oldest);
    order_.erase(oldest);
  }
  Json table = Json::array();
  for (const auto& id : order_) {
    const Job& job = *jobs_.at(id);
    Json ranks = Json::array();
    for (const auto& r : job.ranks) {
      Json rank = {{"rank", r.placement.rank},       {"local_rank", r.placement.localRank},
                   {"pid", r.pid},                    {"program_pid", r.programPid},
                   {"start_ticks", r.startTicks},
                   {"state", static_cast<int>(r.state)}, {"exit_unknown", r.exitUnknown},
                   {"last_step", r.lastStep}};
      if (r.placement.gpuIndex) rank["gpu"] = *r.placement.gpuIndex;
      if (r.exit) rank["exit"] = {r.exit->exitCode, r.exit->signal};
      ranks.push_back(rank);
    }
    table.push_back({{"spec", Json::parse(jobSpecToJson(job.spec))},
                     {"state", static_cast<int>(job.state)},
                     {"started_unix_us", job.startedUnixUs},
                     {"ended_unix_us", job.endedUnixUs},
                     {"message", job.message},
                     {"owner", job.owner.user},
                     {"store_port", job.storePort},
                     {"master_port", job.masterPort},
                     {"store_secret", job.storeSecret},
                     {"stop_requested", job.stopRequested},
                     {"ranks", ranks}});
  }
  // A failed write is not fatal for running jobs; the next change tries again.
  if (auto written = writeFileAtomic((fs::path(options_.stateDir) / "jobs.json").string(), table.dump(1)); !written) {
    std::fprintf(stderr, "lockstep-agent: cannot save the job table: %s\n", written.error().message.c_str());
  }
}

void JobManager::adoptUnrecordedRanks(Job& job) {
  // The agent stopped between recording the job and answering its start: the ranks it spawned are
  // found by their environment; if one was never spawned the job cannot run, and fails.
  bool all = true;
  for (auto& r : job.ranks) {
    if (r.state != JobState::kStarting) continue;
    r.child = false;
    const FoundRank found = findRankProcess(job.spec, r.placement.rank);
    r.pid = found.keeper;
    r.programPid = found.program;
    const auto stat = r.pid > 0 ? readProcStat(r.pid) : std::nullopt;
    if (stat) {
      r.startTicks = stat->startTicks;
      r.pidfd = UniqueFd(pidfdOpen(r.pid));
      r.state = JobState::kRunning;
    } else {
      r.state = JobState::kFailed;
      r.exitUnknown = true;
      all = false;
    }
  }
  if (job.state != JobState::kStarting) return;
  job.startedUnixUs = unixMicrosNow();
  if (all) {
    job.state = JobState::kRunning;
    emit_(event(job, JobEventKind::kStarted, "started on " + options_.node.name + "; the agent stopped before it "
                                             "answered, and adopted the ranks when it started again"));
    return;
  }
  job.state = JobState::kFailed;
  job.message = "the agent on " + options_.node.name + " stopped while starting the job, before every rank was started";
  emit_(event(job, JobEventKind::kFailed, job.message));
  signalRanks(job, SIGTERM);
  job.killAt = Clock::now() + options_.defaultStopGrace;
}

// The last step `rank` wrote to the job's metrics file (its last 1 MiB: every rank's final lines).
std::uint64_t JobManager::lastStepInMetrics(const Job& job, std::uint32_t rank) const {
  std::istringstream lines(fileTail((fs::path(job.dir) / "metrics.jsonl").string(), 1u << 20, nullptr));
  std::uint64_t last = 0;
  for (std::string line; std::getline(lines, line);) {
    const Json j = Json::parse(line, nullptr, false);  // the first line may be cut
    if (j.is_object() && j.value("rank", -1) == static_cast<int>(rank) && j.contains("step") && j["step"].is_number_unsigned()) {
      last = std::max(last, j["step"].get<std::uint64_t>());
    }
  }
  return last;
}

// How an adopted rank ended, as its keeper wrote it; nullopt when the keeper did not (it was
// killed, or the rank was never kept).
std::optional<ExitStatus> JobManager::exitRecorded(const Job& job, std::uint32_t rank) const {
  const std::string path = rankExitPath(job.dir, rank);
  UniqueFd fd = openJobFile(path, O_RDONLY);
  if (!fd.valid()) return std::nullopt;
  auto text = readOpenFile(fd.get(), path, 64);
  return text ? ExitStatus::fromRecord(*text) : std::nullopt;
}

Result<void> JobManager::restore() {
  const std::string path = (fs::path(options_.stateDir) / "jobs.json").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(auto text, readFile(path, 256u << 20));
  const Json table = Json::parse(text, nullptr, false);
  const std::string agentUser = currentIdentity().user;
  if (!table.is_array()) return invalidArgument(path + " is damaged (not a JSON array); move it away to start afresh");
  try {
    for (const auto& entry : table) {
      auto job = std::make_unique<Job>();
      LOCKSTEP_ASSIGN_OR_RETURN(job->spec, jobSpecFromJson(entry.at("spec").dump()));
      job->state = static_cast<JobState>(entry.at("state").get<int>());
      job->startedUnixUs = entry.at("started_unix_us").get<std::int64_t>();
      job->endedUnixUs = entry.at("ended_unix_us").get<std::int64_t>();
      job->message = entry.at("message").get<std::string>();
      job->owner.user = entry.value("owner", agentUser);  // a table from before owners: the agent's
      // Paths come from the (validated) job id, not from the file: a job table edited to name
      // other files must not make the agent trim or serve them.
      job->dir = jobDir(job->spec.jobId);
      if (!options_.cgroupBase.empty()) {
        job->cgroup = cgroupOf(job->spec);  // ended with the job, as the restarted agent sees it end
        if (!fs::exists(job->cgroup, ec)) job->cgroup.clear();
      }
      job->storePort = entry.at("store_port").get<std::uint32_t>();
      job->masterPort = entry.value("master_port", 0u);
      job->storeSecret = entry.value("store_secret", std::string());
      if (!isValidStoreSecret(job->storeSecret)) job->storeSecret.clear();
      job->stopRequested = entry.at("stop_requested").get<bool>();
      for (const auto& rj : entry.at("ranks")) {
        Rank r;
        r.placement = {rj.at("rank").get<std::uint32_t>(), options_.node.name, rj.at("local_rank").get<std::uint32_t>(),
                       std::nullopt};
        if (rj.contains("gpu")) r.placement.gpuIndex = rj.at("gpu").get<std::uint32_t>();
        r.pid = rj.at("pid").get<pid_t>();
        r.programPid = rj.value("program_pid", r.pid);
        r.startTicks = rj.at("start_ticks").get<std::uint64_t>();
        r.state = static_cast<JobState>(rj.at("state").get<int>());
        r.exitUnknown = rj.at("exit_unknown").get<bool>();
        r.logPath = rankLogPath(job->dir, r.placement.rank);
        r.lastStep = rj.at("last_step").get<std::uint64_t>();
        if (rj.contains("exit")) r.exit = ExitStatus{rj.at("exit")[0].get<int>(), rj.at("exit")[1].get<int>()};
        r.child = false;
        if (r.state == JobState::kRunning) {
          const auto stat = readProcStat(r.pid);
          if (stat && stat->state != 'Z' && stat->startTicks == r.startTicks) {
            r.pidfd = UniqueFd(pidfdOpen(r.pid));
          }
        }
        job->ranks.push_back(std::move(r));
      }
      adoptUnrecordedRanks(*job);
      const std::string id = job->spec.jobId;
      if (jobs_.count(id)) continue;
      order_.push_back(id);
      ++jobsVersion_;
      jobs_[id] = std::move(job);
    }
  } catch (const Json::exception& e) {
    return invalidArgument(path + " is damaged (" + e.what() + "); move it away to start afresh");
  }
  for (auto& [id, job] : jobs_) {
    // Never an open store for a job that had a secret: one restored without it (a damaged or
    // older table) is not served, and its ranks fail on their own.
    if (job->anyRankRunning() && job->storePort != 0 && !job->storeSecret.empty()) {
      // The ranks' store clients reconnect to the same port and register again.
      auto store = startStore(*job, static_cast<std::uint16_t>(job->storePort));
      if (store) job->store = std::move(store).value();
    }
  }
  poll();  // ranks that ended while the agent was away
  for (auto& [id, job] : jobs_) {
    if (!job->anyRankRunning()) endInit(*job);  // its cgroup, with what the job left there
  }
  return {};
}

}  // namespace lockstep::agent
