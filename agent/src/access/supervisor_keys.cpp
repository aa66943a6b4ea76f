#include "access/supervisor_keys.h"

#include <type_traits>
#include <variant>

#include "lockstep/client/elastic.h"
#include "lockstep/client/supervisor.h"

namespace lockstep::agent {

bool supervisesJob(const JobSpec& spec, const std::string& key) {
  return static_cast<bool>(supervisingRole(spec, [&](const JobAgent& a) { return a.publicKey == key; }));
}

std::vector<std::string> jobsSupervisedBy(const std::string& key, const std::vector<JobStatus>& jobs) {
  std::vector<std::string> ids;
  for (const auto& j : jobs) {
    if (supervisesJob(j.spec, key)) ids.push_back(j.spec.jobId);
  }
  return ids;
}

Result<void> supervisorMay(const Request& request, const std::string& key, const std::vector<JobStatus>& jobs,
                           const std::string& node) {
  const auto supervised = [&](const std::string& jobId) -> const JobStatus* {
    for (const auto& j : jobs) {
      if (j.spec.jobId == jobId && supervisesJob(j.spec, key)) return &j;
    }
    return nullptr;
  };
  const Error refused{ErrorCode::kPermissionDenied,
                      "a supervising agent's key may only list, stop, restart and read the stream of the jobs it "
                      "supervises on " + node};
  return std::visit(
      [&](const auto& body) -> Result<void> {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, HelloRequest> || std::is_same_v<T, ListJobsRequest>) {
          return {};
        } else if constexpr (std::is_same_v<T, FetchRequest>) {
          return {};  // its jobs' records alone (Caller::streamScope): their alerts are evaluated there
        } else if constexpr (std::is_same_v<T, StopJobRequest>) {
          if (supervised(body.jobId)) return {};
          return refused;
        } else if constexpr (std::is_same_v<T, StartJobRequest>) {
          const JobStatus* ended = supervised(body.spec.jobId);
          if (ended && isRestartOf(body.spec, ended->spec)) return {};
          return ended ? Error{ErrorCode::kPermissionDenied, "job " + body.spec.jobId + " on " + node +
                                                                 " may be restarted only with its own program, data and agents"}
                       : refused;
        } else {
          return refused;
        }
      },
      request.body);
}

}  // namespace lockstep::agent
