#include "Models.h"

#include <QColor>
#include <QDateTime>
#include <QGuiApplication>
#include <QPalette>
#include <chrono>
#include <cmath>

#include "Present.h"
#include "lockstep/common/clock.h"

namespace lockstep::app {
namespace {

QString number(double v, int decimals) { return qtext(present::number(v, decimals)); }

}  // namespace

RefreshedTableModel::RefreshedTableModel(QStringList headers, QObject* parent)
    : QAbstractTableModel(parent), headers_(std::move(headers)) {}

int RefreshedTableModel::columnCount(const QModelIndex& parent) const {
  return parent.isValid() ? 0 : static_cast<int>(headers_.size());
}

QVariant RefreshedTableModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole || section < 0 || section >= headers_.size()) return {};
  return headers_[section];
}

void RefreshedTableModel::resetOrUpdate(int oldRows, int newRows) {
  if (oldRows != newRows) {
    beginResetModel();
    endResetModel();
  } else if (newRows > 0) {
    Q_EMIT dataChanged(index(0, 0), index(newRows - 1, columnCount() - 1));
  }
}

QString jobStateText(JobState state) { return QString::fromUtf8(std::string(jobStateName(state)).c_str()); }

QString jobStateText(const JobEntry& job) {
  return QString::fromUtf8(std::string(jobStateWord(job.supervision, job.state)).c_str());
}

QColor jobStateColor(const JobEntry& job, const QPalette& palette) {
  return jobStateColor(restarting(job.supervision) ? JobState::kStarting : job.state, palette);
}

QColor jobStateColor(JobState state, const QPalette& palette) {
  const bool dark = palette.color(QPalette::Window).lightness() < 128;
  switch (state) {
    case JobState::kRunning:
    case JobState::kStarting: return dark ? QColor(90, 170, 255) : QColor(20, 100, 200);
    case JobState::kFinished: return dark ? QColor(110, 200, 120) : QColor(30, 130, 50);
    case JobState::kFailed: return dark ? QColor(255, 110, 100) : QColor(190, 30, 30);
    case JobState::kStopped: return dark ? QColor(230, 180, 80) : QColor(160, 110, 0);
  }
  return palette.color(QPalette::Text);
}

// ---- agents ----

AgentsModel::AgentsModel(const ClusterStore& store, QObject* parent)
    : RefreshedTableModel({tr("Agent"), tr("Node"), tr("State"), tr("Cores"), tr("GPUs"), tr("Network")}, parent),
      store_(store) {}
int AgentsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : rows_; }

// "eth0 ↓1.20 Gb/s ↑800 Mb/s of 25.0 Gb/s (5%)": an interface's throughput against its link.
QString networkText(const kpi::NetRate& r) { return QString::fromStdString(present::networkRate(r)); }

// A Slurm cluster's row, after the agents': where the launcher can submit to.
QVariant AgentsModel::slurmData(const SlurmClusterEntry& c, int column, int role) const {
  if (role == Qt::ToolTipRole) {
    return tr("Slurm cluster: jobs are submitted with sbatch on %1 (New Job ▸ Where)").arg(c.login);
  }
  if (role != Qt::DisplayRole) return {};
  switch (column) {
    case kAgent: return tr("Slurm via %1").arg(c.login);
    case kNode: return c.partition.isEmpty() ? tr("default partition") : tr("partition %1").arg(c.partition);
    case kState: return tr("submits jobs");
    default: return dash();
  }
}

QVariant AgentsModel::data(const QModelIndex& index, int role) const {
  const auto agents = static_cast<int>(store_.agents().size());
  const auto& clusters = store_.slurmClusters();  // rows_ may lag the store until the next refresh
  if (index.isValid() && index.row() >= agents && index.row() < rows_ &&
      static_cast<std::size_t>(index.row() - agents) < clusters.size()) {
    return slurmData(clusters[static_cast<std::size_t>(index.row() - agents)], index.column(), role);
  }
  if (!index.isValid() || index.row() >= agents) return {};
  const AgentEntry& a = *store_.agents()[static_cast<std::size_t>(index.row())];
  if (role == Qt::ToolTipRole && index.column() == kNetwork) {
    QStringList lines;
    for (const auto& r : store_.network(a.id)) {
      lines << networkText(r) + (r.newErrors ? tr(", %1 errors or drops").arg(r.newErrors) : QString());
    }
    return lines.isEmpty() ? QVariant() : QVariant(lines.join(QLatin1Char('\n')));
  }
  if (role == Qt::ToolTipRole && index.column() == kNode) {
    return tr("agent at %1").arg(a.id) + (a.message.isEmpty() ? QString() : QStringLiteral("\n") + a.message);
  }
  if (role == Qt::ToolTipRole) return a.message.isEmpty() ? QVariant() : QVariant(a.message);
  if (role == Qt::ForegroundRole && index.column() == kState) {
    const bool bad = a.state == AgentState::kNotAuthorized || a.state == AgentState::kWrongKey;
    const bool waiting = a.state == AgentState::kReconnecting || a.state == AgentState::kConnecting;
    return bad ? jobStateColor(JobState::kFailed, QGuiApplication::palette())
               : waiting ? jobStateColor(JobState::kStopped, QGuiApplication::palette()) : QVariant();
  }
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case kAgent: return a.id;
    case kNode: return a.hello ? QString::fromStdString(a.hello->nodeName) : dash();
    case kState: return agentStateText(a.state);
    case kCores: return a.hello ? QVariant(a.hello->cpuCores) : QVariant(dash());
    case kGpus:
      if (!a.hello) return dash();
      return a.hello->gpus.empty() ? tr("CPU only") : QString::number(a.hello->gpus.size());
    case kNetwork: {
      const auto interfaces = store_.network(a.id);
      return interfaces.empty() ? dash() : networkText(interfaces.front());
    }
  }
  return {};
}

void AgentsModel::refresh() {
  const int old = rows_;
  rows_ = static_cast<int>(store_.agents().size() + store_.slurmClusters().size());
  resetOrUpdate(old, rows_);
}

void AgentsModel::refreshAgent(const QString& id) {
  const int row = store_.agentRow(id);
  if (row >= 0 && row < rows_) Q_EMIT dataChanged(index(row, 0), index(row, columnCount() - 1));
}

QString AgentsModel::agentId(int row) const {
  return row >= 0 && row < static_cast<int>(store_.agents().size()) ? store_.agents()[static_cast<std::size_t>(row)]->id
                                                                      : QString();
}

// ---- GPUs ----

GpusModel::GpusModel(const ClusterStore& store, QObject* parent)
    : RefreshedTableModel({tr("Node"), tr("GPU"), tr("Name"), tr("Util %"), tr("Memory"), tr("Power"), tr("Temp"), tr("Job")}, parent), store_(store) {}
int GpusModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }

QVariant GpusModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size())) return {};
  const GpuEntry& g = rows_[static_cast<std::size_t>(index.row())];
  if (role == Qt::TextAlignmentRole && index.column() >= kUtil && index.column() <= kTemp) {
    return QVariant(Qt::AlignRight | Qt::AlignVCenter);
  }
  if (role != Qt::DisplayRole) return {};
  const auto& s = g.latest;
  switch (index.column()) {
    case kNode: return QString::fromStdString(g.node);
    case kGpu: return g.info.index;
    case kName: return QString::fromStdString(g.info.name);
    case kUtil: return s && s->utilizationPct ? number(*s->utilizationPct, 0) : dash();
    case kMemory:
      return s && s->memoryUsedBytes
                 ? QStringLiteral("%1 / %2 GiB").arg(number(*s->memoryUsedBytes / 1073741824.0, 1),
                                                     number(g.info.memoryTotalBytes / 1073741824.0, 0))
                 : dash();
    case kPower: return s && s->powerMilliwatts ? QStringLiteral("%1 W").arg(number(*s->powerMilliwatts / 1000.0, 0)) : dash();
    case kTemp: return s && s->temperatureC ? QStringLiteral("%1 °C").arg(*s->temperatureC) : dash();
    case kJob: return s && !s->jobId.empty() ? QString::fromStdString(s->jobId) : QString();
  }
  return {};
}

void GpusModel::refresh() {
  if (read_ && layoutSerial_ == store_.gpuLayoutSerial()) return updateSamples();
  read_ = true;
  layoutSerial_ = store_.gpuLayoutSerial();
  nodesSerial_ = store_.nodesSerial();
  const int old = static_cast<int>(rows_.size());
  rows_ = store_.gpus();
  rowsOfNode_.clear();
  for (int i = 0; i < static_cast<int>(rows_.size()); ++i) rowsOfNode_[rows_[static_cast<std::size_t>(i)].node].push_back(i);
  resetOrUpdate(old, static_cast<int>(rows_.size()));
}

// The newest samples of the nodes that reported, said as changed in runs of adjacent rows.
void GpusModel::updateSamples() {
  std::vector<int> changed;
  for (const auto& node : store_.nodesChangedSince(nodesSerial_)) {
    const auto it = rowsOfNode_.find(node);
    if (it == rowsOfNode_.end()) continue;
    for (int row : it->second) {
      GpuEntry& g = rows_[static_cast<std::size_t>(row)];
      g.latest = store_.latestGpu(g.node, g.info.index);
      changed.push_back(row);
    }
  }
  nodesSerial_ = store_.nodesSerial();
  std::sort(changed.begin(), changed.end());
  for (std::size_t i = 0; i < changed.size();) {
    std::size_t end = i + 1;
    while (end < changed.size() && changed[end] == changed[end - 1] + 1) ++end;
    Q_EMIT dataChanged(index(changed[i], 0), index(changed[end - 1], columnCount() - 1));
    i = end;
  }
}

// ---- jobs ----

JobsModel::JobsModel(const ClusterStore& store, QObject* parent)
    : RefreshedTableModel({tr("Job"), tr("State"), tr("Owner"), tr("Ranks"), tr("Nodes"), tr("Step"), tr("Loss"),
                           tr("Samples/s"), tr("Started")},
                          parent),
      store_(store) {}
int JobsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }

QVariant JobsModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= static_cast<int>(rows_.size())) return {};
  const Row& row = rows_[static_cast<std::size_t>(index.row())];
  const JobEntry& j = *row.job;
  const auto& stall = index.column() == kState ? row.stall : std::nullopt;
  if (role == Qt::ForegroundRole && index.column() == kState) {
    return stall ? jobStateColor(JobState::kFailed, QGuiApplication::palette()) : jobStateColor(j, QGuiApplication::palette());
  }
  if (role == Qt::ToolTipRole && stall) return QString::fromStdString(stall->message);
  if (role == Qt::ToolTipRole && !j.message.isEmpty()) return j.message;
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case kJob: return QString::fromStdString(j.id);
    case kState:
      if (stall) return tr("stalled %1").arg(duration(static_cast<double>(unixMicrosNow() - stall->sinceUnixUs) / 1e6));
      return jobStateText(j);
    case kOwner: return row.owner;
    case kRanks: return j.spec.worldSize;
    case kNodes: return row.nodes;
    default: break;
  }
  const LiveJob::Published& shown = *row.published;
  const kpi::JobKpis& k = shown.kpis;
  switch (index.column()) {
    case kStep:
      if (shown.lastReportUnixUs == 0) return dash();  // no step report seen (yet)
      return k.totalSteps ? QStringLiteral("%1 / %2").arg(k.step).arg(k.totalSteps) : QString::number(k.step);
    case kLoss: return k.lastGlobalLoss ? number(*k.lastGlobalLoss, 4) : dash();
    case kThroughput: return figure(present::jobThroughput(k, jobStateEnded(j.state)), 0);
    case kStarted:
      return j.startedUnixUs ? QDateTime::fromMSecsSinceEpoch(j.startedUnixUs / 1000).toString(QStringLiteral("yyyy-MM-dd hh:mm:ss"))
                             : dash();
  }
  return {};
}

JobsModel::Row JobsModel::rowFor(const JobEntry& j) const {
  std::vector<std::string> owners, nodes;
  for (const auto& [agent, part] : j.parts) {
    owners.push_back(part.owner);
    if (const AgentEntry* a = store_.agent(agent); a && a->hello) nodes.push_back(a->hello->nodeName);
  }
  return {&j, j.live->published(), j.stall(), qtext(combinedOwner(owners)), qtext(present::nodesText(nodes))};
}

void JobsModel::refresh() {
  const int old = static_cast<int>(rows_.size());
  rows_.clear();
  for (const auto* j : store_.jobs()) rows_.push_back(rowFor(*j));
  resetOrUpdate(old, static_cast<int>(rows_.size()));
}

QString JobsModel::jobId(int row) const {
  return row >= 0 && row < static_cast<int>(rows_.size()) ? QString::fromStdString(rows_[static_cast<std::size_t>(row)].job->id)
                                                          : QString();
}

int JobsModel::rowOf(const QString& jobId) const {
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    if (QString::fromStdString(rows_[i].job->id) == jobId) return static_cast<int>(i);
  }
  return -1;
}


}  // namespace lockstep::app
