#pragma once
// What the app knows about its agents, their nodes and GPUs, and the jobs on them, in the GUI
// thread. It owns one AgentWorker thread per agent and merges what they report; models and views
// read from it and listen to its change signals (which may come in bursts: views coalesce).

#include <QObject>
#include <QString>
#include <QThread>
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
  // The worker lives in the thread; both go together (ClusterStore::closeAgent).
  std::unique_ptr<QThread> thread;
  std::unique_ptr<AgentWorker> worker;
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
  Supervision supervision;  // from the agent that supervises the job (docs/agent.md), of any attempt
  QString supervisor;       // that agent's id, while it is connected and says so
  std::unique_ptr<kpi::JobTracker> tracker;
  std::uint64_t version = 0;  // counts the messages its tracker took
  struct KpiMemo {
    std::uint64_t version = ~0ull;
    std::int64_t atUs = 0;
    kpi::JobKpis kpis;
  };
  mutable KpiMemo kpiMemo;  // liveKpis's
  JobState state = JobState::kStarting;
  QString message;
  std::int64_t startedUnixUs = 0;
};

// The job's KPIs now, worked out once per batch of messages: the jobs list and the dashboard ask
// for them in the same refresh, and a snapshot of 1024 ranks is not free. Without new messages
// one is kept 200 ms.
const kpi::JobKpis& liveKpis(const JobEntry& job, std::int64_t nowUnixUs);

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
  const AgentEntry* agentOfNode(const std::string& node) const;  // connected or not

  // Commands to an agent, through its worker's thread (JobControl sends them); answered with
  // jobStarted and commandDone carrying the same tag. false: there is no such agent (no answer).
  bool startOn(const QString& agentId, quint64 tag, const JobSpec& spec, const QString& storeSecret);
  bool stopOn(const QString& agentId, quint64 tag, const std::string& jobId);
  void setJobMessage(const std::string& jobId, const QString& message);

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
  // An agent's answers to startOn/stopOn, from its worker.
  void jobStarted(quint64 tag, QString agentId, quint32 rendezvousPort, QString storeSecret);
  void commandDone(quint64 tag, bool ok, QString message, int errorCode);

 private:
  AgentEntry* findAgent(const QString& id);
  JobEntry& jobEntry(const JobSpec& spec);
  void updateJobState(JobEntry& job);
  void onState(QString id, AgentState state, QString message);
  kpi::Settings trackerSettings(const JobSpec& spec) const;

  CurveKeyPair keys_;
  HistoryRecorder* history_;
  std::vector<std::unique_ptr<AgentEntry>> agents_;
  std::map<std::string, std::unique_ptr<JobEntry>> jobs_;
  std::vector<std::string> jobOrder_;
  std::map<std::pair<QString, std::uint32_t>, GpuSample> gpuSamples_;
};

}  // namespace lockstep::app
