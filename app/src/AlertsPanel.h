#pragma once
// The Alerts panel (a dock of the main window): every watched job's alerts, past and present,
// firing first, with the webhooks that did not take one; a rule is silenced (and unsilenced) from
// here, by button or context menu. Silences are this app's only (AlertLog): the agent still
// notifies webhooks, and the tooltips say so. It only shows and asks; the AlertLog holds the data.

#include <QWidget>

#include "AlertLog.h"

QT_BEGIN_NAMESPACE
class QComboBox;
class QLabel;
class QPushButton;
class QTableView;
QT_END_NAMESPACE

namespace lockstep::app {

class AlertsModel;

class AlertsPanel : public QWidget {
  Q_OBJECT
 public:
  static constexpr std::int64_t kSilenceSeconds = 3600;

  explicit AlertsPanel(AlertLog& log, QWidget* parent = nullptr);

  AlertsModel* model() const { return model_; }
  QTableView* view() const { return view_; }
  void setJobFilter(const QString& jobId);  // empty: every job
  void select(quint64 serial);              // shows that alert's row, selected
  void refresh();

  // What the selected row's rule is about: silence or unsilence it.
  void silenceSelected(std::int64_t seconds = kSilenceSeconds);
  void unsilenceSelected();

 Q_SIGNALS:
  void jobActivated(QString jobId);  // a double click: show that job's dashboard

 private:
  void updateButtons();
  void contextMenu(const QPoint& at);

  AlertLog& log_;
  AlertsModel* model_;
  QComboBox* jobs_;
  QLabel* summary_;
  QPushButton* silence_;
  QPushButton* unsilence_;
  QTableView* view_;
};

}  // namespace lockstep::app
