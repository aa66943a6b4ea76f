#include "AddAgentDialog.h"

#include <QDialogButtonBox>
#include <QFormLayout>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QVBoxLayout>

#include "lockstep/client/agent_client.h"
#include "lockstep/net/keys.h"

namespace lockstep::app {

AddAgentDialog::AddAgentDialog(QWidget* parent) : QDialog(parent) {
  setWindowTitle(tr("Add Agent"));
  auto* layout = new QVBoxLayout(this);
  auto* intro = new QLabel(tr("On the node, `lockstep-agent --print-key` prints the agent's public key. The key you "
                              "enter is pinned: the app will only talk to an agent that holds it."),
                           this);
  intro->setWordWrap(true);
  layout->addWidget(intro);
  auto* form = new QFormLayout;
  address_ = new QLineEdit(this);
  address_->setObjectName(QStringLiteral("address"));
  address_->setPlaceholderText(QStringLiteral("gpu-node-1:7700"));
  key_ = new QLineEdit(this);
  key_->setObjectName(QStringLiteral("key"));
  key_->setPlaceholderText(tr("40-character Z85 public key"));
  fingerprint_ = new QLabel(this);
  fingerprint_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  form->addRow(tr("Address"), address_);
  form->addRow(tr("Public key"), key_);
  form->addRow(tr("Fingerprint"), fingerprint_);
  layout->addLayout(form);
  buttons_ = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
  buttons_->button(QDialogButtonBox::Ok)->setText(tr("Trust and Connect"));
  connect(buttons_, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons_, &QDialogButtonBox::rejected, this, &QDialog::reject);
  layout->addWidget(buttons_);
  connect(address_, &QLineEdit::textChanged, this, &AddAgentDialog::revalidate);
  connect(key_, &QLineEdit::textChanged, this, &AddAgentDialog::revalidate);
  revalidate();
}

QString AddAgentDialog::address() const { return address_->text().trimmed(); }
QString AddAgentDialog::key() const { return key_->text().trimmed(); }

void AddAgentDialog::revalidate() {
  const bool keyOk = isValidPublicKey(key().toStdString());
  fingerprint_->setText(keyOk ? QString::fromStdString(fingerprint(key().toStdString()))
                              : key().isEmpty() ? QString() : tr("not a valid key"));
  const bool addressOk = !address().isEmpty() && parseAgentAddress(address().toStdString()).ok();
  buttons_->button(QDialogButtonBox::Ok)->setEnabled(keyOk && addressOk);
}

}  // namespace lockstep::app
