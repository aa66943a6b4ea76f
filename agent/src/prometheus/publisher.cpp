#include "prometheus/publisher.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "base/host.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"

namespace lockstep::agent {

MetricsPublisher::MetricsPublisher(MetricsSettings settings, Log& log) : settings_(std::move(settings)), log_(log) {}

Result<void> MetricsPublisher::serve() {
  if (settings_.listen.empty()) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(server_, MetricsServer::start(settings_.listen));
  page_ = std::make_unique<MetricsPage>(settings_.node);
  log_.info("serving metrics for Prometheus at http://" + server_->address() + "/metrics" +
            (server_->loopback() ? "" : " to anyone who can reach that address: they are not authenticated"));
  return writeTargets();
}

// Prometheus' file-based service discovery (docs/cluster.md): a target group naming where this
// node's metrics are, labelled with the node and its Slurm job; the file goes when the agent does.
Result<void> MetricsPublisher::writeTargets() const {
  if (settings_.targets.empty()) return {};
  const std::string served = server_->address();
  const std::string host = served.substr(0, served.rfind(':'));
  const bool wildcard = host == "0.0.0.0" || host == "::" || host == "[::]";
  const std::string target = (wildcard ? hostName() : host) + served.substr(served.rfind(':'));
  nlohmann::json labels = {{"node", settings_.node}};
  if (!settings_.slurmJob.empty()) labels["slurm_job"] = settings_.slurmJob;
  const nlohmann::json group = nlohmann::json::array({{{"targets", {target}}, {"labels", labels}}});
  // Prometheus may run as another user: the file is readable, and holds nothing secret.
  if (auto written = writeFileAtomic(settings_.targets, group.dump() + "\n", 0644); !written) {
    return written.error().withContext("--metrics-targets");
  }
  log_.info("named " + target + " for Prometheus in " + settings_.targets);
  return {};
}

void MetricsPublisher::observe(const StreamPayload& payload, const Jobs& jobs) {
  if (page_) page_->observe(payload, jobs);
}

void MetricsPublisher::publish(const Jobs& jobs) {
  if (!server_ || std::chrono::steady_clock::now() < next_) return;
  next_ = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  server_->publish(page_->render(unixMicrosNow(), jobs()));
}

void MetricsPublisher::withdraw() const {
  if (!settings_.targets.empty()) ::unlink(settings_.targets.c_str());
}

}  // namespace lockstep::agent
