#pragma once
// Table models over the ClusterStore: agents, GPUs, jobs. refresh() re-reads the store (called on a
// coalescing timer, not per message); rows keep their order, so selections survive updates.

#include <QAbstractTableModel>
#include <vector>

#include "ClusterStore.h"

namespace lockstep::app {

// A table with fixed, named columns whose rows only ever change all at once (a refresh): reset
// when the count changes, else say all cells may have changed (selections survive).
class RefreshedTableModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  RefreshedTableModel(QStringList headers, QObject* parent);
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

 protected:
  void resetOrUpdate(int oldRows, int newRows);

 private:
  QStringList headers_;
};

class AgentsModel : public RefreshedTableModel {
  Q_OBJECT
 public:
  enum Column { kAgent, kNode, kState, kCores, kGpus, kNetwork };
  explicit AgentsModel(const ClusterStore& store, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  void refresh();
  void refreshAgent(const QString& id);  // that agent's row only (its state changed)
  QString agentId(int row) const;

 private:
  QVariant slurmData(const SlurmClusterEntry& cluster, int column, int role) const;
  const ClusterStore& store_;
  int rows_ = 0;  // agents, then Slurm clusters
};

// Its rows are read again from the store only when the GPUs' layout changed (an agent came, went
// or said hello); else only the rows of the nodes whose figures came in since the last refresh
// take their newest samples, and only they are said to have changed.
class GpusModel : public RefreshedTableModel {
  Q_OBJECT
 public:
  enum Column { kNode, kGpu, kName, kUtil, kMemory, kPower, kTemp, kJob };
  explicit GpusModel(const ClusterStore& store, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  void refresh();

 private:
  void updateSamples();
  const ClusterStore& store_;
  std::vector<GpuEntry> rows_;
  std::unordered_map<std::string, std::vector<int>> rowsOfNode_;
  std::uint64_t layoutSerial_ = 0, nodesSerial_ = 0;  // of the store, as last read
  bool read_ = false;
};

class JobsModel : public RefreshedTableModel {
  Q_OBJECT
 public:
  enum Column { kJob, kState, kOwner, kRanks, kNodes, kStep, kLoss, kThroughput, kStarted };
  explicit JobsModel(const ClusterStore& store, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  void refresh();
  QString jobId(int row) const;
  int rowOf(const QString& jobId) const;

 private:
  // What a row shows, worked out once per refresh: its stall, owners and nodes go over every part
  // of the job (2,048 at 16,384 GPUs), and the view asks for each cell many times (sizing, paint).
  struct Row {
    const JobEntry* job;
    std::shared_ptr<const LiveJob::Published> published;
    std::optional<Stall> stall;
    QString owner, nodes;
  };
  Row rowFor(const JobEntry& job) const;
  const ClusterStore& store_;
  std::vector<Row> rows_;
};

// Text and colour for a job state, shared by the jobs list and the dashboard.
QString jobStateText(JobState state);
QColor jobStateColor(JobState state, const QPalette& palette);
// A live job's, as its jobs table row and dashboard show it: "restarting" (coloured as starting)
// while its supervisor restarts it (protocol's jobStateWord).
QString jobStateText(const JobEntry& job);
QColor jobStateColor(const JobEntry& job, const QPalette& palette);
// An interface's throughput against its link, for the cluster view and the dashboard.
QString networkText(const kpi::NetRate& rate);

}  // namespace lockstep::app
