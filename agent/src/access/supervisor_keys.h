#pragma once
// What a job's supervising agent's key may do on this agent (jobs/supervision.h): the job's first
// agent supervises it and its second stands by; either one's key may list, stop and restart that
// job here, and nothing else.

#include <string>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

// Whether `key` is the job's first agent's (its supervisor) or second's (its standby).
bool supervisesJob(const JobSpec& spec, const std::string& key);

// The jobs of `jobs` that `key` supervises or stands by for.
std::vector<std::string> jobsSupervisedBy(const std::string& key, const std::vector<JobStatus>& jobs);

// What a supervising agent's key may ask of this agent: hello; list, stop and restart (a later
// attempt of the same program: elastic.h's isRestartOf) the jobs it supervises; nothing else.
Result<void> supervisorMay(const Request& request, const std::string& key, const std::vector<JobStatus>& jobs,
                           const std::string& node);

}  // namespace lockstep::agent
