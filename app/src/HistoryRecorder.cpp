#include "HistoryRecorder.h"

#include <chrono>

namespace lockstep::app {

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
    Q_EMIT opened(false, QString::fromStdString(h.error().message));
    return;
  }
  history_ = std::move(*h);
  compact();
  timer_ = new QTimer(this);
  timer_->setInterval(1000);
  connect(timer_, &QTimer::timeout, this, &HistoryRecorder::tick);
  timer_->start();
  Q_EMIT opened(true, path_);
}

void HistoryRecorder::check(const Result<void>& result) {
  if (result) {
    dirty_ = true;
    return;
  }
  history_.reset();
  if (timer_) timer_->stop();
  Q_EMIT failed(QString::fromStdString(result.error().message));
}

void HistoryRecorder::onHello(QString agentId, HelloPtr hello) {
  nodeOfAgent_[agentId] = hello->nodeName;
  if (history_) check(history_->recordNode(*hello));
}

void HistoryRecorder::onJobs(QString agentId, JobList jobs) {
  auto node = nodeOfAgent_.find(agentId);
  if (!history_ || node == nodeOfAgent_.end()) return;
  for (const auto& status : *jobs) {
    check(history_->recordJob(node->second, status));
    if (!history_) return;
  }
}

void HistoryRecorder::onMessages(QString, MessageBatch messages) {
  if (history_) check(history_->recordMessages(*messages));
}

void HistoryRecorder::compact() {
  const auto now = std::chrono::system_clock::now();
  if (auto done = history_->compact(std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count());
      !done) {
    return check(done.error());
  }
  nextCompact_ = std::chrono::steady_clock::now() + std::chrono::hours(1);
}

void HistoryRecorder::tick() {
  if (!history_) return;
  if (std::chrono::steady_clock::now() >= nextCompact_) compact();
  if (!history_) return;
  if (auto refreshed = history_->refreshFinalKpis(); !refreshed) {
    check(refreshed.error());
  } else if (!refreshed->empty()) {
    dirty_ = true;
  }
  if (std::exchange(dirty_, false)) Q_EMIT changed();
}

}  // namespace lockstep::app
