#pragma once
// The agent's figures for Prometheus (docs/cluster.md): `--metrics-listen HOST:PORT` serves them
// as OpenMetrics text over plain HTTP.
//
// MetricsPage is built from what the agent already streams (the node sensors' GPU and process
// samples, the ranks' step reports, job events): serving it makes no NVML call. The event loop
// owns it and renders it about once a second; MetricsServer, on a thread of its own, answers
// scrapes with the newest rendering. The server is unauthenticated, so it serves nothing but
// these figures, reads at most a small request within a short deadline, and listens on loopback
// unless told otherwise.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/stream.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

// One job's records on this node: its KPIs (the engine's), and its ranks' collectives counted by
// kind over every step report seen (the page's counters: the KPI engine keeps only its window).
class JobFigures : public RecordSink {
 public:
  using Counts = std::map<std::pair<std::uint32_t, CollectiveKind>, CollectiveTimes>;  // (rank, kind): summed

  explicit JobFigures(JobSpec spec) : tracker_(std::move(spec)) {}
  void onEvent(const std::string& node, const JobEvent& e) override;
  void onStep(const std::string& node, const StepReport& report) override;
  void onProcess(const std::string& node, const ProcessSample& p) override { tracker_.onProcess(node, p); }
  void onGpu(const std::string& node, const GpuSample& g) override { tracker_.onGpu(node, g); }

  const kpi::JobTracker& tracker() const { return tracker_; }
  const Counts& counts() const { return counts_; }
  // Each alert rule seen, and whether it fires now (docs/alerts.md).
  const std::map<std::string, bool>& alerts() const { return alerts_; }

 private:
  kpi::JobTracker tracker_;
  Counts counts_;
  std::map<std::string, bool> alerts_;
};

class MetricsPage {
 public:
  using Payload = StreamPayload;

  explicit MetricsPage(std::string node);

  // One of this node's records, read as every consumer reads the stream (kpi/stream.h); `jobs`
  // lists the agent's jobs, asked for the spec of a job seen for the first time.
  void observe(const Payload& payload, const std::function<std::vector<JobStatus>()>& jobs);
  bool knows(const std::string& jobId) const { return trackers_.count(jobId) != 0; }
  // Every series name the page can hold (counters with their _total), for dashboards to check against.
  static std::vector<std::string> seriesNames();
  // The page, as of `nowUnixUs`, for the jobs the agent holds (others are forgotten).
  std::string render(std::int64_t nowUnixUs, const std::vector<JobStatus>& jobs);

 private:
  RecordSink* trackerOf(const std::string& jobId);

  std::string node_;
  std::map<std::string, JobFigures> trackers_;
  const std::function<std::vector<JobStatus>()>* jobs_ = nullptr;  // while observe() runs
  kpi::StreamReader reader_;  // its node tracker keeps this node's GPUs and interfaces
};

class MetricsServer {
 public:
  // Listens on HOST:PORT (PORT 0: any free one; see address()).
  static Result<std::unique_ptr<MetricsServer>> start(const std::string& hostPort);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  void publish(std::string page);
  std::string address() const { return address_; }  // HOST:PORT as bound
  bool loopback() const { return loopback_; }

 private:
  struct Connection;
  MetricsServer(int fd, std::string address, bool loopback);
  void run();
  void step(Connection& c);
  std::string answer(const std::string& request);

  int fd_;
  std::string address_;
  bool loopback_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::shared_ptr<const std::string> page_;
  std::thread thread_;
};

// HOST:PORT (a bare PORT or :PORT means 127.0.0.1), checked; the error says what to give.
Result<std::pair<std::string, std::uint16_t>> parseMetricsListen(const std::string& text);

}  // namespace lockstep::agent
