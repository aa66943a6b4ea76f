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
  QString agentId(int row) const;

 private:
  QVariant slurmData(const SlurmClusterEntry& cluster, int column, int role) const;
  const ClusterStore& store_;
  int rows_ = 0;  // agents, then Slurm clusters
};

class GpusModel : public RefreshedTableModel {
  Q_OBJECT
 public:
  enum Column { kNode, kGpu, kName, kUtil, kMemory, kPower, kTemp, kJob };
  explicit GpusModel(const ClusterStore& store, QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  void refresh();

 private:
  const ClusterStore& store_;
  std::vector<GpuEntry> rows_;
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
  const ClusterStore& store_;
  std::vector<const JobEntry*> rows_;
  std::vector<std::shared_ptr<const LiveJob::Published>> published_;  // taken once per refresh
};

// Text and colour for a job state, shared by the jobs list and the dashboard.
QString jobStateText(JobState state);
QColor jobStateColor(JobState state, const QPalette& palette);
// An interface's throughput against its link, for the cluster view and the dashboard.
QString networkText(const kpi::NetRate& rate);

}  // namespace lockstep::app
