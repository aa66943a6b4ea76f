#include "HistoryRecorder.h"

#include <QLoggingCategory>

#include <chrono>

#include "lockstep/common/clock.h"

Q_LOGGING_CATEGORY(lcHistory, "lockstep.history")

namespace lockstep::app {

namespace {
constexpr int kFlushMs = 50;
constexpr std::size_t kFlushMessages = 8192;
}  // namespace

HistoryRecorder::HistoryRecorder(QString path) : path_(std::move(path)) {
  thread_.setObjectName(QStringLiteral("history"));
  moveToThread(&thread_);
}

HistoryRecorder::~HistoryRecorder() {
  if (!thread_.isRunning()) return;
  // In the recorder's thread, after the writes already queued: stop the timer and close the file.
  QMetaObject::invokeMethod(
      this,
      [this] {
        if (history_) flush();
        delete timer_;
        timer_ = nullptr;
        history_.reset();
      },
      Qt::BlockingQueuedConnection);
  thread_.quit();
  thread_.wait();
}

void HistoryRecorder::start() {
  thread_.start();
  QMetaObject::invokeMethod(this, &HistoryRecorder::open, Qt::QueuedConnection);
}

void HistoryRecorder::open() {
  auto h = history::History::open(path_.toStdString());
  if (!h) {
    qCWarning(lcHistory) << "history off:" << QString::fromStdString(h.error().message);
    Q_EMIT opened(false, QString::fromStdString(h.error().message));
    return;
  }
  history_ = std::move(*h);
  compact();
  timer_ = new QTimer(this);
  timer_->setInterval(1000);
  connect(timer_, &QTimer::timeout, this, &HistoryRecorder::tick);
  timer_->start();
  flushTimer_ = new QTimer(this);
  flushTimer_->setSingleShot(true);
  flushTimer_->setInterval(kFlushMs);
  connect(flushTimer_, &QTimer::timeout, this, &HistoryRecorder::flush);
  Q_EMIT opened(true, path_);
}

void HistoryRecorder::fail(const Error& error) {
  // The window says it too; the log keeps it for whoever reads the app's output later.
  qCWarning(lcHistory) << "history stopped:" << QString::fromStdString(error.message);
  history_.reset();
  pending_.clear();
  if (timer_) timer_->stop();
  Q_EMIT failed(QString::fromStdString(error.message));
}

void HistoryRecorder::onHello(QString agentId, HelloPtr hello) {
  nodeOfAgent_[agentId] = hello->nodeName;
  if (!history_) return;
  if (auto r = history_->recordNode(*hello); !r) fail(r.error());
}

void HistoryRecorder::onClock(QString, QString node, ClockOffset offset) {
  if (!history_) return;
  if (auto r = history_->recordClock(node.toStdString(), offset); !r) fail(r.error());
}

void HistoryRecorder::onJobs(QString agentId, JobList jobs) {
  auto node = nodeOfAgent_.find(agentId);
  if (!history_ || node == nodeOfAgent_.end()) return;
  // Agents list their jobs every second, mostly unchanged: views re-read only on a change.
  for (const auto& status : *jobs) {
    auto changed = history_->recordJob(node->second, status);
    if (!changed) return fail(changed.error());
    dirty_ |= *changed;
  }
}

void HistoryRecorder::onMessages(QString, MessageBatch messages) {
  if (!history_) return;
  pending_.insert(pending_.end(), messages->begin(), messages->end());
  if (pending_.size() >= kFlushMessages) return flush();
  if (!flushTimer_->isActive()) flushTimer_->start();
}

void HistoryRecorder::flush() {
  if (flushTimer_) flushTimer_->stop();
  if (!history_ || pending_.empty()) return;
  if (auto r = history_->recordMessages(pending_); !r) return fail(r.error());
  pending_.clear();  // keeps its capacity for the next 50 ms
  dirty_ = true;
}

void HistoryRecorder::compact() {
  if (auto done = history_->compact(unixMicrosNow()); !done) return fail(done.error());
  nextCompact_ = std::chrono::steady_clock::now() + std::chrono::hours(1);
}

void HistoryRecorder::tick() {
  if (!history_) return;
  flush();  // the final KPIs are worked out from what is written
  if (std::chrono::steady_clock::now() >= nextCompact_) compact();
  if (!history_) return;
  auto refreshed = history_->refreshFinalKpis();
  if (!refreshed) return fail(refreshed.error());
  dirty_ |= !refreshed->empty();
  if (std::exchange(dirty_, false)) Q_EMIT changed();
}

}  // namespace lockstep::app
