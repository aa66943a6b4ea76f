#pragma once
// The alerts of the jobs the app watches, as a table (the Alerts panel's): firing first, then the
// others newest first; undelivered webhooks too. refresh() re-reads the AlertLog, and the rows
// reorder as alerts fire and resolve: views keep their selection by serial().

#include <QAbstractTableModel>
#include <vector>

#include "AlertLog.h"

namespace lockstep::app {

class AlertsModel : public QAbstractTableModel {
  Q_OBJECT
 public:
  enum Column { kTime, kJob, kState, kRule, kValue, kAbout, kText };
  explicit AlertsModel(const AlertLog& log, QObject* parent = nullptr);

  void setJobFilter(const QString& jobId);  // empty: every job
  QString jobFilter() const { return jobFilter_; }
  void refresh();

  int rowCount(const QModelIndex& parent = {}) const override;
  int columnCount(const QModelIndex& parent = {}) const override;
  QVariant data(const QModelIndex& index, int role) const override;
  QVariant headerData(int section, Qt::Orientation orientation, int role) const override;

  const AlertEntry* at(int row) const;
  quint64 serial(int row) const;
  int rowOf(quint64 serial) const;  // -1: not listed

 private:
  const AlertLog& log_;
  QString jobFilter_;
  std::vector<AlertEntry> rows_;  // copies: the log may move its entries
};

// "firing", "resolved", "fired" (an instant alert), "undelivered"; with ", silenced until 14:05".
QString alertStateText(const AlertEntry& entry, const AlertLog& log);
// The ranks and nodes it is about, and the cause: "rank 1 on node-a (data wait)".
QString alertAboutText(const alerts::Alert& alert);
QString alertValueText(const alerts::Alert& alert);

}  // namespace lockstep::app
