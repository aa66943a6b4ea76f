#pragma once
// Launching, stopping and following jobs from the app: the Qt adapter of the client core's
// Launcher (lockstep/client), the state machine lockstepctl drives too. It sends commands through
// the cluster store's agent workers. A job's supervision (stopping a failed job's other parts,
// restarts) is its supervising agent's (docs/agent.md); this follows what it did, in the store.

#include <QObject>
#include <QString>
#include <map>
#include <string>

#include "ClusterStore.h"
#include "lockstep/client/launcher.h"

namespace lockstep::app {

class JobControl : public QObject {
  Q_OBJECT

 public:
  explicit JobControl(ClusterStore& store, QObject* parent = nullptr);

  // Starts a placed job (ClusterStore::place); answers with launchFinished. The app then follows
  // it to its end and says when its supervising agent restarted it, or did not.
  void launch(const JobSpec& placed);
  // Stops every running part of a job; answers with stopFinished.
  void stopJob(const std::string& jobId);

 Q_SIGNALS:
  void launchFinished(QString jobId, bool ok, QString message);
  void stopFinished(QString jobId, bool ok, QString message);
  // A job this app launched with max_restarts lost ranks or a node: restarted, or not (and why).
  void jobRestarted(QString jobId, QString message);
  void restartRefused(QString jobId, QString message);

 private:
  struct Followed {
    std::uint32_t attempt = 0;  // the last attempt seen
  };
  struct Stop {
    int outstanding = 0;
    QString error;
  };

  void onJobStarted(quint64 tag, QString agentId, quint32 port, QString storeSecret);
  void onCommandDone(quint64 tag, bool ok, QString message, int errorCode);
  void pump(const std::string& jobId);  // sends what the job's launcher has to send
  void launchEnded(const std::string& jobId);
  void failOrphanedStarts();
  void follow();

  ClusterStore& store_;
  quint64 nextTag_ = 1;
  std::map<std::string, Launcher> launches_;
  std::map<quint64, std::pair<std::string, std::string>> startTags_;  // tag -> job, node
  std::map<quint64, std::string> stopTags_;
  std::map<std::string, Stop> stops_;
  std::map<std::string, Followed> followed_;  // the jobs launched here, until they end
};

}  // namespace lockstep::app
