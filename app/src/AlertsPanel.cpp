#include "AlertsPanel.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QItemSelectionModel>
#include <QLabel>
#include <QMenu>
#include <QPushButton>
#include <QTableView>
#include <QVBoxLayout>
#include <set>

#include "AlertsModel.h"

namespace lockstep::app {

namespace {
QString silenceTip() {
  return QObject::tr("Hides this rule's banner and desktop notifications for this job, in this app only: "
                     "the agent still notifies the job's webhooks.");
}
}  // namespace

AlertsPanel::AlertsPanel(AlertLog& log, QWidget* parent) : QWidget(parent), log_(log), model_(new AlertsModel(log, this)) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  auto* bar = new QHBoxLayout;
  jobs_ = new QComboBox(this);
  jobs_->setObjectName(QStringLiteral("alertsJob"));
  jobs_->addItem(tr("All jobs"), QString());
  jobs_->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  summary_ = new QLabel(this);
  summary_->setObjectName(QStringLiteral("alertsSummary"));
  silence_ = new QPushButton(tr("Silence 1 h"), this);
  silence_->setObjectName(QStringLiteral("silenceRule"));
  silence_->setToolTip(silenceTip());
  unsilence_ = new QPushButton(tr("Unsilence"), this);
  unsilence_->setObjectName(QStringLiteral("unsilenceRule"));
  unsilence_->setToolTip(tr("Shows this rule's banner and desktop notifications again."));
  bar->addWidget(new QLabel(tr("Job"), this));
  bar->addWidget(jobs_);
  bar->addWidget(summary_, 1);
  bar->addWidget(silence_);
  bar->addWidget(unsilence_);
  layout->addLayout(bar);

  view_ = new QTableView(this);
  view_->setObjectName(QStringLiteral("alertsView"));
  view_->setModel(model_);
  view_->setSelectionBehavior(QAbstractItemView::SelectRows);
  view_->setSelectionMode(QAbstractItemView::SingleSelection);
  view_->setAlternatingRowColors(true);
  view_->verticalHeader()->hide();
  view_->horizontalHeader()->setStretchLastSection(true);
  view_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  view_->horizontalHeader()->setSectionResizeMode(AlertsModel::kText, QHeaderView::Stretch);
  view_->setWordWrap(false);
  view_->setContextMenuPolicy(Qt::CustomContextMenu);
  view_->setToolTip(QString());
  layout->addWidget(view_);

  connect(jobs_, &QComboBox::currentIndexChanged, this, [this](int i) {
    model_->setJobFilter(jobs_->itemData(i).toString());
    updateButtons();
  });
  connect(view_->selectionModel(), &QItemSelectionModel::currentRowChanged, this, &AlertsPanel::updateButtons);
  connect(silence_, &QPushButton::clicked, this, [this] { silenceSelected(); });
  connect(unsilence_, &QPushButton::clicked, this, &AlertsPanel::unsilenceSelected);
  connect(view_, &QTableView::customContextMenuRequested, this, &AlertsPanel::contextMenu);
  connect(view_, &QTableView::doubleClicked, this, [this](const QModelIndex& index) {
    if (const AlertEntry* e = model_->at(index.row())) Q_EMIT jobActivated(QString::fromStdString(e->jobId));
  });
  connect(&log_, &AlertLog::changed, this, &AlertsPanel::refresh);
  refresh();
}

void AlertsPanel::refresh() {
  const quint64 selected = model_->serial(view_->currentIndex().row());
  // The job filter lists the jobs that have alerts.
  std::set<std::string> ids;
  for (const AlertEntry* e : log_.entries()) ids.insert(e->jobId);
  for (const auto& id : ids) {
    const QString q = QString::fromStdString(id);
    if (jobs_->findData(q) < 0) jobs_->addItem(q, q);
  }
  model_->refresh();
  if (const int row = model_->rowOf(selected); row >= 0) view_->setCurrentIndex(model_->index(row, 0));
  int firing = 0, silenced = 0, undelivered = 0;
  for (const AlertEntry* e : log_.entries(model_->jobFilter().toStdString())) {
    if (e->active()) {
      ++firing;
      silenced += log_.silencedUntil(e->jobId, e->rule).has_value();
    }
    undelivered += e->status == AlertEntry::Status::kUndelivered;
  }
  QStringList parts;
  parts << (firing == 1 ? tr("1 firing") : tr("%1 firing").arg(firing));
  if (silenced) parts << tr("%1 silenced").arg(silenced);
  if (undelivered) parts << (undelivered == 1 ? tr("1 webhook did not take one") : tr("%1 undelivered").arg(undelivered));
  summary_->setText(parts.join(QStringLiteral(" · ")));
  updateButtons();
}

void AlertsPanel::setJobFilter(const QString& jobId) {
  if (!jobId.isEmpty() && jobs_->findData(jobId) < 0) jobs_->addItem(jobId, jobId);
  jobs_->setCurrentIndex(std::max(0, jobs_->findData(jobId)));
}

void AlertsPanel::select(quint64 serial) {
  if (model_->rowOf(serial) < 0) setJobFilter({});
  if (const int row = model_->rowOf(serial); row >= 0) {
    view_->setCurrentIndex(model_->index(row, 0));
    view_->scrollTo(model_->index(row, 0));
  }
}

void AlertsPanel::updateButtons() {
  const AlertEntry* e = model_->at(view_->currentIndex().row());
  const bool rule = e && !e->rule.empty();
  const bool silenced = rule && log_.silencedUntil(e->jobId, e->rule).has_value();
  silence_->setEnabled(rule && !silenced);
  unsilence_->setEnabled(silenced);
}

void AlertsPanel::silenceSelected(std::int64_t seconds) {
  const AlertEntry* e = model_->at(view_->currentIndex().row());
  if (!e || e->rule.empty()) return;
  const std::string job = e->jobId, rule = e->rule;  // the log's change refreshes the model under e
  log_.silence(job, rule, seconds);
}

void AlertsPanel::unsilenceSelected() {
  const AlertEntry* e = model_->at(view_->currentIndex().row());
  if (!e || e->rule.empty()) return;
  const std::string job = e->jobId, rule = e->rule;
  log_.unsilence(job, rule);
}

void AlertsPanel::contextMenu(const QPoint& at) {
  const QModelIndex index = view_->indexAt(at);
  const AlertEntry* e = model_->at(index.row());
  if (!e) return;
  view_->setCurrentIndex(index);
  QMenu menu(this);
  menu.setToolTipsVisible(true);
  if (!e->rule.empty()) {
    if (log_.silencedUntil(e->jobId, e->rule)) {
      menu.addAction(tr("Unsilence"), this, &AlertsPanel::unsilenceSelected);
    } else {
      for (const auto& [label, seconds] : {std::pair{tr("Silence for 15 min"), 900}, {tr("Silence for 1 h"), 3600},
                                           {tr("Silence for 4 h"), 4 * 3600}, {tr("Silence for 1 day"), 24 * 3600}}) {
        QAction* action = menu.addAction(label, this, [this, s = seconds] { silenceSelected(s); });
        action->setToolTip(silenceTip());
      }
    }
    menu.addSeparator();
  }
  const QString job = QString::fromStdString(e->jobId);
  menu.addAction(tr("Show Job %1").arg(job), this, [this, job] { Q_EMIT jobActivated(job); });
  menu.exec(view_->viewport()->mapToGlobal(at));
}

}  // namespace lockstep::app
