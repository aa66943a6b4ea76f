#include "jobs/job_paths.h"

#include <filesystem>

#include "jobs/job_cgroup.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::string JobPaths::table() const { return (fs::path(stateDir) / "jobs.json").string(); }

std::string JobPaths::jobDir(const std::string& jobId) const { return (fs::path(stateDir) / "jobs" / jobId).string(); }

std::string JobPaths::launcher(const std::string& jobId) const {
  return (fs::path(stateDir) / "launchers" / jobId).string();
}

PartCgroups JobPaths::jobCgroups(const JobSpec& spec) const {
  return partCgroups(cgroups, partCgroupName(node, stateDir, spec.jobId, spec.attempt));
}

std::string JobPaths::rankLog(const std::string& jobDir, std::uint32_t rank) {
  return (fs::path(jobDir) / ("rank-" + std::to_string(rank) + ".log")).string();
}

std::string JobPaths::rankExit(const std::string& jobDir, std::uint32_t rank) {
  return (fs::path(jobDir) / ("rank-" + std::to_string(rank) + ".exit")).string();
}

}  // namespace lockstep::agent
