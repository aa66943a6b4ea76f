#include "MainWindow.h"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QDockWidget>
#include <QCloseEvent>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMessageBox>
#include <QScreen>
#include <QSettings>
#include <QSortFilterProxyModel>
#include <QSplitter>
#include <QSysInfo>
#include <QStatusBar>
#include <QTableView>
#include <QToolBar>
#include <QVBoxLayout>

#include "AddAgentDialog.h"
#include "AlertBanner.h"
#include "AlertsPanel.h"
#include "DesktopNotifier.h"
#include "DashboardWidget.h"
#include "HistoryRecorder.h"
#include "HistoryWindow.h"
#include "LauncherDialog.h"
#include "Models.h"
#include "lockstep/common/process.h"
#include "lockstep/net/keys.h"

namespace lockstep::app {

namespace {

QTableView* makeTable(QAbstractItemModel* model, QWidget* parent) {
  auto* view = new QTableView(parent);
  view->setModel(model);
  view->setSelectionBehavior(QAbstractItemView::SelectRows);
  view->setSelectionMode(QAbstractItemView::SingleSelection);
  view->setAlternatingRowColors(true);
  view->verticalHeader()->hide();
  view->horizontalHeader()->setStretchLastSection(true);
  view->setWordWrap(false);
  return view;
}

// The header's right-click menu shows and hides the table's columns.
void addColumnChooser(QTableView* view) {
  QHeaderView* header = view->horizontalHeader();
  header->setContextMenuPolicy(Qt::ActionsContextMenu);
  for (int c = 0; c < view->model()->columnCount(); ++c) {
    auto* action = new QAction(view->model()->headerData(c, Qt::Horizontal).toString(), header);
    action->setCheckable(true);
    action->setChecked(!view->isColumnHidden(c));
    QObject::connect(action, &QAction::toggled, view, [view, c](bool shown) { view->setColumnHidden(c, !shown); });
    header->addAction(action);
  }
}

}  // namespace

MainWindow::MainWindow(ClusterStore& store, QString configDir, HistoryRecorder* history, QWidget* parent)
    : QMainWindow(parent),
      store_(store),
      control_(store),
      slurm_(store, control_, configDir.toStdString()),
      configDir_(std::move(configDir)),
      history_(history) {
  setWindowTitle(tr("Lockstep"));
  agentsModel_ = new AgentsModel(store_, this);
  gpusModel_ = new GpusModel(store_, this);
  jobsModel_ = new JobsModel(store_, this);

  outer_ = new QSplitter(Qt::Horizontal, this);
  left_ = new QSplitter(Qt::Vertical, outer_);
  agentsView_ = makeTable(agentsModel_, left_);
  agentsView_->setObjectName(QStringLiteral("agentsView"));
  // The Network column holds "eth0 ↓1.20 Gb/s ↑800 Mb/s of 25 Gb/s (4.8%)": in a narrow pane it
  // wraps onto a second line rather than lose its end.
  agentsView_->setWordWrap(true);
  agentsView_->setTextElideMode(Qt::ElideNone);
  agentsView_->verticalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  agentsView_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  agentsView_->horizontalHeader()->setSectionResizeMode(AgentsModel::kNetwork, QHeaderView::Stretch);
  // The agent's address is in the Node cell's tooltip; its column is one right-click away.
  agentsView_->setColumnHidden(AgentsModel::kAgent, true);
  addColumnChooser(agentsView_);
  // At 1024 GPUs, one node's: a filter over the GPU table and the dashboard's heatmap.
  auto* gpuPane = new QWidget(left_);
  auto* gpuLayout = new QVBoxLayout(gpuPane);
  gpuLayout->setContentsMargins(0, 0, 0, 0);
  nodeFilter_ = new QLineEdit(gpuPane);
  nodeFilter_->setObjectName(QStringLiteral("nodeFilter"));
  nodeFilter_->setPlaceholderText(tr("Filter GPUs and the heatmap by node…"));
  nodeFilter_->setClearButtonEnabled(true);
  gpusProxy_ = new QSortFilterProxyModel(this);
  gpusProxy_->setSourceModel(gpusModel_);
  gpusProxy_->setFilterKeyColumn(GpusModel::kNode);
  gpusProxy_->setFilterCaseSensitivity(Qt::CaseInsensitive);
  gpusView_ = makeTable(gpusProxy_, gpuPane);
  gpusView_->setObjectName(QStringLiteral("gpusView"));
  gpuLayout->addWidget(nodeFilter_);
  gpuLayout->addWidget(gpusView_);
  right_ = new QSplitter(Qt::Vertical, outer_);
  jobsView_ = makeTable(jobsModel_, right_);
  jobsView_->setObjectName(QStringLiteral("jobsView"));
  jobsView_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);  // a few rows: cheap
  dashboard_ = new DashboardWidget(store_, right_);
  connect(dashboard_, &DashboardWidget::stopRequested, this, [this](const QString& jobId) { control_.stopJob(jobId.toStdString()); });
  right_->setStretchFactor(1, 4);
  outer_->setStretchFactor(1, 3);
  // The alert banner over the views, while an alert fires.
  auto* central = new QWidget(this);
  auto* centralLayout = new QVBoxLayout(central);
  centralLayout->setContentsMargins(0, 0, 0, 0);
  centralLayout->setSpacing(2);
  alertBanner_ = new AlertBanner(store_.alerts(), central);
  centralLayout->addWidget(alertBanner_);
  outer_->setParent(central);
  centralLayout->addWidget(outer_, 1);
  setCentralWidget(central);

  auto* file = menuBar()->addMenu(tr("&File"));
  auto* keyAction = file->addAction(tr("This App's &Key…"), this, &MainWindow::showAppKey);
  keyAction->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_K));
  exportAction_ = file->addAction(tr("&Export Report…"), this, &MainWindow::exportReport);
  exportAction_->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_E));
  exportAction_->setObjectName(QStringLiteral("exportReportAction"));
  exportTraceAction_ = file->addAction(tr("Export &Trace…"), this, [this] {
    if (history_ && !dashboard_->jobId().isEmpty()) exportTraceDialog(this, history_->path(), dashboard_->jobId());
  });
  exportTraceAction_->setObjectName(QStringLiteral("exportTraceAction"));
  exportTraceAction_->setToolTip(tr("The job's steps per rank as a Chrome trace, for Perfetto or chrome://tracing"));
  file->addSeparator();
  auto* quit = file->addAction(tr("&Quit"), this, &QWidget::close);
  quit->setShortcut(QKeySequence::Quit);
  auto* cluster = menuBar()->addMenu(tr("&Cluster"));
  auto* addAgent = cluster->addAction(tr("&Add Agent…"), this, &MainWindow::addAgentDialog);
  addAgent->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_A));
  cluster->addAction(tr("Add &Slurm Cluster…"), this, &MainWindow::addSlurmClusterDialog);
  auto* jobMenu = menuBar()->addMenu(tr("&Job"));
  auto* newJobAction = jobMenu->addAction(tr("&New Job…"), this, &MainWindow::newJob);
  newJobAction->setShortcut(QKeySequence::New);
  auto* stopAction = jobMenu->addAction(tr("&Stop Job…"), dashboard_, &DashboardWidget::stopJob);
  stopAction->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_X));
  stopAction->setObjectName(QStringLiteral("stopJobAction"));
  stopAction_ = stopAction;
  jobMenu->addSeparator();
  auto* historyAction = jobMenu->addAction(tr("&History…"), this, &MainWindow::showHistory);
  historyAction->setShortcut(QKeySequence(Qt::CTRL | Qt::Key_H));
  historyAction->setEnabled(history_ != nullptr);
  auto* toolbar = addToolBar(tr("Main"));
  toolbar->setObjectName(QStringLiteral("mainToolbar"));
  toolbar->addAction(newJobAction);
  toolbar->addAction(stopAction);
  toolbar->addAction(historyAction);
  toolbar->addAction(addAgent);
  setUpAlerts();
  jobMenu->addSeparator();
  jobMenu->addAction(alertsAction_);
  toolbar->addAction(alertsAction_);
  status_ = new QLabel(this);
  statusBar()->addWidget(status_);

  connect(nodeFilter_, &QLineEdit::textChanged, this, [this](const QString& text) {
    gpusProxy_->setFilterFixedString(text);
    dashboard_->setNodeFilter(text);
  });
  connect(jobsView_->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
          [this](const QModelIndex& current) { dashboard_->showJob(jobsModel_->jobId(current.row())); });
  coalesce_.setSingleShot(true);
  coalesce_.setInterval(40);
  connect(&coalesce_, &QTimer::timeout, this, &MainWindow::flush);
  connect(&store_, &ClusterStore::agentsChanged, this, [this] { markDirty(kAgentsDirty); });
  connect(&store_, &ClusterStore::agentChanged, this, [this](const QString& id) {
    changedAgents_.insert(id);
    scheduleRefresh();
  });
  connect(&store_, &ClusterStore::gpusChanged, this, [this] { markDirty(kGpusDirty); });
  connect(&store_, &ClusterStore::jobsChanged, this, [this] { markDirty(kJobsDirty); });
  connect(&store_, &ClusterStore::jobDataChanged, this, [this] { markDirty(kJobsDirty); });
  // ETA and throughput age even when nothing arrives (the jobs and the dashboard; not the agents).
  tick_.setInterval(1000);
  connect(&tick_, &QTimer::timeout, this, [this] { markDirty(kJobsDirty); });
  tick_.start();
  connect(&control_, &JobControl::launchFinished, this, [this](const QString& jobId, bool ok, const QString& message) {
    if (ok) {
      pendingSelect_ = jobId;
      markDirty(kJobsDirty);
    } else {
      QMessageBox::warning(this, tr("Job not started"), tr("Job %1 did not start:\n\n%2").arg(jobId, message));
    }
  });
  connect(&control_, &JobControl::jobRestarted, this, [this](const QString& jobId, const QString& message) {
    statusBar()->showMessage(tr("Job %1: %2").arg(jobId, message), 30000);
  });
  connect(&control_, &JobControl::restartRefused, this, [this](const QString& jobId, const QString& message) {
    QMessageBox::warning(this, tr("Job not restarted"), tr("Job %1 lost ranks and was not restarted:\n\n%2").arg(jobId, message));
  });
  connect(&slurm_, &SlurmLauncher::progress, this, [this](const QString& jobId, const QString& message) {
    statusBar()->showMessage(tr("Job %1: %2").arg(jobId, message), 60000);
  });
  connect(&slurm_, &SlurmLauncher::failed, this, [this](const QString& jobId, const QString& message) {
    statusBar()->clearMessage();
    QMessageBox::warning(this, tr("Job not started"), tr("Job %1 did not start on Slurm:\n\n%2").arg(jobId, message));
  });
  connect(&control_, &JobControl::stopFinished, this, [this](const QString& jobId, bool ok, const QString& message) {
    if (!ok) QMessageBox::warning(this, tr("Stop failed"), tr("Job %1 did not stop everywhere:\n\n%2").arg(jobId, message));
  });

  if (history_) {
    connect(history_, &HistoryRecorder::opened, this, [this](bool ok, const QString& message) {
      if (!ok) historyProblem_ = tr("history off: %1").arg(message);
      updateStatus();
    });
    connect(history_, &HistoryRecorder::failed, this, [this](const QString& message) {
      historyProblem_ = tr("history stopped: %1").arg(message);
      updateStatus();
    });
    connect(history_, &HistoryRecorder::changed, this, [this] {
      if (historyWindow_ && historyWindow_->isVisible()) historyWindow_->reload();
    });
  }

  QSettings settings;
  restoreGeometry(settings.value(QStringLiteral("window/geometry")).toByteArray());
  restoreState(settings.value(QStringLiteral("window/state")).toByteArray());
  outer_->restoreState(settings.value(QStringLiteral("window/outer")).toByteArray());
  left_->restoreState(settings.value(QStringLiteral("window/left")).toByteArray());
  right_->restoreState(settings.value(QStringLiteral("window/right")).toByteArray());
  if (!settings.contains(QStringLiteral("window/geometry"))) {
    applyDefaultLayout(this->screen() ? this->screen()->availableGeometry().size() : QSize(1500, 950));
  }

  for (const QString& line : settings.value(QStringLiteral("slurm/clusters")).toStringList()) {
    const QStringList fields = line.split(QLatin1Char('\t'));
    if (fields.size() == 3) store_.addSlurmCluster({fields[0], fields[1], fields[2]});
  }
  if (auto known = KnownAgents::load(knownAgentsPath(configDir_.toStdString()))) {
    for (const auto& [address, key] : known->all()) {
      if (auto parsed = parseAgentAddress(address)) store_.addAgent(*parsed, key);
    }
  }
  refreshNow();
}

MainWindow::~MainWindow() = default;

void MainWindow::setUpAlerts() {
  alertsPanel_ = new AlertsPanel(store_.alerts(), this);
  alertsDock_ = new QDockWidget(tr("Alerts"), this);
  alertsDock_->setObjectName(QStringLiteral("alertsDock"));  // for saveState()
  alertsDock_->setWidget(alertsPanel_);
  addDockWidget(Qt::BottomDockWidgetArea, alertsDock_);
  alertsDock_->hide();
  alertsAction_ = alertsDock_->toggleViewAction();
  alertsAction_->setObjectName(QStringLiteral("alertsAction"));
  alertsAction_->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_L));
  alertsAction_->setToolTip(tr("The watched jobs' alerts, past and present (Ctrl+Shift+L)"));
  notifier_ = new DesktopNotifier(this);
  connect(alertBanner_, &AlertBanner::showRequested, this, [this](quint64 serial) { showAlerts(serial); });
  connect(alertsPanel_, &AlertsPanel::jobActivated, this, &MainWindow::selectJob);
  connect(&store_.alerts(), &AlertLog::fired, this, &MainWindow::onAlertFired);
  connect(&store_.alerts(), &AlertLog::changed, this, [this] {
    const int firing = store_.alerts().firingCount();
    alertsAction_->setText(firing ? tr("Alerts (%1)").arg(firing) : tr("Alerts"));
  });
  connect(notifier_, &DesktopNotifier::activated, this, [this](const QString& key) {
    showNormal();
    raise();
    activateWindow();
    showAlerts(key.toULongLong());
  });
}

void MainWindow::showAlerts(quint64 serial) {
  if (!alertsDock_->isVisible() && !alertsDock_->isFloating()) {
    alertsDock_->show();
    resizeDocks({alertsDock_}, {std::max(200, height() / 4)}, Qt::Vertical);  // a few rows, not two
  }
  alertsDock_->show();
  alertsDock_->raise();
  if (serial) alertsPanel_->select(serial);
}

// A new alert that is not silenced: the banner shows it already (AlertBanner follows the log);
// the desktop is told when the user looks elsewhere.
void MainWindow::onAlertFired(quint64 serial) {
  const AlertEntry* e = store_.alerts().entry(serial);
  if (!e || isActiveWindow()) return;
  notifier_->notify(QString::number(serial), tr("Lockstep: job %1").arg(QString::fromStdString(e->jobId)),
                    QString::fromStdString(e->message));
}

void MainWindow::markDirty(unsigned what) {
  dirty_ |= what;
  scheduleRefresh();
}

void MainWindow::scheduleRefresh() {
  if (!coalesce_.isActive()) coalesce_.start();
}

void MainWindow::applyDefaultLayout(QSize available) {
  // Never wider or taller than the screen (a 1280 px laptop).
  const int width = std::min(1500, available.width()), height = std::min(950, available.height());
  resize(width, height);
  outer_->setSizes({width / 3, width - width / 3});
  left_->setSizes({300, 600});
  right_->setSizes({150, 800});
}

void MainWindow::refreshNow() {
  dirty_ = kAllDirty;
  gpusShown_.invalidate();
  flush();
}

void MainWindow::flush() {
  coalesce_.stop();
  const unsigned dirty = std::exchange(dirty_, 0u);
  if (dirty & kAgentsDirty) {
    const int agentRows = agentsModel_->rowCount();
    agentsModel_->refresh();
    if (agentRows != agentsModel_->rowCount()) fitAgentRows();
  } else {
    for (const QString& id : std::as_const(changedAgents_)) agentsModel_->refreshAgent(id);
  }
  if (dirty & kGpusDirty) refreshGpus();
  if (dirty & kJobsDirty) refreshJobs();
  if ((dirty & (kAgentsDirty | kJobsDirty)) || !changedAgents_.isEmpty()) updateStatus();
  changedAgents_.clear();
}

// New samples at most every kGpusEveryMs (they come at the agents' 5 Hz); the rest wait for a later refresh.
void MainWindow::refreshGpus() {
  if (gpusShown_.isValid() && gpusShown_.elapsed() < kGpusEveryMs) return markDirty(kGpusDirty);  // a later flush's
  gpusShown_.start();
  const int gpuRows = gpusModel_->rowCount();
  gpusModel_->refresh();
  if (gpuRows != gpusModel_->rowCount()) gpusView_->resizeColumnsToContents();
}

// A few agents: rows and columns fit their contents. Many: that costs every row's text layout on
// each change, so rows get two lines and the columns are sized now, as agents come or go.
void MainWindow::fitAgentRows() {
  const bool few = agentsModel_->rowCount() <= kAutoSizedAgentRows;
  QHeaderView* rows = agentsView_->verticalHeader();
  QHeaderView* columns = agentsView_->horizontalHeader();
  rows->setSectionResizeMode(few ? QHeaderView::ResizeToContents : QHeaderView::Fixed);
  if (!few) rows->setDefaultSectionSize(2 * agentsView_->fontMetrics().lineSpacing() + 6);
  for (int c = 0; c < agentsModel_->columnCount(); ++c) {
    if (c != AgentsModel::kNetwork) columns->setSectionResizeMode(c, few ? QHeaderView::ResizeToContents : QHeaderView::Interactive);
  }
  agentsView_->resizeColumnsToContents();
}

void MainWindow::refreshJobs() {
  const QString selected = dashboard_->jobId();
  jobsModel_->refresh();
  if (!pendingSelect_.isEmpty() && jobsModel_->rowOf(pendingSelect_) >= 0) {
    selectJob(pendingSelect_);
    pendingSelect_.clear();
  } else if (!selected.isEmpty() && jobsModel_->rowOf(selected) >= 0) {
    // A reset (a new row) clears the selection: keep the job on show selected.
    if (jobsView_->currentIndex().row() != jobsModel_->rowOf(selected)) selectJob(selected);
  } else if (selected.isEmpty() && jobsModel_->rowCount() > 0) {
    // Nothing chosen yet: show the newest running job, else the newest one.
    QString pick = jobsModel_->jobId(jobsModel_->rowCount() - 1);
    for (const auto* j : store_.jobs()) {
      if (j->state == JobState::kRunning) pick = QString::fromStdString(j->id);
    }
    selectJob(pick);
  }
  dashboard_->refresh();
  const JobEntry* shown = store_.job(dashboard_->jobId().toStdString());
  stopAction_->setEnabled(shown && !shown->over);  // a job to restart, or to be judged, may be stopped
  exportAction_->setEnabled(shown && history_);
  exportTraceAction_->setEnabled(shown && history_);
}

void MainWindow::selectJob(const QString& jobId) {
  const int row = jobsModel_->rowOf(jobId);
  if (row < 0) return;
  jobsView_->setCurrentIndex(jobsModel_->index(row, 0));
  jobsView_->scrollTo(jobsModel_->index(row, 0));
  dashboard_->showJob(jobId);
}

void MainWindow::updateStatus() {
  int connected = 0, running = 0;
  for (const auto& a : store_.agents()) connected += a->state == AgentState::kConnected;
  for (const auto* j : store_.jobs()) running += j->state == JobState::kRunning;
  status_->setText(tr("%1 of %2 agents connected · %3 running")
                       .arg(connected)
                       .arg(store_.agents().size())
                       .arg(running == 1 ? tr("1 job") : tr("%1 jobs").arg(running)) +
                   (historyProblem_.isEmpty() ? QString() : QStringLiteral(" · ") + historyProblem_));
}

Result<void> MainWindow::addAgent(const QString& address, const QString& key) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto parsed, parseAgentAddress(address.toStdString()));
  LOCKSTEP_ASSIGN_OR_RETURN(auto known, KnownAgents::load(knownAgentsPath(configDir_.toStdString())));
  LOCKSTEP_TRY(known.trust(parsed.text(), key.toStdString()));
  store_.addAgent(parsed, key.toStdString());
  return {};
}

void MainWindow::addAgentDialog() {
  AddAgentDialog dialog(this);
  if (dialog.exec() != QDialog::Accepted) return;
  if (auto added = addAgent(dialog.address(), dialog.key()); !added) {
    QMessageBox::warning(this, tr("Add Agent"), QString::fromStdString(added.error().message));
  }
}

// A Slurm cluster whose login host is this one: sbatch must be here (docs/cluster.md).
void MainWindow::addSlurmClusterDialog() {
  QDialog dialog(this);
  dialog.setWindowTitle(tr("Add Slurm Cluster"));
  auto* form = new QFormLayout(&dialog);
  const QString login = QSysInfo::machineHostName();
  auto* about = new QLabel(tr("Jobs are submitted with sbatch here, on %1, and their agents announce "
                              "themselves in your home directory, which the cluster's nodes share.").arg(login), &dialog);
  about->setWordWrap(true);
  form->addRow(about);
  auto* partition = new QLineEdit(&dialog);
  partition->setPlaceholderText(tr("the cluster's default"));
  auto* account = new QLineEdit(&dialog);
  account->setPlaceholderText(tr("your default"));
  form->addRow(tr("Partition"), partition);
  form->addRow(tr("Account"), account);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &dialog);
  connect(buttons, &QDialogButtonBox::accepted, &dialog, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
  form->addRow(buttons);
  if (dialog.exec() != QDialog::Accepted) return;
  if (auto sbatch = runCommand({"sbatch", "--version"}, std::chrono::seconds(10)); !sbatch || !sbatch->status.success()) {
    QMessageBox::warning(this, tr("Add Slurm Cluster"),
                         tr("sbatch does not run here (%1): add the cluster from its login host.")
                             .arg(sbatch ? QString::fromStdString(sbatch->err).trimmed()
                                         : QString::fromStdString(sbatch.error().message)));
    return;
  }
  store_.addSlurmCluster({login, partition->text().trimmed(), account->text().trimmed()});
  QStringList saved;
  for (const auto& c : store_.slurmClusters()) saved << c.login + QLatin1Char('\t') + c.partition + QLatin1Char('\t') + c.account;
  QSettings().setValue(QStringLiteral("slurm/clusters"), saved);
}

void MainWindow::newJob() {
  LauncherDialog dialog(store_, this);
  if (dialog.exec() != QDialog::Accepted || !dialog.job()) return;
  if (dialog.slurmRequest()) {
    slurm_.launch(*dialog.job(), *dialog.slurmRequest());
  } else {
    control_.launch(*dialog.job());
  }
}

HistoryWindow* MainWindow::showHistory() {
  if (!history_) return nullptr;
  if (!historyWindow_) historyWindow_ = new HistoryWindow(store_, history_->path(), this);
  historyWindow_->reload();
  historyWindow_->show();
  historyWindow_->raise();
  historyWindow_->activateWindow();
  return historyWindow_;
}

void MainWindow::exportReport() {
  if (!history_ || dashboard_->jobId().isEmpty()) return;
  exportReportDialog(this, history_->path(), dashboard_->jobId());
}

void MainWindow::showAppKey() {
  const QString key = QString::fromStdString(store_.keys().publicKey);
  QMessageBox box(this);
  box.setWindowTitle(tr("This App's Key"));
  box.setTextInteractionFlags(Qt::TextSelectableByMouse);
  box.setText(tr("To let this app use an agent, add this line to the agent's authorized_keys (in its state "
                 "directory):<br><br><tt>%1 lockstep-app</tt><br><br>Fingerprint: %2")
                  .arg(key.toHtmlEscaped(), QString::fromStdString(fingerprint(store_.keys().publicKey))));
  auto* copy = box.addButton(tr("Copy Line"), QMessageBox::ActionRole);
  box.addButton(QMessageBox::Close);
  box.exec();
  if (box.clickedButton() == copy) QApplication::clipboard()->setText(key + QStringLiteral(" lockstep-app"));
}

void MainWindow::saveState() {
  QSettings settings;
  settings.setValue(QStringLiteral("window/geometry"), saveGeometry());
  settings.setValue(QStringLiteral("window/state"), QMainWindow::saveState());
  settings.setValue(QStringLiteral("window/outer"), outer_->saveState());
  settings.setValue(QStringLiteral("window/left"), left_->saveState());
  settings.setValue(QStringLiteral("window/right"), right_->saveState());
}

void MainWindow::closeEvent(QCloseEvent* event) {
  saveState();
  QMainWindow::closeEvent(event);
}

}  // namespace lockstep::app
