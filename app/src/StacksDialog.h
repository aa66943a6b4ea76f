#pragma once
// What a running job's ranks are doing now (docs/stalls.md): each agent of the job is asked for its
// ranks' evidence (StacksRequest: process state, threads, Python stacks or gdb's backtrace, the end
// of the log), on a connection of its own off the GUI thread, since taking stacks may need up to a
// minute; the dialog shows them rank by rank as they come, as `lockstepctl stacks` prints them.

#include <QDialog>
#include <QString>
#include <vector>

#include "lockstep/protocol/types.h"

class QLabel;
class QPlainTextEdit;

namespace lockstep::app {

class ClusterStore;

class StacksDialog : public QDialog {
  Q_OBJECT
 public:
  StacksDialog(const ClusterStore& store, const QString& jobId, QWidget* parent = nullptr);

  QString text() const;  // what it shows (tests)
  bool done() const { return waiting_ == 0; }

 private:
  void take();
  void arrived(const QString& agent, const Result<StacksReply>& reply);
  void render();

  const ClusterStore& store_;
  QString jobId_;
  QLabel* status_;
  QPlainTextEdit* text_;
  std::vector<RankEvidence> ranks_;
  QStringList problems_;
  int waiting_ = 0;
};

}  // namespace lockstep::app
