#pragma once
// Where the agents' streams are folded into KPIs, off the GUI thread. The workers' signals connect
// straight to the Ingest (queued into its own thread), as they do to the history recorder: every
// message feeds its job's KPI tracker there. Every 20 ms it works out the KPIs of the jobs that
// changed (a running job's also every 500 ms, as its windows move on) and tells the GUI which,
// with the latest sample of each GPU that reported. The GUI thread so gets what it draws, never
// every message: the published KPIs, and the trackers' series read under each job's lock.

#include <QObject>
#include <QStringList>
#include <QThread>
#include <QTimer>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "Types.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/network.h"

namespace lockstep::app {

// One job's KPI tracker and the KPIs last worked out from it.
class LiveJob {
 public:
  struct Published {
    kpi::JobKpis kpis;
    std::int64_t lastReportUnixUs = 0;  // of the newest step report in them; 0: none yet
  };

  LiveJob(const JobSpec& spec, const kpi::Settings& settings);
  // A recorded job (the history's replayed tracker), shown as of `atUnixUs`.
  LiveJob(std::unique_ptr<kpi::JobTracker> tracker, std::int64_t atUnixUs);

  // The ingest thread's (anyone's, for a job nothing else feeds).
  void add(const StreamMessage& message);
  // Works the KPIs out as of `nowUnixUs` when something came in since the last time, or when the
  // job runs and they are older than `staleUs`. Returns whether it did.
  bool publish(std::int64_t nowUnixUs, std::int64_t staleUs);

  // Any thread's.
  std::shared_ptr<const Published> published() const;
  // Reads the tracker (its chart series) under the job's lock: keep `f` short.
  template <class F>
  decltype(auto) read(F&& f) const {
    std::lock_guard lock(mutex_);
    return f(std::as_const(*tracker_));
  }

 private:
  mutable std::mutex mutex_;
  std::unique_ptr<kpi::JobTracker> tracker_;
  std::shared_ptr<const Published> published_;
  bool changed_ = false;
  std::int64_t publishedAtUs_ = 0;
};

using GpuSamples = std::shared_ptr<const std::map<std::pair<QString, std::uint32_t>, GpuSample>>;
using NetRates = std::shared_ptr<const std::map<std::pair<QString, std::string>, kpi::NetRate>>;

class Ingest : public QObject {
  Q_OBJECT

 public:
  // `historyPath` (may be empty) is where 1-rank calibration runs are looked up for new jobs.
  explicit Ingest(QString historyPath);
  ~Ingest() override;

  void start();  // from the GUI thread

  // Any thread: the live tracker of the job, made on first sight of it.
  std::shared_ptr<LiveJob> job(const JobSpec& spec);

 public Q_SLOTS:
  void onJobs(QString agentId, lockstep::app::JobList jobs);
  void onMessages(QString agentId, lockstep::app::MessageBatch messages);

 Q_SIGNALS:
  void published(QStringList jobIds);  // jobs whose KPIs were worked out again
  void gpuSamples(lockstep::app::GpuSamples latest);  // per (agent, GPU index), those new since the last
  // Per (agent, interface), the throughput between its two newest samples; about once a second.
  void netRates(lockstep::app::NetRates latest);

 private:
  void tick();
  std::shared_ptr<LiveJob> find(const std::string& jobId);
  void addNet(const QString& agentId, const NetSample& sample);

  const QString historyPath_;
  QThread thread_;
  QTimer* timer_ = nullptr;
  std::mutex mutex_;  // jobs_, which the GUI thread adds to
  std::map<std::string, std::shared_ptr<LiveJob>> jobs_;
  std::map<std::pair<QString, std::uint32_t>, GpuSample> gpus_;  // since the last tick
  std::map<std::pair<QString, std::string>, NetSample> netBefore_;  // the newest of each interface
  std::map<std::pair<QString, std::string>, kpi::NetRate> netRates_;  // since the last emission
  std::int64_t netEmittedUs_ = 0;
};

}  // namespace lockstep::app

Q_DECLARE_METATYPE(lockstep::app::GpuSamples)
Q_DECLARE_METATYPE(lockstep::app::NetRates)
