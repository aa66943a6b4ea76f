#pragma once
// The main window: agents and GPUs on the left, jobs and the selected job's dashboard on the right.
// Views only show and ask; the ClusterStore holds the data. Bursts of updates are merged into one
// repaint on a 40 ms single-shot timer.

#include <QElapsedTimer>
#include <QMainWindow>
#include <QSet>
#include <QTimer>

#include "ClusterStore.h"
#include "JobControl.h"
#include "SlurmLauncher.h"

QT_BEGIN_NAMESPACE
class QAction;
class QDockWidget;
class QLabel;
class QLineEdit;
class QSortFilterProxyModel;
class QSplitter;
class QTableView;
QT_END_NAMESPACE

namespace lockstep::app {

class AgentsModel;
class AlertBanner;
class AlertsPanel;
class DashboardWidget;
class DesktopNotifier;
class GpusModel;
class HistoryRecorder;
class HistoryWindow;
class JobsModel;

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  // configDir holds the app's key pair (app.key/.pub) and the pinned agents (known_agents, shared
  // with lockstepctl); every pinned agent is connected. With a recorder, the History window and
  // report export read the history file it writes.
  MainWindow(ClusterStore& store, QString configDir, HistoryRecorder* history = nullptr, QWidget* parent = nullptr);
  ~MainWindow() override;

  DashboardWidget* dashboard() const { return dashboard_; }
  JobControl& control() { return control_; }  // launches, stops and follows jobs
  SlurmLauncher& slurm() { return slurm_; }    // jobs on a Slurm cluster
  AgentsModel* agentsModel() const { return agentsModel_; }
  JobsModel* jobsModel() const { return jobsModel_; }
  QTableView* jobsView() const { return jobsView_; }
  // Alerts: the banner over the views, the Alerts panel (a dock) and desktop notifications.
  AlertBanner* alertBanner() const { return alertBanner_; }
  AlertsPanel* alertsPanel() const { return alertsPanel_; }
  QDockWidget* alertsDock() const { return alertsDock_; }
  DesktopNotifier* notifier() const { return notifier_; }
  void showAlerts(quint64 serial = 0);  // opens the panel, at that alert
  // Pins the key and connects (Add Agent does this after its dialog).
  Result<void> addAgent(const QString& address, const QString& key);
  void selectJob(const QString& jobId);
  // Refreshes every view now (tests call it instead of waiting for the timer).
  void refreshNow();
  // Past this many agents, the agents' rows are two lines high and their columns sized when
  // agents come or go, not on every change: sizing 2,048 rows to their contents took the GUI thread.
  static constexpr int kAutoSizedAgentRows = 128;
  // The window's first layout, for a screen of `available` size: 1500 x 950 or the screen where
  // it is smaller, a third of the width for the cluster view.
  void applyDefaultLayout(QSize available);

 public Q_SLOTS:
  void newJob();
  void showAppKey();
  void addAgentDialog();
  void addSlurmClusterDialog();
  HistoryWindow* showHistory();  // nullptr without a history
  void exportReport();          // of the job on show

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  // What changed since the last refresh: only those views are refreshed.
  enum Dirty : unsigned { kAgentsDirty = 1, kGpusDirty = 2, kJobsDirty = 4, kAllDirty = 7 };
  void markDirty(unsigned what);
  void scheduleRefresh();
  void flush();  // the coalescing timer's: refreshes what is dirty
  void refreshJobs();
  void refreshGpus();
  void fitAgentRows();
  void updateStatus();
  void saveState();
  void setUpAlerts();
  void onAlertFired(quint64 serial);

  ClusterStore& store_;
  JobControl control_;
  SlurmLauncher slurm_;
  QString configDir_;
  AgentsModel* agentsModel_;
  GpusModel* gpusModel_;
  JobsModel* jobsModel_;
  QTableView* agentsView_;
  QTableView* gpusView_;
  QLineEdit* nodeFilter_;
  QSortFilterProxyModel* gpusProxy_;
  QTableView* jobsView_;
  DashboardWidget* dashboard_;
  AlertBanner* alertBanner_ = nullptr;
  AlertsPanel* alertsPanel_ = nullptr;
  QDockWidget* alertsDock_ = nullptr;
  DesktopNotifier* notifier_ = nullptr;
  QAction* alertsAction_ = nullptr;
  QSplitter* outer_;
  QSplitter* left_;
  QSplitter* right_;
  QLabel* status_;
  QAction* stopAction_;  // enabled while the job on show runs
  QAction* exportAction_;
  QAction* exportTraceAction_;
  HistoryRecorder* history_;
  HistoryWindow* historyWindow_ = nullptr;
  QString historyProblem_;
  QTimer coalesce_;
  QTimer tick_;
  unsigned dirty_ = kAllDirty;
  QSet<QString> changedAgents_;  // whose state changed (their rows only)
  QElapsedTimer gpusShown_;      // the GPU table takes new samples at most every kGpusEveryMs
  static constexpr int kGpusEveryMs = 250;
  QString pendingSelect_;
};

}  // namespace lockstep::app
