#pragma once
// The agent's metrics for Prometheus, as the event loop drives them (docs/cluster.md): with
// --metrics-listen, the page (metrics.h) sees every record the node streams and is rendered once
// a second for the HTTP thread to serve; with --metrics-targets, a file names where, for
// Prometheus' file-based discovery, while the agent serves. Event loop only.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/log.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"
#include "prometheus/page.h"

namespace lockstep::agent {

struct MetricsSettings {
  std::string node;
  std::string listen;    // HOST:PORT; empty: no metrics
  std::string targets;   // a Prometheus file_sd file; empty: none
  std::string slurmJob;  // labels the target, when set
};

class MetricsPublisher {
 public:
  using Jobs = std::function<std::vector<JobStatus>()>;

  MetricsPublisher(MetricsSettings settings, Log& log);

  // Starts serving, and names the address in the targets file.
  Result<void> serve();
  // One of the node's records; `jobs` lists the agent's jobs, asked for a job's spec.
  void observe(const StreamPayload& payload, const Jobs& jobs);
  // Renders the page, once a second at most; `jobs` lists the jobs with their progress.
  void publish(const Jobs& jobs);
  // Removes the targets file: nobody serves there any more.
  void withdraw() const;

 private:
  Result<void> writeTargets() const;

  MetricsSettings settings_;
  Log& log_;
  std::unique_ptr<MetricsPage> page_;
  std::unique_ptr<MetricsServer> server_;
  std::chrono::steady_clock::time_point next_;
};

}  // namespace lockstep::agent
