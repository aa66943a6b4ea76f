#include "HistoryWindow.h"

#include <QApplication>
#include <QComboBox>
#include <QDateTime>
#include <QDialogButtonBox>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QPushButton>
#include <QScrollArea>
#include <QSvgWidget>
#include <QTableView>
#include <QTableWidget>
#include <QVBoxLayout>
#include <chrono>
#include <cmath>

#include "DashboardWidget.h"
#include "Present.h"
#include "lockstep/common/clock.h"
#include "lockstep/report/report_pdf.h"
#include "lockstep/report/trace.h"

namespace lockstep::app {

namespace {


const QStringList kHeaders = {
    QObject::tr("Job"),     QObject::tr("Name"),     QObject::tr("State"),      QObject::tr("Owner"),     QObject::tr("Started"),
    QObject::tr("Duration"), QObject::tr("Ranks"),   QObject::tr("Nodes"),      QObject::tr("Samples/s"),
    QObject::tr("Scaling"),  QObject::tr("Comm."),   QObject::tr("GPU util."),  QObject::tr("MFU"),  QObject::tr("Cost"),
};

}  // namespace

// ---- model ----

HistoryModel::HistoryModel(QObject* parent) : RefreshedTableModel(kHeaders, parent) {}

int HistoryModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }

void HistoryModel::set(std::vector<history::JobRecord> rows) {
  const int old = rowCount();
  rows_ = std::move(rows);
  resetOrUpdate(old, rowCount());
}

int HistoryModel::rowOf(const QString& jobId) const {
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    if (QString::fromStdString(rows_[i].spec.jobId) == jobId) return static_cast<int>(i);
  }
  return -1;
}

QVariant HistoryModel::data(const QModelIndex& index, int role) const {
  if (!index.isValid() || index.row() >= rowCount()) return {};
  const history::JobRecord& r = rows_[static_cast<std::size_t>(index.row())];
  const kpi::JobKpis* k = r.finalKpis ? &*r.finalKpis : nullptr;
  if (role == Qt::ForegroundRole && index.column() == kState) return jobStateColor(r.state, QApplication::palette());
  if (role == Qt::TextAlignmentRole && index.column() >= kDuration && index.column() != kNodes) {
    return QVariant(Qt::AlignRight | Qt::AlignVCenter);
  }
  if (role == Qt::ToolTipRole && index.column() == kState && !r.message.empty()) return QString::fromStdString(r.message);
  if (role != Qt::DisplayRole) return {};
  switch (index.column()) {
    case kJob: return QString::fromStdString(r.spec.jobId);
    case kName: return QString::fromStdString(r.spec.name);
    case kState: return jobStateText(r.state);
    case kOwner: return QString::fromStdString(r.owner);
    case kStarted:
      return r.startedUnixUs ? QDateTime::fromMSecsSinceEpoch(r.startedUnixUs / 1000).toString(QStringLiteral("yyyy-MM-dd HH:mm"))
                             : dash();
    case kDuration:
      if (!r.startedUnixUs) return dash();
      return duration(static_cast<double>((r.endedUnixUs ? r.endedUnixUs : unixMicrosNow()) - r.startedUnixUs) / 1e6);
    case kRanks: return r.spec.worldSize;
    case kNodes: {
      QStringList nodes;
      for (const auto& p : r.parts) nodes << QString::fromStdString(p.node);
      return nodes.join(QStringLiteral(", "));
    }
    // Final KPIs exist once a job ended: its throughput is what it delivered, start to end.
    case kThroughput: return k ? figure(present::jobThroughput(*k, true), 0) : dash();
    case kEfficiency: return k ? percent(k->scalingEfficiency, 0) : dash();
    case kComm: return k ? percent(k->commOverhead, 1) : dash();
    case kGpuUtil: return k ? figure(k->gpuUtilizationPct, 0, "%") : dash();
    case kMfu: return k ? percent(k->mfu, 1) : dash();
    case kCost:
      if (!r.spec.prices.anySet()) return dash();
      return k && k->costSoFar ? money(*k->costSoFar, QString::fromStdString(r.spec.prices.currency)) : dash();
    default: return {};
  }
}

// ---- loading and exporting ----

Result<std::shared_ptr<const JobEntry>> loadRecordedJob(const history::History& history, const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(history::JobRecord record, history.job(jobId));
  auto entry = std::make_shared<JobEntry>();
  entry->id = jobId;
  entry->setSpec(record.spec);
  entry->state = record.state;
  entry->message = QString::fromStdString(record.message);
  entry->startedUnixUs = record.startedUnixUs;
  LOCKSTEP_ASSIGN_OR_RETURN(auto tracker, history.tracker(jobId));
  LOCKSTEP_ASSIGN_OR_RETURN(auto timeline, report::loadTimeline(history, record, {}, LiveJob::kLiveCollectivesPerRank));
  const std::int64_t at = std::max(record.endedUnixUs, tracker->lastReportUnixUs());
  entry->live = std::make_shared<LiveJob>(std::move(tracker), std::move(timeline), at ? at : record.recordedUnixUs);
  return std::shared_ptr<const JobEntry>(std::move(entry));
}

Result<void> exportReport(const history::History& history, const std::string& jobId, const std::string& path) {
  const auto format = report::formatOfPath(path);
  if (!format) return invalidArgument(path + ": name the file .pdf, .html, .json or .csv to choose the format");
  if (*format == report::Format::kPdf) return report::writePdf(history, jobId, path, unixMicrosNow());
  return report::write(history, jobId, *format, path, unixMicrosNow());
}

void exportReportDialog(QWidget* parent, const QString& historyPath, const QString& jobId) {
  QString filter;
  const QString file = QFileDialog::getSaveFileName(
      parent, QObject::tr("Export Report of %1").arg(jobId), jobId + QStringLiteral(".pdf"),
      QObject::tr("PDF report (*.pdf);;HTML report (*.html);;JSON summary and series (*.json);;CSV time series (*.csv)"),
      &filter);
  if (file.isEmpty()) return;
  QString path = file;
  if (!report::formatOfPath(path.toStdString())) {
    // No extension typed: the one of the chosen filter.
    const int star = filter.indexOf(QStringLiteral("*."));
    path += filter.mid(star + 1, filter.indexOf(QLatin1Char(')'), star) - star - 1);
  }
  auto h = history::History::open(historyPath.toStdString());
  Result<void> written = h ? exportReport(*h, jobId.toStdString(), path.toStdString()) : Result<void>(h.error());
  if (!written) {
    QMessageBox::warning(parent, QObject::tr("Export Report"),
                         QObject::tr("The report was not written:\n\n%1").arg(QString::fromStdString(written.error().message)));
  }
}

void exportTraceDialog(QWidget* parent, const QString& historyPath, const QString& jobId) {
  const QString file = QFileDialog::getSaveFileName(parent, QObject::tr("Export Trace of %1").arg(jobId),
                                                    jobId + QStringLiteral(".json.gz"),
                                                    QObject::tr("Chrome trace, compressed (*.json.gz);;Chrome trace (*.json)"));
  if (file.isEmpty()) return;
  auto h = history::History::open(historyPath.toStdString());
  auto written = h ? report::writeTrace(*h, jobId.toStdString(), {}, file.toStdString())
                   : Result<report::TraceSummary>(h.error());
  if (!written) {
    QMessageBox::warning(parent, QObject::tr("Export Trace"),
                         QObject::tr("The trace was not written:\n\n%1").arg(QString::fromStdString(written.error().message)));
  }
}

// ---- the window ----

HistoryWindow::HistoryWindow(ClusterStore& store, QString historyPath, QWidget* parent)
    : QWidget(parent, Qt::Window), store_(store), path_(std::move(historyPath)) {
  setWindowTitle(tr("Job History"));
  setObjectName(QStringLiteral("historyWindow"));
  search_ = new QLineEdit(this);
  search_->setPlaceholderText(tr("Search job id, name or node"));
  search_->setClearButtonEnabled(true);
  state_ = new QComboBox(this);
  state_->addItem(tr("All states"));
  for (JobState s : {JobState::kRunning, JobState::kFinished, JobState::kFailed, JobState::kStopped}) {
    state_->addItem(jobStateText(s), static_cast<int>(s));
  }
  model_ = new HistoryModel(this);
  view_ = new QTableView(this);
  view_->setModel(model_);
  view_->setSelectionBehavior(QAbstractItemView::SelectRows);
  view_->setSelectionMode(QAbstractItemView::ExtendedSelection);
  view_->setAlternatingRowColors(true);
  view_->verticalHeader()->hide();
  view_->horizontalHeader()->setStretchLastSection(true);
  view_->setWordWrap(false);
  status_ = new QLabel(this);
  open_ = new QPushButton(tr("&Open"), this);
  compare_ = new QPushButton(tr("&Compare"), this);
  export_ = new QPushButton(tr("&Export Report…"), this);
  delete_ = new QPushButton(tr("&Delete…"), this);
  open_->setToolTip(tr("The job's dashboard as it was"));
  compare_->setToolTip(tr("Two or more jobs side by side; scaling against ranks for jobs of one workload"));

  auto* filters = new QHBoxLayout;
  filters->addWidget(search_, 1);
  filters->addWidget(state_);
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(status_, 1);
  for (auto* b : {open_, compare_, export_, delete_}) buttons->addWidget(b);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(filters);
  layout->addWidget(view_, 1);
  layout->addLayout(buttons);
  resize(1100, 560);

  connect(search_, &QLineEdit::textChanged, this, &HistoryWindow::reload);
  connect(state_, &QComboBox::currentIndexChanged, this, &HistoryWindow::reload);
  connect(view_->selectionModel(), &QItemSelectionModel::selectionChanged, this, &HistoryWindow::updateButtons);
  connect(view_, &QTableView::doubleClicked, this, [this] { openSelected(); });
  connect(open_, &QPushButton::clicked, this, [this] { openSelected(); });
  connect(compare_, &QPushButton::clicked, this, [this] { compareSelected(); });
  connect(export_, &QPushButton::clicked, this, &HistoryWindow::exportSelected);
  connect(delete_, &QPushButton::clicked, this, &HistoryWindow::deleteSelected);
  reload();
}

std::optional<history::History>& HistoryWindow::db() {
  if (!history_) {
    auto h = history::History::open(path_.toStdString());
    if (h) {
      history_ = std::move(*h);
    } else {
      status_->setText(tr("Cannot read the history: %1").arg(QString::fromStdString(h.error().message)));
    }
  }
  return history_;
}

void HistoryWindow::setSearch(const QString& text) { search_->setText(text); }

void HistoryWindow::setStateFilter(std::optional<JobState> state) {
  state_->setCurrentIndex(state ? state_->findData(static_cast<int>(*state)) : 0);
}

void HistoryWindow::reload() {
  if (!db()) return;
  const QStringList selected = selectedJobs();
  history::Filter filter;
  filter.text = search_->text().trimmed().toStdString();
  if (state_->currentIndex() > 0) filter.state = static_cast<JobState>(state_->currentData().toInt());
  auto jobs = history_->jobs(filter);
  if (!jobs) {
    status_->setText(tr("Cannot read the history: %1").arg(QString::fromStdString(jobs.error().message)));
    return;
  }
  const bool first = model_->rowCount() == 0;
  model_->set(std::move(*jobs));
  if (first) view_->resizeColumnsToContents();
  select(selected);
  status_->setText(model_->rowCount() == 1 ? tr("1 job") : tr("%1 jobs").arg(model_->rowCount()));
  updateButtons();
}

void HistoryWindow::select(const QStringList& jobIds) {
  QItemSelection selection;
  for (const auto& id : jobIds) {
    const int row = model_->rowOf(id);
    if (row >= 0) selection.select(model_->index(row, 0), model_->index(row, model_->columnCount() - 1));
  }
  view_->selectionModel()->select(selection, QItemSelectionModel::ClearAndSelect);
}

QStringList HistoryWindow::selectedJobs() const {
  QStringList ids;
  for (const auto& index : view_->selectionModel()->selectedRows()) {
    ids << QString::fromStdString(model_->record(index.row()).spec.jobId);
  }
  return ids;
}

void HistoryWindow::updateButtons() {
  const auto n = selectedJobs().size();
  open_->setEnabled(n == 1);
  export_->setEnabled(n == 1);
  compare_->setEnabled(n >= 2);
  delete_->setEnabled(n >= 1);
}

QWidget* HistoryWindow::openSelected() {
  const QStringList ids = selectedJobs();
  if (ids.size() != 1 || !db()) return nullptr;
  QApplication::setOverrideCursor(Qt::WaitCursor);
  auto loaded = loadRecordedJob(*history_, ids.front().toStdString());
  QApplication::restoreOverrideCursor();
  if (!loaded) {
    QMessageBox::warning(this, tr("Open Job"), QString::fromStdString(loaded.error().message));
    return nullptr;
  }
  auto* window = new RecordedJobWindow(store_, *loaded, path_, this);
  window->setAttribute(Qt::WA_DeleteOnClose);
  window->show();
  return window;
}

QDialog* HistoryWindow::compareSelected() {
  const QStringList ids = selectedJobs();
  if (ids.size() < 2) return nullptr;
  std::vector<history::JobRecord> jobs;
  for (const auto& id : ids) jobs.push_back(model_->record(model_->rowOf(id)));
  auto* dialog = new CompareDialog(jobs, this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->show();
  return dialog;
}

void HistoryWindow::exportSelected() {
  const QStringList ids = selectedJobs();
  if (ids.size() == 1) exportReportDialog(this, path_, ids.front());
}

void HistoryWindow::deleteSelected() {
  const QStringList ids = selectedJobs();
  if (ids.isEmpty() || !db()) return;
  if (confirmDeletes_ &&
      QMessageBox::question(this, tr("Delete Jobs"),
                            tr("Delete %1 from the history, with every step report and sample recorded of it? "
                               "Running jobs are not stopped, and stay out of the history until the app next connects to their "
                               "agents.")
                                .arg(ids.size() == 1 ? ids.front() : tr("%1 jobs").arg(ids.size()))) != QMessageBox::Yes) {
    return;
  }
  for (const auto& id : ids) {
    if (auto removed = history_->remove(id.toStdString()); !removed) {
      QMessageBox::warning(this, tr("Delete Jobs"), QString::fromStdString(removed.error().message));
      break;
    }
  }
  reload();
}

// ---- a recorded job ----

RecordedJobWindow::RecordedJobWindow(ClusterStore& store, std::shared_ptr<const JobEntry> job, QString historyPath,
                                     QWidget* parent)
    : QWidget(parent, Qt::Window) {
  const QString jobId = QString::fromStdString(job->id);
  setWindowTitle(tr("%1 — recorded").arg(jobId));
  dashboard_ = new DashboardWidget(store, this);
  dashboard_->showRecorded(std::move(job));
  auto* exportButton = new QPushButton(tr("&Export Report…"), this);
  connect(exportButton, &QPushButton::clicked, this, [this, historyPath, jobId] { exportReportDialog(this, historyPath, jobId); });
  auto* bar = new QHBoxLayout;
  bar->addStretch(1);
  bar->addWidget(exportButton);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(dashboard_, 1);
  layout->addLayout(bar);
  resize(1200, 860);
}

// ---- comparing ----

CompareDialog::CompareDialog(const std::vector<history::JobRecord>& jobs, QWidget* parent)
    : QDialog(parent), comparison_(report::compare(jobs)) {
  setWindowTitle(tr("Compare Jobs"));
  setObjectName(QStringLiteral("compareDialog"));
  const report::Table& t = comparison_.kpis;
  auto* table = new QTableWidget(static_cast<int>(t.rows.size()), static_cast<int>(t.header.size()), this);
  table->setObjectName(QStringLiteral("compareTable"));
  QStringList header;
  for (const auto& h : t.header) header << QString::fromStdString(h);
  table->setHorizontalHeaderLabels(header);
  for (std::size_t r = 0; r < t.rows.size(); ++r) {
    for (std::size_t c = 0; c < t.rows[r].size(); ++c) {
      auto* item = new QTableWidgetItem(QString::fromStdString(t.rows[r][c]));
      item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
      if (c > 0) item->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
      table->setItem(static_cast<int>(r), static_cast<int>(c), item);
    }
  }
  table->verticalHeader()->hide();
  table->resizeColumnsToContents();
  table->horizontalHeader()->setStretchLastSection(true);

  auto* layout = new QVBoxLayout(this);
  layout->addWidget(table, 1);
  // The scaling charts are the report's own SVG, so the app and the reports show the same picture.
  if (comparison_.throughput && comparison_.efficiency) {
    auto* charts = new QHBoxLayout;
    for (const auto* chart : {&*comparison_.throughput, &*comparison_.efficiency}) {
      auto* view = new QSvgWidget(this);
      view->setObjectName(QStringLiteral("chart-") + QString::fromStdString(chart->id));
      view->load(QByteArray::fromStdString(report::svg(*chart, 760, 320)));
      view->setMinimumSize(456, 192);
      charts->addWidget(view);
    }
    layout->addLayout(charts, 1);
  }
  // Which kind of data parallelism fits the workload, where the jobs ran it under several.
  if (!comparison_.advice.empty()) {
    QStringList lines;
    for (const auto& line : comparison_.advice) lines << QString::fromStdString(line);
    auto* advice = new QLabel(lines.join(QLatin1Char('\n')), this);
    advice->setObjectName(QStringLiteral("kindAdvice"));
    advice->setWordWrap(true);
    advice->setTextInteractionFlags(Qt::TextSelectableByMouse);
    layout->addWidget(advice);
  }
  auto* note = new QLabel(QString::fromStdString(comparison_.scalingNote), this);
  note->setObjectName(QStringLiteral("scalingNote"));
  note->setWordWrap(true);
  layout->addWidget(note);
  auto* close = new QDialogButtonBox(QDialogButtonBox::Close, this);
  connect(close, &QDialogButtonBox::rejected, this, &QDialog::reject);
  layout->addWidget(close);
  resize(1100, 640);
}

}  // namespace lockstep::app
