#pragma once
// Where the agents' streams are folded into KPIs, off the GUI thread. The workers' signals connect
// straight to the Ingest (queued into its own thread), as they do to the history recorder: it
// reads every message through the one stream reader (kpi/stream.h), which feeds a job's records
// to its KPI tracker and a node's (its GPUs, its network) to the node's tracker. Every 20 ms it
// works out the KPIs of the jobs that changed (a running job's also every 500 ms, as its windows
// move on) and tells the GUI which, with the figures of each node that reported. The GUI thread
// so gets what it draws, never every message: the published KPIs, the nodes' figures, and the
// trackers' series read under each job's lock. A job watched fanned in (FanIn.h) is folded by its
// supervising agent instead: its frames come from that agent's worker, and the ingest publishes
// each as the job's KPIs and adds it to the job's chart series.

#include <QObject>
#include <QStringList>
#include <QThread>
#include <QTimer>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "ChartSeries.h"
#include "FanIn.h"
#include "Types.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/timeline.h"
#include "lockstep/kpi/stream.h"

namespace lockstep::app {

// One job's KPI tracker and the KPIs last worked out from it. Its records come in through the
// stream reader, on the ingest thread (or anyone's, for a job nothing else feeds).
class LiveJob : public RecordSink {
 public:
  struct Published {
    kpi::JobKpis kpis;
    std::int64_t lastReportUnixUs = 0;  // of the newest step report in them; 0: none yet
  };

  // The newest steps of each rank the timeline keeps while a job runs.
  static constexpr std::size_t kLiveStepsPerRank = 512;
  // And the collectives of its newest steps it keeps (up to 64 a step; 40 bytes each): some 40 MiB
  // at 1024 ranks.
  static constexpr std::size_t kLiveCollectivesPerRank = 1024;
  static constexpr int kPublishCostMultiple = 3;

  // fannedIn: its KPIs come from frames (addFrame), and records are not folded.
  LiveJob(const JobSpec& spec, const kpi::Settings& settings, bool fannedIn = false);
  // A recorded job (the history's replayed tracker and its timeline), shown as of `atUnixUs`.
  LiveJob(std::unique_ptr<kpi::JobTracker> tracker, kpi::Timeline timeline, std::int64_t atUnixUs);

  void add(const StreamMessage& message);
  bool fannedIn() const { return fannedIn_; }
  // A fanned-in job's frame from its supervising agent (any thread): published at the next tick.
  // A frame whose KPIs do not decode is dropped, and says why (false, `why`).
  bool addFrame(const FrameReply& frame, std::string* why = nullptr);
  // How long ago its last frame came; unset before the first.
  std::optional<std::chrono::steady_clock::duration> sinceFrame() const;
  // Whether the job's last frame (its figures at its end) came.
  bool hasLastFrame() const;
  void onEvent(const std::string& node, const JobEvent& event) override;
  void onStep(const std::string& node, const StepReport& report) override;
  void onProcess(const std::string& node, const ProcessSample& sample) override;
  void onGpu(const std::string& node, const GpuSample& sample) override;
  void onPhase(const std::string& node, const PhaseReport& phase) override;
  // Works the KPIs out as of `nowUnixUs` when something came in since the last time, or when the
  // job runs and they are older than `staleUs`, but not sooner after the last time than
  // kPublishCostMultiple times what that one took (a 16,384-rank job's take some 35 ms): the
  // thread keeps most of its time for folding records in. Returns whether it did.
  bool publish(std::int64_t nowUnixUs, std::int64_t staleUs);

  // Any thread's.
  std::shared_ptr<const Published> published() const;
  // Reads the tracker (its chart series) under the job's lock: keep `f` short.
  template <class F>
  decltype(auto) read(F&& f) const {
    std::lock_guard lock(mutex_);
    return f(std::as_const(*tracker_));
  }
  // Its chart series (the tracker's, or a fanned-in job's frames'), under the job's lock.
  template <class F>
  decltype(auto) readCharts(F&& f) const {
    std::lock_guard lock(mutex_);
    return fannedIn_ ? f(frames_.view()) : f(ChartSeries::of(*tracker_));
  }
  // The same for its timeline (kpi/timeline.h).
  template <class F>
  decltype(auto) readTimeline(F&& f) const {
    std::lock_guard lock(mutex_);
    return f(std::as_const(timeline_));
  }
  // A node's clock against this machine's, for the timeline (any thread).
  void setClock(const std::string& node, const ClockOffset& clock);
  // The alert events (firing, resolved, undelivered) that came in since the last call, in order.
  std::vector<JobEvent> takeAlertEvents();

 private:
  // A record into the tracker, under the job's lock.
  template <class F>
  void feed(F&& f) {
    std::lock_guard lock(mutex_);
    if (fannedIn_) return;  // its records were left out; any an older agent sends are its frames' already
    f(*tracker_);
    changed_ = true;
  }

  mutable std::mutex mutex_;
  const bool fannedIn_ = false;
  std::unique_ptr<kpi::JobTracker> tracker_;
  FrameSeries frames_;
  kpi::JobKpis frameKpis_;  // the newest frame's
  std::int64_t frameUnixUs_ = 0;
  std::chrono::steady_clock::time_point frameAt_{};
  bool lastFrame_ = false;
  kpi::Timeline timeline_{kLiveStepsPerRank, kLiveCollectivesPerRank};
  std::shared_ptr<const Published> published_;
  std::vector<JobEvent> alertEvents_;  // for the GUI's alerts (AlertLog), until the next tick takes them
  bool changed_ = false;
  std::int64_t publishedAtUs_ = 0;
  std::chrono::steady_clock::time_point publishedAt_;  // the last publication's end,
  std::chrono::steady_clock::duration publishCost_{};  // and what it took
};

// Per node name, its newest figures (kpi/node.h).
using NodeFigures = std::shared_ptr<const std::map<std::string, kpi::NodeKpis>>;

class Ingest : public QObject {
  Q_OBJECT

 public:
  // `historyPath` (may be empty) is where 1-rank calibration runs are looked up for new jobs.
  // fanIn: which jobs come as frames (null: none).
  explicit Ingest(QString historyPath, std::shared_ptr<FanInBook> fanIn = nullptr);
  ~Ingest() override;

  void start();  // from the GUI thread

  // Any thread: the live tracker of the job, made on first sight of it.
  std::shared_ptr<LiveJob> job(const JobSpec& spec);

 public Q_SLOTS:
  void onJobs(QString agentId, lockstep::app::JobList jobs);
  void onMessages(QString agentId, lockstep::app::MessageBatch messages);
  // A node's clock against this machine's: every job's timeline, and the later ones', use it.
  void onClock(QString agentId, QString node, lockstep::ClockOffset offset);
  // A fanned-in job's frame, from the worker of the agent that supervises it.
  void onFrame(QString agentId, lockstep::app::FramePtr frame);

 Q_SIGNALS:
  void published(QStringList jobIds);  // jobs whose KPIs were worked out again
  void nodesPublished(lockstep::app::NodeFigures nodes);  // those that reported since the last
  // Alert events of any job since the last tick, in the order each job's stream had them: the
  // same reader that feeds the KPIs brings them (one reader of the stream).
  void alertEvents(lockstep::app::EventBatch events);

 private:
  void tick();
  std::shared_ptr<LiveJob> find(const std::string& jobId);

  const QString historyPath_;
  const std::shared_ptr<FanInBook> fanIn_;
  QThread thread_;
  QTimer* timer_ = nullptr;
  std::mutex mutex_;  // jobs_, which the GUI thread adds to
  std::map<std::string, std::shared_ptr<LiveJob>> jobs_;  // never shrinks: a slot's job stays for the app's life
  std::map<std::string, ClockOffset> clocks_;              // each node's, newest
  kpi::StreamReader reader_;
};

}  // namespace lockstep::app

Q_DECLARE_METATYPE(lockstep::app::NodeFigures)
