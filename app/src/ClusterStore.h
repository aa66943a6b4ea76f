#pragma once
// What the app knows about its agents, their nodes and GPUs, and the jobs on them, in the GUI
// thread. It owns one AgentWorker thread per agent and merges what they report; models and views
// read from it and listen to its change signals (which may come in bursts: views coalesce).

#include <QObject>
#include <QString>
#include <QThread>
#include <QTimer>
#include <chrono>
#include <set>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "Types.h"
#include "lockstep/client/agent_client.h"
#include "lockstep/kpi/kpi.h"

namespace lockstep::app {

class AgentWorker;
class HistoryRecorder;

struct AgentEntry {
  QString id;  // HOST:PORT
  AgentAddress address;
  std::string publicKey;
  AgentState state = AgentState::kConnecting;
  QString message;
  std::optional<NodeHello> hello;
  std::vector<JobStatus> jobs;
  QThread* thread = nullptr;
  AgentWorker* worker = nullptr;
};

struct GpuEntry {
  QString agentId;
  std::string node;
  GpuInfo info;
  std::optional<GpuSample> latest;
};

struct JobEntry {
  std::string id;
  JobSpec spec;
  std::map<QString, JobStatus> parts;  // by agent id
  std::unique_ptr<kpi::JobTracker> tracker;
  JobState state = JobState::kStarting;
  QString message;
  std::int64_t startedUnixUs = 0;
};

class ClusterStore : public QObject {
  Q_OBJECT

 public:
  // With a recorder, every agent's worker also reports to it (the job history).
  explicit ClusterStore(CurveKeyPair keys, HistoryRecorder* history = nullptr, QObject* parent = nullptr);
  ~ClusterStore() override;

  const CurveKeyPair& keys() const { return keys_; }
  void addAgent(const AgentAddress& address, const std::string& publicKey);
  void removeAgent(const QString& id);

  const std::vector<std::unique_ptr<AgentEntry>>& agents() const { return agents_; }
  const AgentEntry* agent(const QString& id) const;
  std::vector<GpuEntry> gpus() const;
  std::vector<const JobEntry*> jobs() const;  // oldest first
  const JobEntry* job(const std::string& id) const;

  // Places a job: ranks per agent id (agents with 0 are left out). Errors say what is wrong.
  Result<JobSpec> place(const JobSpec& spec, const std::vector<std::pair<QString, std::uint32_t>>& ranks) const;
  // Starts a placed job: rank 0's agent first (its store port goes to the others), then the rest;
  // a failure stops the parts already started. Answers with launchFinished.
  void launch(const JobSpec& placed);
  // Stops every part of a job; answers with stopFinished.
  void stopJob(const std::string& jobId);

  // What an agent's worker reports lands here (queued to the GUI thread). Anything else holding an
  // agent's data may feed it the same way: bench/app_load.cpp does, to load the GUI at 8 x 8 GPUs.
  void onHello(QString id, HelloPtr hello);
  void onJobs(QString id, JobList jobs);
  void onMessages(QString id, MessageBatch messages);

 Q_SIGNALS:
  void agentsChanged();
  void gpusChanged();
  void jobsChanged();
  void jobDataChanged(QString jobId);
  void launchFinished(QString jobId, bool ok, QString message);
  void stopFinished(QString jobId, bool ok, QString message);
  // A job this app launched with max_restarts lost ranks or a node: restarted, or not (and why).
  void jobRestarted(QString jobId, QString message);
  void restartRefused(QString jobId, QString message);

 private:
  AgentEntry* findAgent(const QString& id);
  AgentEntry* agentOfNode(const std::string& node);
  JobEntry& jobEntry(const JobSpec& spec);
  void updateJobState(JobEntry& job);
  void onState(QString id, AgentState state, QString message);
  void onJobStarted(quint64 tag, QString id, quint32 port, QString storeSecret);
  void onCommandDone(quint64 tag, bool ok, QString message);
  // Elastic restarts of the jobs this app launched (docs/agent.md): checked on every job list,
  // agent state change, and once a second.
  void supervise();
  void supervise(JobEntry& job);

  struct Launch {
    JobSpec spec;
    std::vector<QString> pending;  // agents still to start, after rank 0's
    std::vector<QString> started;
    int outstanding = 0;
    bool failed = false;
  };
  struct Stop {
    std::string jobId;
    int outstanding = 0;
    QString error;
  };

  CurveKeyPair keys_;
  kpi::Settings trackerSettings(const JobSpec& spec) const;
  HistoryRecorder* history_;
  std::vector<std::unique_ptr<AgentEntry>> agents_;
  std::map<std::string, std::unique_ptr<JobEntry>> jobs_;
  std::vector<std::string> jobOrder_;
  std::map<std::pair<QString, std::uint32_t>, GpuSample> gpuSamples_;
  quint64 nextTag_ = 1;
  std::set<std::string> supervised_;  // launched here with max_restarts
  std::set<std::string> restarting_;  // a restart is being launched
  std::map<std::string, std::chrono::steady_clock::time_point> failingSince_;
  QTimer superviseTimer_;
  std::map<quint64, std::string> launchOfTag_;
  std::map<std::string, Launch> launches_;
  std::map<quint64, std::string> stopOfTag_;
  std::map<std::string, Stop> stops_;
};

}  // namespace lockstep::app
