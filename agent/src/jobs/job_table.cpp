#include "jobs/job_table.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/host.h"
#include "jobs/job.h"
#include "jobs/job_files.h"
#include "jobs/proc_scan.h"
#include "lockstep/common/npy.h"
#include "lockstep/protocol/codec.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

Json rankToJson(const Rank& r) {
  Json rank = {{"rank", r.placement.rank},       {"local_rank", r.placement.localRank},
               {"pid", r.pid},                    {"program_pid", r.programPid},
               {"start_ticks", r.startTicks},
               {"state", static_cast<int>(r.state)}, {"exit_unknown", r.exitUnknown},
               {"last_step", r.lastStep}};
  if (r.placement.gpuIndex) rank["gpu"] = *r.placement.gpuIndex;
  if (r.exit) rank["exit"] = {r.exit->exitCode, r.exit->signal};
  return rank;
}

Json jobToJson(const Job& job) {
  Json ranks = Json::array();
  for (const auto& r : job.ranks) ranks.push_back(rankToJson(r));
  return {{"spec", Json::parse(jobSpecToJson(job.spec))},
          {"state", static_cast<int>(job.state)},
          {"started_unix_us", job.startedUnixUs},
          {"ended_unix_us", job.endedUnixUs},
          {"message", job.message},
          {"owner", job.owner.user},
          {"store_port", job.storePort},
          {"master_port", job.masterPort},
          {"store_secret", job.storeSecret},
          {"stop_requested", job.stopRequested},
          {"cpus", job.cpus},
          {"memory_bytes", job.limits.memoryBytes},
          {"processes", job.limits.processes},
          {"ranks", ranks}};
}

// A recorded rank, re-adopted (a pidfd to watch) if it still runs as the same process.
Rank readRank(const Json& rj, const std::string& node, const std::string& jobDir) {
  Rank r;
  r.placement = {rj.at("rank").get<std::uint32_t>(), node, rj.at("local_rank").get<std::uint32_t>(), std::nullopt};
  if (rj.contains("gpu")) r.placement.gpuIndex = rj.at("gpu").get<std::uint32_t>();
  r.pid = rj.at("pid").get<pid_t>();
  r.programPid = rj.value("program_pid", r.pid);
  r.startTicks = rj.at("start_ticks").get<std::uint64_t>();
  r.state = static_cast<JobState>(rj.at("state").get<int>());
  r.exitUnknown = rj.at("exit_unknown").get<bool>();
  r.logPath = JobPaths::rankLog(jobDir, r.placement.rank);
  r.lastStep = rj.at("last_step").get<std::uint64_t>();
  if (rj.contains("exit")) r.exit = ExitStatus{rj.at("exit")[0].get<int>(), rj.at("exit")[1].get<int>()};
  r.child = false;
  if (r.state == JobState::kRunning) {
    const auto stat = readProcStat(r.pid);
    if (stat && stat->state != 'Z' && stat->startTicks == r.startTicks) {
      r.pidfd = UniqueFd(pidfdOpen(r.pid));
    }
  }
  return r;
}

Result<std::unique_ptr<Job>> readJob(const Json& entry, const JobPaths& paths, const std::string& agentUser) {
  auto job = std::make_unique<Job>();
  LOCKSTEP_ASSIGN_OR_RETURN(job->spec, jobSpecFromJson(entry.at("spec").dump()));
  job->state = static_cast<JobState>(entry.at("state").get<int>());
  job->startedUnixUs = entry.at("started_unix_us").get<std::int64_t>();
  job->endedUnixUs = entry.at("ended_unix_us").get<std::int64_t>();
  job->message = entry.at("message").get<std::string>();
  job->owner.user = entry.value("owner", agentUser);  // a table from before owners: the agent's
  // Its uid and groups, which a restarted agent checks its ranks' records against (job_membership.h).
  if (auto who = lookUpUser(job->owner.user)) job->owner = *who;
  job->dir = paths.jobDir(job->spec.jobId);  // from the id, never from the file (job_paths.h)
  // Ended with the job, as the restarted agent sees it end.
  job->cgroups = paths.jobCgroups(job->spec);
  for (std::string* dir : {&job->cgroups.unified, &job->cgroups.memory, &job->cgroups.pids, &job->cgroups.cpuset,
                           &job->cgroups.devices}) {
    std::error_code ec;
    if (!dir->empty() && !fs::exists(*dir, ec)) dir->clear();
  }
  // What it holds of the node (node_share.h), as it was given.
  job->cpus = entry.value("cpus", std::vector<int>{});
  job->limits.memoryBytes = entry.value("memory_bytes", std::uint64_t{0});
  job->limits.processes = entry.value("processes", std::uint64_t{0});
  job->storePort = entry.at("store_port").get<std::uint32_t>();
  job->masterPort = entry.value("master_port", 0u);
  job->storeSecret = entry.value("store_secret", std::string());
  if (!isValidStoreSecret(job->storeSecret)) job->storeSecret.clear();
  job->stopRequested = entry.at("stop_requested").get<bool>();
  for (const auto& rj : entry.at("ranks")) job->ranks.push_back(readRank(rj, paths.node, job->dir));
  return job;
}

// The agent stopped between recording the job and answering its start: the ranks it spawned are
// found by their environment. False if one was never spawned (the job cannot run).
bool adoptUnrecordedRanks(Job& job) {
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
  return all;
}

}  // namespace

JobTableFile::JobTableFile(JobPaths paths) : paths_(std::move(paths)), path_(paths_.table()) {}

void JobTableFile::save(const std::vector<const Job*>& jobs) const {
  Json table = Json::array();
  for (const Job* job : jobs) table.push_back(jobToJson(*job));
  if (auto written = writeFileAtomic(path_, table.dump(1)); !written) {
    std::fprintf(stderr, "lockstep-agent: cannot save the job table: %s\n", written.error().message.c_str());
  }
}

bool JobTableFile::exists() const {
  std::error_code ec;
  return fs::exists(path_, ec);
}

Result<void> JobTableFile::restore(const Take& take) const {
  if (!exists()) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(auto text, readFile(path_, 256u << 20));
  const Json table = Json::parse(text, nullptr, false);
  const std::string agentUser = currentIdentity().user;
  if (!table.is_array()) return invalidArgument(path_ + " is damaged (not a JSON array); move it away to start afresh");
  try {
    for (const auto& entry : table) {
      LOCKSTEP_ASSIGN_OR_RETURN(auto job, readJob(entry, paths_, agentUser));
      const bool everyRankFound = adoptUnrecordedRanks(*job);
      take(std::move(job), everyRankFound);
    }
  } catch (const Json::exception& e) {
    return invalidArgument(path_ + " is damaged (" + e.what() + "); move it away to start afresh");
  }
  return {};
}

}  // namespace lockstep::agent
