#pragma once
// What the app knows about its agents, their nodes and GPUs, and the jobs on them, in the GUI
// thread. It owns one AgentWorker thread per agent and merges what they report; models and views
// read from it and listen to its change signals (which may come in bursts: views coalesce).

#include <QHash>
#include <QObject>
#include <QString>
#include <QThread>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "AlertLog.h"
#include "Ingest.h"
#include "Types.h"
#include "lockstep/client/agent_client.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/report/diagnosis.h"

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

// A Slurm cluster the launcher can send jobs to (docs/cluster.md): its login host is this one,
// where sbatch runs; partition and account are the launcher's defaults.
struct SlurmClusterEntry {
  QString login;
  QString partition, account;
};

struct GpuEntry {
  QString agentId;
  std::string node;
  GpuInfo info;
  std::optional<GpuSample> latest;
};

struct JobEntry {
  std::string id;
  JobSpec spec;  // set with setSpec, which also lists its nodes
  std::vector<std::string> nodes;  // the spec's ranks' nodes, each once, in the ranks' order
  std::map<QString, JobStatus> parts;  // by agent id
  Supervision supervision;  // from the agent that supervises the job (docs/agent.md), of any attempt
  QString supervisor;       // that agent's id, while it is connected and says so
  std::shared_ptr<LiveJob> live;  // its KPIs, fed off the GUI thread (Ingest)
  JobState state = JobState::kStarting;  // jobOutcome: its supervisor's verdict, else its parts'
  bool over = false;                     // jobOver: the verdict is in, else every part ended
  QString message;
  std::int64_t startedUnixUs = 0;

  // Its stall across its parts (kpi::jobStall); unset while it moves, or once it ended.
  std::optional<Stall> stall() const;
  // Whether it runs a program that reports no steps: stacks, but no stall detection.
  bool unjudged() const;
  // The spec, and its nodes once each (the dashboard's every refresh reads them: at 16,384 ranks
  // not worked out again each time).
  void setSpec(JobSpec s);
};

class ClusterStore : public QObject {
  Q_OBJECT

 public:
  // With a recorder, every agent's worker also reports to it (the job history).
  // fanIn: which jobs are watched through their supervising agent's frames (FanIn.h).
  explicit ClusterStore(CurveKeyPair keys, HistoryRecorder* history = nullptr, QObject* parent = nullptr,
                        FanInRule fanIn = {});
  ~ClusterStore() override;

  const CurveKeyPair& keys() const { return keys_; }
  const FanInRule& fanIn() const { return fanIn_->rule(); }
  void addAgent(const AgentAddress& address, const std::string& publicKey);
  void removeAgent(const QString& id);

  const std::vector<std::unique_ptr<AgentEntry>>& agents() const { return agents_; }
  void addSlurmCluster(SlurmClusterEntry cluster);
  const std::vector<SlurmClusterEntry>& slurmClusters() const { return slurmClusters_; }
  const AgentEntry* agent(const QString& id) const;
  int agentRow(const QString& id) const;  // its index in agents(); -1 if none
  std::vector<GpuEntry> gpus() const;
  // A node's newest GPU sample of that GPU, if its agent sent one.
  std::optional<GpuSample> latestGpu(const std::string& node, std::uint32_t gpuIndex) const;
  // Counts what changed, for views that update only that (GpusModel): the GPUs' layout (agents
  // added, removed or saying hello) and each publication of nodes' figures.
  std::uint64_t gpuLayoutSerial() const { return gpuLayoutSerial_; }
  std::uint64_t nodesSerial() const { return nodesSerial_; }
  // The nodes whose figures came in after publication `serial` (nodesSerial() then).
  std::vector<std::string> nodesChangedSince(std::uint64_t serial) const;
  std::vector<const JobEntry*> jobs() const;  // oldest first
  const JobEntry* job(const std::string& id) const;
  // The agent's node's interfaces, busiest first (the newest throughput of each).
  std::vector<kpi::NetRate> network(const QString& agentId) const;
  // The link a job's ranks on several nodes talk over, for report::diagnoseCommunication: the
  // slowest of its nodes' fastest known links. Empty for a job on one node (its ranks talk over
  // loopback or shared memory) or when a node's link speed is not known.
  std::optional<report::BandwidthReference> linkOf(const JobSpec& spec) const;
  std::optional<report::BandwidthReference> linkOf(const std::vector<std::string>& nodes) const;
  // Each of a job's nodes with its busiest interface, where its agent has sampled one.
  std::vector<std::pair<std::string, kpi::NetRate>> networkOf(const JobSpec& spec) const;
  std::vector<std::pair<std::string, kpi::NetRate>> networkOf(const std::vector<std::string>& nodes) const;

  // Whether the spec may take its id: a restart is a later attempt of a job the store holds; a new
  // job's id is one neither the store nor the history holds (history::checkNewJobId).
  Result<void> idFree(const JobSpec& spec) const;
  // Places a job: ranks per agent id (agents with 0 are left out). Errors say what is wrong.
  Result<JobSpec> place(const JobSpec& spec, const std::vector<std::pair<QString, std::uint32_t>>& ranks) const;
  const AgentEntry* agentOfNode(const std::string& node) const;  // connected or not

  // Commands to an agent, through its worker's thread (JobControl sends them); answered with
  // jobStarted and commandDone carrying the same tag. false: there is no such agent (no answer).
  bool startOn(const QString& agentId, quint64 tag, const JobSpec& spec, const QString& storeSecret);
  bool stopOn(const QString& agentId, quint64 tag, const std::string& jobId);
  void setJobMessage(const std::string& jobId, const QString& message);

  // What an agent's worker reports lands here (queued to the GUI thread); its messages go straight
  // from the worker to the ingest thread. Anything else holding an agent's data may feed it the
  // same way: bench/app_load.cpp does, to load the GUI at 128 x 8 GPUs. onMessages may be called
  // from any thread; what it brings shows once the ingest thread has published it (jobDataChanged).
  void onHello(QString id, HelloPtr hello);
  void onJobs(QString id, JobList jobs);
  void onMessages(QString id, MessageBatch messages);
  Ingest& ingest() const { return *ingest_; }
  // The jobs' alerts as their streams bring them (the ingest thread reads them), and this app's silences.
  AlertLog& alerts() const { return *alerts_; }

 Q_SIGNALS:
  void agentsChanged();  // agents came or went, said hello, or their network figures moved on
  void agentChanged(QString id);  // that agent's state
  void gpusChanged();
  void jobsChanged();
  void jobDataChanged(QString jobId);
  // An agent's answers to startOn/stopOn, from its worker.
  void jobStarted(quint64 tag, QString agentId, quint32 rendezvousPort, QString storeSecret);
  void commandDone(quint64 tag, bool ok, QString message, int errorCode);

 private:
  AgentEntry* findAgent(const QString& id);
  // Moves the agent to its place in natural order of the node names (its id before its hello).
  void placeAgent(AgentEntry* agent);
  JobEntry& jobEntry(const JobSpec& spec);
  // Whether the job's spec at the stub's attempt (or a later one) is held: a status whose spec was
  // left out (JobStatus::specOmitted) needs it.
  bool knowsSpec(const JobSpec& stub) const;
  void updateJobState(JobEntry& job);
  void onState(QString id, AgentState state, QString message);
  void onPublished(QStringList jobIds);
  void onNodes(NodeFigures nodes);
  const kpi::NodeKpis* nodeFigures(const QString& agentId) const;

  CurveKeyPair keys_;
  const std::shared_ptr<FanInBook> fanIn_;  // the workers' and the ingest's
  HistoryRecorder* history_;
  std::unique_ptr<AlertLog> alerts_;
  std::unique_ptr<Ingest> ingest_;  // outlives the workers, which feed it
  std::vector<std::unique_ptr<AgentEntry>> agents_;  // in natural order of their nodes (placeAgent)
  QHash<QString, AgentEntry*> byId_;
  std::unordered_map<std::string, AgentEntry*> byNode_;  // those that said hello
  std::vector<SlurmClusterEntry> slurmClusters_;
  std::map<std::string, std::unique_ptr<JobEntry>> jobs_;
  std::vector<std::string> jobOrder_;
  struct NodeEntry {
    kpi::NodeKpis figures;
    std::uint64_t serial = 0;  // the publication that brought them
  };
  std::unordered_map<std::string, NodeEntry> nodes_;  // by node name, as the ingest published them
  std::uint64_t nodesSerial_ = 0, gpuLayoutSerial_ = 0;
  std::int64_t networkShownUs_ = 0;  // the agents' view shows the network once a second
  bool networkPending_ = false;
};

}  // namespace lockstep::app
