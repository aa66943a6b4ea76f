#include "Ingest.h"

#include <chrono>

#include "lockstep/common/clock.h"
#include "lockstep/history/history.h"
#include "lockstep/kpi/frame.h"

namespace lockstep::app {

namespace {
constexpr int kTickMs = 20;
constexpr std::int64_t kStaleUs = 500'000;
}  // namespace

// A fanned-in job's device series: the utilization chart's 5 minutes (the heatmap shows 2).
constexpr double kFrameDeviceSeconds = 300;

LiveJob::LiveJob(const JobSpec& spec, const kpi::Settings& settings, bool fannedIn)
    : fannedIn_(fannedIn),
      tracker_(std::make_unique<kpi::JobTracker>(spec, settings)),
      frames_(settings.seriesCapacity, kFrameDeviceSeconds),
      published_(std::make_shared<const Published>(Published{tracker_->snapshot(unixMicrosNow()), 0})) {}

LiveJob::LiveJob(std::unique_ptr<kpi::JobTracker> tracker, kpi::Timeline timeline, std::int64_t atUnixUs)
    : tracker_(std::move(tracker)),
      frames_(0, 0),
      timeline_(std::move(timeline)),
      published_(std::make_shared<const Published>(Published{tracker_->snapshot(atUnixUs), tracker_->lastReportUnixUs()})),
      publishedAtUs_(atUnixUs) {}

void LiveJob::add(const StreamMessage& message) { visitRecord(message, *this); }

void LiveJob::onEvent(const std::string& node, const JobEvent& event) {
  feed([&](kpi::JobTracker& t) {
    t.onEvent(node, event);
    const bool alert = event.kind == JobEventKind::kAlertFiring || event.kind == JobEventKind::kAlertResolved ||
                       event.kind == JobEventKind::kAlertUndelivered;
    if (alert && event.jobId == t.spec().jobId) alertEvents_.push_back(event);
  });
}

std::vector<JobEvent> LiveJob::takeAlertEvents() {
  std::lock_guard lock(mutex_);
  return std::exchange(alertEvents_, {});
}
void LiveJob::onStep(const std::string& node, const StepReport& report) {
  feed([&](kpi::JobTracker& t) {
    t.onStep(node, report);
    if (report.jobId == t.spec().jobId) timeline_.add(report, node);
  });
}

void LiveJob::onPhase(const std::string& node, const PhaseReport& phase) {
  feed([&](kpi::JobTracker& t) {
    if (phase.jobId == t.spec().jobId) timeline_.add(phase, node);
  });
}

void LiveJob::setClock(const std::string& node, const ClockOffset& clock) {
  std::lock_guard lock(mutex_);
  timeline_.setClock(node, clock);
}
void LiveJob::onProcess(const std::string& node, const ProcessSample& sample) {
  feed([&](kpi::JobTracker& t) { t.onProcess(node, sample); });
}
void LiveJob::onGpu(const std::string& node, const GpuSample& sample) {
  feed([&](kpi::JobTracker& t) { t.onGpu(node, sample); });
}

bool LiveJob::addFrame(const FrameReply& frame, std::string* why) {
  // Without KPIs: the frame this app holds, again (FrameRequest::heldUnixUs), with more of its events.
  const bool held = frame.kpis.empty();
  auto kpis = held ? Result<kpi::JobKpis>(kpi::JobKpis{}) : kpi::decodeFrame(frame.kpis);
  if (!kpis || (!held && kpis->jobId != frame.jobId)) {
    if (why) *why = kpis ? "the frame's KPIs are of job " + kpis->jobId : kpis.error().message;
    return false;
  }
  std::lock_guard lock(mutex_);
  if (!fannedIn_ || frame.jobId != tracker_->spec().jobId) {
    if (why) *why = "the job is not watched fanned in here";
    return false;
  }
  if (held && frame.timeUnixUs != frameUnixUs_) {
    if (why) *why = "a frame without its KPIs that is not the one held";
    return false;
  }
  // The same frame again (asked for before the agent's next poll, or its reads fell behind):
  // nothing new to draw, and no sign that figures still come.
  if (frame.timeUnixUs == frameUnixUs_ && frame.events.empty()) return true;
  if (frame.timeUnixUs != frameUnixUs_) frameAt_ = std::chrono::steady_clock::now();
  for (const auto& m : frame.events) {
    const auto* event = std::get_if<JobEvent>(&m.payload);
    const bool alert = event && (event->kind == JobEventKind::kAlertFiring || event->kind == JobEventKind::kAlertResolved ||
                                 event->kind == JobEventKind::kAlertUndelivered);
    if (alert) alertEvents_.push_back(*event);
  }
  if (held) return true;
  frames_.add(*kpis);
  lastFrame_ = lastFrame_ || frame.ended;
  frameKpis_ = std::move(kpis).value();
  frameUnixUs_ = frame.timeUnixUs;
  changed_ = true;
  return true;
}

bool LiveJob::publish(std::int64_t nowUnixUs, std::int64_t staleUs) {
  std::lock_guard lock(mutex_);
  if (fannedIn_) {  // a frame is published as it came: its supervising agent worked it out
    if (!changed_) return false;
    // The frame's moment, at most a poll of its agent after its newest report: none without steps.
    published_ = std::make_shared<const Published>(Published{frameKpis_, frameKpis_.step > 0 ? frameUnixUs_ : 0});
    changed_ = false;
    return true;
  }
  const bool stale = !tracker_->ended() && nowUnixUs - publishedAtUs_ >= staleUs;
  if (!changed_ && !stale) return false;
  // Timed on the steady clock: a wall clock set back must not hold publications back.
  const auto start = std::chrono::steady_clock::now();
  if (start - publishedAt_ < kPublishCostMultiple * publishCost_) return false;
  published_ = std::make_shared<const Published>(Published{tracker_->snapshot(nowUnixUs), tracker_->lastReportUnixUs()});
  publishedAt_ = std::chrono::steady_clock::now();
  publishCost_ = publishedAt_ - start;
  changed_ = false;
  publishedAtUs_ = nowUnixUs;
  return true;
}

std::optional<std::chrono::steady_clock::duration> LiveJob::sinceFrame() const {
  std::lock_guard lock(mutex_);
  if (frameAt_ == std::chrono::steady_clock::time_point{}) return std::nullopt;
  return std::chrono::steady_clock::now() - frameAt_;
}

bool LiveJob::hasLastFrame() const {
  std::lock_guard lock(mutex_);
  return lastFrame_;
}

std::shared_ptr<const LiveJob::Published> LiveJob::published() const {
  std::lock_guard lock(mutex_);
  return published_;
}

Ingest::Ingest(QString historyPath, std::shared_ptr<FanInBook> fanIn)
    : historyPath_(std::move(historyPath)),
      fanIn_(std::move(fanIn)),
      reader_([this](const std::string& jobId) -> RecordSink* { return find(jobId).get(); }, kpi::kNewestOnly) {
  qRegisterMetaType<NodeFigures>();
  thread_.setObjectName(QStringLiteral("ingest"));
  moveToThread(&thread_);
}

Ingest::~Ingest() {
  if (!thread_.isRunning()) return;
  QMetaObject::invokeMethod(
      this,
      [this] {
        delete timer_;
        timer_ = nullptr;
      },
      Qt::BlockingQueuedConnection);
  thread_.quit();
  thread_.wait();
}

void Ingest::start() {
  thread_.start();
  QMetaObject::invokeMethod(
      this,
      [this] {
        timer_ = new QTimer(this);
        timer_->setInterval(kTickMs);
        connect(timer_, &QTimer::timeout, this, &Ingest::tick);
        timer_->start();
      },
      Qt::QueuedConnection);
}

std::shared_ptr<LiveJob> Ingest::job(const JobSpec& spec) {
  std::lock_guard lock(mutex_);
  auto& slot = jobs_[spec.jobId];
  if (!slot) {
    slot = std::make_shared<LiveJob>(spec, history::liveTrackerSettings(historyPath_.toStdString(), spec),
                                     fanIn_ && fanIn_->decide(spec));
    for (const auto& [node, clock] : clocks_) slot->setClock(node, clock);
  }
  return slot;
}

std::shared_ptr<LiveJob> Ingest::find(const std::string& jobId) {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(jobId);
  return it == jobs_.end() ? nullptr : it->second;
}

void Ingest::onJobs(QString, JobList jobs) {
  // In the order the agent sent them: a job's list comes before its messages.
  for (const auto& status : *jobs) {
    if (!status.specOmitted) job(status.spec);  // a left-out spec's job was made from its full one
  }
}

void Ingest::onClock(QString, QString node, ClockOffset offset) {
  std::lock_guard lock(mutex_);
  clocks_[node.toStdString()] = offset;
  for (const auto& [id, live] : jobs_) live->setClock(node.toStdString(), offset);
}

void Ingest::onMessages(QString, MessageBatch messages) {
  // A job no list named (yet) is not this app's to know: its records go nowhere.
  reader_.read(*messages);
}

void Ingest::onFrame(QString agentId, FramePtr frame) {
  const auto live = find(frame->jobId);
  if (!live) return;  // a job no list named yet: its next frame comes in a moment
  if (std::string why; !live->addFrame(*frame, &why) && !why.empty()) {
    qWarning("lockstep: a frame of job %s from %s was dropped: %s", frame->jobId.c_str(), qPrintable(agentId), why.c_str());
  }
}

void Ingest::tick() {
  std::vector<std::pair<std::string, std::shared_ptr<LiveJob>>> jobs;
  {
    std::lock_guard lock(mutex_);
    jobs.assign(jobs_.begin(), jobs_.end());
  }
  const std::int64_t now = unixMicrosNow();
  QStringList changed;
  auto alerts = std::make_shared<std::vector<JobEvent>>();
  for (const auto& [id, live] : jobs) {
    for (auto& e : live->takeAlertEvents()) alerts->push_back(std::move(e));
    if (live->publish(now, kStaleUs)) changed << QString::fromStdString(id);
  }
  if (!alerts->empty()) Q_EMIT alertEvents(std::move(alerts));
  if (!changed.isEmpty()) Q_EMIT published(changed);
  if (auto nodes = reader_.takeChangedNodes(); !nodes.empty()) {
    auto figures = std::make_shared<std::map<std::string, kpi::NodeKpis>>();
    for (const auto& name : nodes) figures->emplace(name, reader_.node(name)->snapshot());
    Q_EMIT nodesPublished(std::move(figures));
  }
}

}  // namespace lockstep::app
