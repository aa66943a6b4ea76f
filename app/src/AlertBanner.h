#pragma once
// The banner over the main window's views while an alert fires for a watched job: the newest
// alert's text ("(+N more)" when others fire too), Show (the Alerts panel, at it), Silence 1 h
// (that rule of that job, in this app only) and × (this alert's banner). It follows the AlertLog:
// a resolved or silenced alert leaves it, and it hides when none is left.

#include <QFrame>

#include "AlertLog.h"

QT_BEGIN_NAMESPACE
class QLabel;
class QPushButton;
QT_END_NAMESPACE

namespace lockstep::app {

class AlertBanner : public QFrame {
  Q_OBJECT
 public:
  explicit AlertBanner(AlertLog& log, QWidget* parent = nullptr);

  quint64 shown() const { return shown_; }  // the alert on show; 0: none
  QString text() const;                     // as shown, with "(+N more)"
  void refresh();

 Q_SIGNALS:
  void showRequested(quint64 serial);

 protected:
  void changeEvent(QEvent* event) override;

 private:
  void applyPalette();

  AlertLog& log_;
  quint64 shown_ = 0;
  QLabel* text_;
  QLabel* more_;
  QPushButton* show_;
  QPushButton* silence_;
  QPushButton* close_;
};

}  // namespace lockstep::app
