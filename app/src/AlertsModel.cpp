#include "AlertsModel.h"

#include <QColor>
#include <QDateTime>
#include <QGuiApplication>
#include <QPalette>
#include <cmath>

#include "Present.h"

namespace lockstep::app {

namespace {

QString timeText(std::int64_t unixUs) {
  const QDateTime t = QDateTime::fromMSecsSinceEpoch(unixUs / 1000);
  const bool today = t.date() == QDate::currentDate();
  return t.toString(today ? QStringLiteral("HH:mm:ss") : QStringLiteral("yyyy-MM-dd HH:mm:ss"));
}

template <class T>
QString joined(const std::vector<T>& items, int most) {
  QStringList out;
  for (std::size_t i = 0; i < items.size() && static_cast<int>(i) < most; ++i) {
    if constexpr (std::is_same_v<T, std::string>) {
      out << qtext(items[i]);
    } else {
      out << QString::number(items[i]);
    }
  }
  if (static_cast<int>(items.size()) > most) out << QStringLiteral("+%1").arg(items.size() - static_cast<std::size_t>(most));
  return out.join(QStringLiteral(", "));
}

}  // namespace

QString alertStateText(const AlertEntry& entry, const AlertLog& log) {
  QString text;
  switch (entry.status) {
    case AlertEntry::Status::kFiring: text = QObject::tr("firing"); break;
    case AlertEntry::Status::kFired: text = QObject::tr("fired"); break;
    case AlertEntry::Status::kResolved: text = QObject::tr("resolved"); break;
    case AlertEntry::Status::kUndelivered: return QObject::tr("undelivered");
  }
  if (auto until = log.silencedUntil(entry.jobId, entry.rule)) {
    text += QObject::tr(", silenced until %1").arg(QDateTime::fromMSecsSinceEpoch(*until / 1000).toString(QStringLiteral("HH:mm")));
  }
  return text;
}

QString alertValueText(const alerts::Alert& alert) {
  if (!alert.value) return dash();
  if (std::isnan(*alert.value)) return QStringLiteral("NaN");
  const QString unit = alert.unit == "money" ? QString() : qtext(alert.unit);
  const int decimals = std::abs(*alert.value) >= 100 ? 0 : std::abs(*alert.value) >= 1 ? 1 : 3;
  return QString::number(*alert.value, 'f', decimals) + unit;
}

QString alertAboutText(const alerts::Alert& alert) {
  QString text;
  if (!alert.ranks.empty()) text = (alert.ranks.size() == 1 ? QObject::tr("rank ") : QObject::tr("ranks ")) + joined(alert.ranks, 8);
  if (!alert.nodes.empty()) {
    if (!text.isEmpty()) text += QObject::tr(" on ");
    text += joined(alert.nodes, 4);
  }
  if (!alert.cause.empty()) text += (text.isEmpty() ? QString() : QStringLiteral(" ")) + QStringLiteral("(%1)").arg(qtext(alert.cause));
  return text.isEmpty() ? QObject::tr("the job") : text;
}

AlertsModel::AlertsModel(const AlertLog& log, QObject* parent) : QAbstractTableModel(parent), log_(log) {}

void AlertsModel::setJobFilter(const QString& jobId) {
  if (jobId == jobFilter_) return;
  jobFilter_ = jobId;
  refresh();
}

void AlertsModel::refresh() {
  beginResetModel();
  rows_.clear();
  for (const AlertEntry* e : log_.entries(jobFilter_.toStdString())) rows_.push_back(*e);
  endResetModel();
}

int AlertsModel::rowCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : static_cast<int>(rows_.size()); }
int AlertsModel::columnCount(const QModelIndex& parent) const { return parent.isValid() ? 0 : kText + 1; }

QVariant AlertsModel::headerData(int section, Qt::Orientation orientation, int role) const {
  if (orientation != Qt::Horizontal || role != Qt::DisplayRole) return {};
  static const QStringList headers = {tr("Time"), tr("Job"), tr("State"), tr("Rule"), tr("Value"), tr("About"), tr("Text")};
  return section >= 0 && section < headers.size() ? headers[section] : QVariant();
}

const AlertEntry* AlertsModel::at(int row) const {
  return row >= 0 && row < static_cast<int>(rows_.size()) ? &rows_[static_cast<std::size_t>(row)] : nullptr;
}
quint64 AlertsModel::serial(int row) const { return at(row) ? at(row)->serial : 0; }
int AlertsModel::rowOf(quint64 serial) const {
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    if (rows_[i].serial == serial) return static_cast<int>(i);
  }
  return -1;
}

QVariant AlertsModel::data(const QModelIndex& index, int role) const {
  const AlertEntry* e = at(index.row());
  if (!e) return {};
  const bool undelivered = e->status == AlertEntry::Status::kUndelivered;
  if (role == Qt::DisplayRole) {
    switch (index.column()) {
      case kTime: return timeText(e->resolvedUs ? e->resolvedUs : e->firedUs);
      case kJob: return qtext(e->jobId);
      case kState: return alertStateText(*e, log_);
      case kRule: return e->rule.empty() ? dash() : qtext(e->rule);
      case kValue: return undelivered ? dash() : alertValueText(e->alert);
      case kAbout: return undelivered ? tr("a webhook") : alertAboutText(e->alert);
      case kText: return qtext(e->message);
    }
  } else if (role == Qt::ToolTipRole) {
    switch (index.column()) {
      case kTime:
        return e->resolvedUs ? tr("fired %1, resolved %2").arg(timeText(e->firedUs), timeText(e->resolvedUs)) : tr("fired %1").arg(timeText(e->firedUs));
      case kState:
        if (undelivered) return tr("A webhook did not take this alert (the agent tried and gave up).");
        if (e->status == AlertEntry::Status::kFired) return tr("An event: it fires once and does not resolve.");
        return tr("Silences are this app's only: the agent still notifies the job's webhooks.");
      case kText: {
        QString tip = qtext(e->message);
        if (!e->alert.evidence.empty()) tip += QStringLiteral("\n\n") + qtext(e->alert.evidence).left(2000);
        return tip;
      }
      default: return {};
    }
  } else if (role == Qt::ForegroundRole && index.column() == kState) {
    const bool dark = QGuiApplication::palette().color(QPalette::Window).lightness() < 128;
    if (e->status == AlertEntry::Status::kFiring || e->status == AlertEntry::Status::kFired) {
      return log_.silencedUntil(e->jobId, e->rule) ? QVariant() : QVariant(dark ? QColor(0xff, 0x8a, 0x80) : QColor(0xc6, 0x28, 0x28));
    }
    if (e->status == AlertEntry::Status::kUndelivered) return dark ? QColor(0xff, 0xcc, 0x80) : QColor(0xb2, 0x6a, 0x00);
  }
  return {};
}

}  // namespace lockstep::app
