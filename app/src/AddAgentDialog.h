#pragma once
// Adding an agent: its address and its public key (pinned from then on, like SSH's known_hosts),
// with the key's fingerprint shown as it is typed so it can be compared with the node's.

#include <QDialog>

QT_BEGIN_NAMESPACE
class QDialogButtonBox;
class QLabel;
class QLineEdit;
QT_END_NAMESPACE

namespace lockstep::app {

class AddAgentDialog : public QDialog {
  Q_OBJECT
 public:
  explicit AddAgentDialog(QWidget* parent = nullptr);
  QString address() const;
  QString key() const;

 private:
  void revalidate();
  QLineEdit* address_;
  QLineEdit* key_;
  QLabel* fingerprint_;
  QDialogButtonBox* buttons_;
};

}  // namespace lockstep::app
