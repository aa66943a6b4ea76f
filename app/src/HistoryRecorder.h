#pragma once
// Records everything the agents' workers report into the job history (history/), on a thread of
// its own: SQLite writes never hold up the GUI. Workers' signals connect straight to it (queued),
// so each agent's job lists and messages arrive in the order the agent sent them. Messages are
// written in one transaction per 50 ms (or per 8,192 messages), whatever the number of agents:
// 128 agents' batches, a transaction each, were more than the thread could write. The final KPIs
// of jobs that ended are computed once a second; samples past the raw horizon are downsampled when
// it opens and every hour.
//
// Create it, call start(); it opens the file in its thread and answers with opened(). A history
// that cannot be opened or written is reported once (failed()) and recording stops; the app goes on.

#include <QObject>
#include <QThread>
#include <QTimer>
#include <chrono>
#include <map>
#include <memory>
#include <optional>

#include "Types.h"
#include "lockstep/history/history.h"

namespace lockstep::app {

class HistoryRecorder : public QObject {
  Q_OBJECT

 public:
  explicit HistoryRecorder(QString path);
  ~HistoryRecorder() override;

  QString path() const { return path_; }
  void start();  // from the GUI thread

 public Q_SLOTS:
  void onHello(QString agentId, lockstep::app::HelloPtr hello);
  void onClock(QString agentId, QString node, lockstep::ClockOffset offset);
  void onJobs(QString agentId, lockstep::app::JobList jobs);
  void onMessages(QString agentId, lockstep::app::MessageBatch messages);

 Q_SIGNALS:
  void opened(bool ok, QString message);
  void failed(QString message);
  // Something was written (at most once a second): history views re-read.
  void changed();

 private:
  void open();
  void tick();
  void compact();
  void fail(const Error& error);  // reports once and stops recording
  void flush();                   // writes the pending messages

  const QString path_;
  QThread thread_;
  QTimer* timer_ = nullptr;
  std::optional<history::History> history_;
  QTimer* flushTimer_ = nullptr;
  std::vector<StreamMessage> pending_;  // messages not written yet, in arrival order
  std::map<QString, std::string> nodeOfAgent_;
  bool dirty_ = false;
  std::chrono::steady_clock::time_point nextCompact_;
};

}  // namespace lockstep::app
