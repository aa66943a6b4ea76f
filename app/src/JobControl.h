#pragma once
// Launching, stopping and supervising jobs from the app: the Qt adapter of the client core's
// Launcher and Supervisor (lockstep/client), the same state machines lockstepctl drives. It sends
// commands through the cluster store's agent workers and follows the jobs it launched in the store.

#include <QObject>
#include <QString>
#include <QTimer>
#include <map>
#include <string>

#include "ClusterStore.h"
#include "lockstep/client/launcher.h"
#include "lockstep/client/supervisor.h"

namespace lockstep::app {

class JobControl : public QObject {
  Q_OBJECT

 public:
  explicit JobControl(ClusterStore& store, QObject* parent = nullptr);

  // Starts a placed job (ClusterStore::place); answers with launchFinished. The app follows it
  // to its end: a failed job's other parts are stopped, and one with max_restarts is restarted.
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
  struct Run {
    Launcher launcher;
    bool restart = false;  // an attempt the supervisor asked for
    QString restartMessage;
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
  void stop(const std::string& jobId, bool answer);  // answer: emit stopFinished (a user's stop)
  void supervise();
  void act(const std::string& jobId, Supervisor::Action action);
  std::vector<EndedPart> partsOf(const JobEntry& job) const;

  ClusterStore& store_;
  quint64 nextTag_ = 1;
  std::map<std::string, Run> launches_;
  std::map<quint64, std::pair<std::string, std::string>> startTags_;  // tag -> job, node
  std::map<quint64, std::string> stopTags_;
  std::map<std::string, Stop> stops_;
  std::map<std::string, Supervisor> supervisors_;  // the jobs launched here, until they end
  QTimer superviseTimer_;
};

}  // namespace lockstep::app
