#pragma once
// The History window: every job recorded in the history file, searchable and filterable by state;
// open one to see its dashboard as it was, compare several (KPIs side by side, scaling against
// ranks), export a report, delete. It reads the file through its own connection on the GUI thread
// and re-reads when the recorder says something changed.

#include <QDialog>
#include <QWidget>
#include <optional>

#include "Models.h"
#include "lockstep/history/history.h"
#include "lockstep/report/report.h"

QT_BEGIN_NAMESPACE
class QComboBox;
class QLabel;
class QLineEdit;
class QPushButton;
class QTableView;
QT_END_NAMESPACE

namespace lockstep::app {

class DashboardWidget;

class HistoryModel : public RefreshedTableModel {
  Q_OBJECT
 public:
  enum Column { kJob, kName, kState, kOwner, kStarted, kDuration, kRanks, kNodes, kThroughput, kEfficiency, kComm, kGpuUtil, kMfu, kCost };
  explicit HistoryModel(QObject* parent = nullptr);
  int rowCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  void set(std::vector<history::JobRecord> rows);
  const history::JobRecord& record(int row) const { return rows_.at(static_cast<std::size_t>(row)); }
  int rowOf(const QString& jobId) const;

 private:
  std::vector<history::JobRecord> rows_;
};

class HistoryWindow : public QWidget {
  Q_OBJECT
 public:
  HistoryWindow(ClusterStore& store, QString historyPath, QWidget* parent = nullptr);

  HistoryModel* model() const { return model_; }
  QTableView* view() const { return view_; }
  void setSearch(const QString& text);
  void setStateFilter(std::optional<JobState> state);
  void select(const QStringList& jobIds);
  QStringList selectedJobs() const;
  // Ask before deleting (the default); tests turn it off.
  void setConfirmDeletes(bool confirm) { confirmDeletes_ = confirm; }

  // The actions of the buttons, on the selected jobs; they return the window or dialog they opened.
  QWidget* openSelected();
  QDialog* compareSelected();
  void exportSelected();
  void deleteSelected();

 public Q_SLOTS:
  void reload();

 private:
  void updateButtons();
  std::optional<history::History>& db();

  ClusterStore& store_;
  QString path_;
  std::optional<history::History> history_;
  bool confirmDeletes_ = true;
  QLineEdit* search_;
  QComboBox* state_;
  QTableView* view_;
  HistoryModel* model_;
  QLabel* status_;
  QPushButton *open_, *compare_, *export_, *delete_;
};

// A recorded job's dashboard, in a window of its own.
class RecordedJobWindow : public QWidget {
  Q_OBJECT
 public:
  RecordedJobWindow(ClusterStore& store, std::shared_ptr<const JobEntry> job, QString historyPath,
                    QWidget* parent = nullptr);
  DashboardWidget* dashboard() const { return dashboard_; }

 private:
  DashboardWidget* dashboard_;
};

// Jobs side by side, and their scaling against ranks when they share a workload.
class CompareDialog : public QDialog {
  Q_OBJECT
 public:
  CompareDialog(const std::vector<history::JobRecord>& jobs, QWidget* parent = nullptr);
  const report::Comparison& comparison() const { return comparison_; }

 private:
  report::Comparison comparison_;
};

// A job from the history as the dashboard shows it: spec, state, and its KPI tracker replayed,
// with the KPIs as of its end (or of the last report recorded, if it never ended).
Result<std::shared_ptr<const JobEntry>> loadRecordedJob(const history::History& history, const std::string& jobId);

// Writes the job's report; the format from the file's extension.
Result<void> exportReport(const history::History& history, const std::string& jobId, const std::string& path);
// Asks where (and so in which format), writes, and says how it went.
void exportReportDialog(QWidget* parent, const QString& historyPath, const QString& jobId);
// The same for the job's trace (report/trace.h): Chrome trace JSON, gzip when named .gz.
void exportTraceDialog(QWidget* parent, const QString& historyPath, const QString& jobId);

}  // namespace lockstep::app
