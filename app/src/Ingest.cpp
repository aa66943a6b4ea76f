#include "Ingest.h"

#include "lockstep/common/clock.h"
#include "lockstep/history/history.h"

namespace lockstep::app {

namespace {
constexpr int kTickMs = 20;
constexpr std::int64_t kStaleUs = 500'000;
constexpr std::int64_t kNetEmitUs = 1'000'000;  // network rates reach the GUI once a second
}  // namespace

LiveJob::LiveJob(const JobSpec& spec, const kpi::Settings& settings)
    : tracker_(std::make_unique<kpi::JobTracker>(spec, settings)),
      published_(std::make_shared<const Published>(Published{tracker_->snapshot(unixMicrosNow()), 0})) {}

LiveJob::LiveJob(std::unique_ptr<kpi::JobTracker> tracker, std::int64_t atUnixUs)
    : tracker_(std::move(tracker)),
      published_(std::make_shared<const Published>(Published{tracker_->snapshot(atUnixUs), tracker_->lastReportUnixUs()})),
      publishedAtUs_(atUnixUs) {}

void LiveJob::add(const StreamMessage& message) {
  std::lock_guard lock(mutex_);
  tracker_->add(message);
  changed_ = true;
}

bool LiveJob::publish(std::int64_t nowUnixUs, std::int64_t staleUs) {
  std::lock_guard lock(mutex_);
  const bool stale = !tracker_->ended() && nowUnixUs - publishedAtUs_ >= staleUs;
  if (!changed_ && !stale) return false;
  published_ = std::make_shared<const Published>(Published{tracker_->snapshot(nowUnixUs), tracker_->lastReportUnixUs()});
  changed_ = false;
  publishedAtUs_ = nowUnixUs;
  return true;
}

std::shared_ptr<const LiveJob::Published> LiveJob::published() const {
  std::lock_guard lock(mutex_);
  return published_;
}

Ingest::Ingest(QString historyPath) : historyPath_(std::move(historyPath)) {
  qRegisterMetaType<GpuSamples>();
  qRegisterMetaType<NetRates>();
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
  if (!slot) slot = std::make_shared<LiveJob>(spec, history::liveTrackerSettings(historyPath_.toStdString(), spec));
  return slot;
}

std::shared_ptr<LiveJob> Ingest::find(const std::string& jobId) {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(jobId);
  return it == jobs_.end() ? nullptr : it->second;
}

void Ingest::onJobs(QString, JobList jobs) {
  // In the order the agent sent them: a job's list comes before its messages.
  for (const auto& status : *jobs) job(status.spec);
}

void Ingest::onMessages(QString agentId, MessageBatch messages) {
  std::string lastId;
  std::shared_ptr<LiveJob> last;
  for (const auto& m : *messages) {
    if (const auto* gpu = std::get_if<GpuSample>(&m.payload)) gpus_[{agentId, gpu->gpuIndex}] = *gpu;
    if (const auto* net = std::get_if<NetSample>(&m.payload)) addNet(agentId, *net);
    const std::string& jobId = jobOf(m.payload);
    if (jobId.empty()) continue;
    if (jobId != lastId || !last) {
      lastId = jobId;
      last = find(jobId);
    }
    if (last) last->add(m);  // else a job no list named (yet): not this app's to know
  }
}

void Ingest::addNet(const QString& agentId, const NetSample& sample) {
  auto [it, fresh] = netBefore_.try_emplace({agentId, sample.interface}, sample);
  if (fresh) return;
  if (auto rate = kpi::netRate(it->second, sample)) netRates_[it->first] = *rate;
  it->second = sample;
}

void Ingest::tick() {
  std::vector<std::pair<std::string, std::shared_ptr<LiveJob>>> jobs;
  {
    std::lock_guard lock(mutex_);
    jobs.assign(jobs_.begin(), jobs_.end());
  }
  const std::int64_t now = unixMicrosNow();
  QStringList changed;
  for (const auto& [id, live] : jobs) {
    if (live->publish(now, kStaleUs)) changed << QString::fromStdString(id);
  }
  if (!changed.isEmpty()) Q_EMIT published(changed);
  if (!gpus_.empty()) {
    Q_EMIT gpuSamples(std::make_shared<const std::map<std::pair<QString, std::uint32_t>, GpuSample>>(std::move(gpus_)));
    gpus_.clear();
  }
  if (!netRates_.empty() && now - netEmittedUs_ >= kNetEmitUs) {
    netEmittedUs_ = now;
    Q_EMIT netRates(std::make_shared<const std::map<std::pair<QString, std::string>, kpi::NetRate>>(std::move(netRates_)));
    netRates_.clear();
  }
}

}  // namespace lockstep::app
