#include "StacksDialog.h"

#include <QDialogButtonBox>
#include <QFontDatabase>
#include <QLabel>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QThread>
#include <QTime>
#include <QVBoxLayout>
#include <algorithm>
#include <memory>

#include "ClusterStore.h"
#include "lockstep/client/agent_client.h"
#include "lockstep/kpi/stall.h"

namespace lockstep::app {
namespace {

constexpr auto kStacksTimeout = std::chrono::seconds(90);  // an agent takes up to about 45 s

}  // namespace

StacksDialog::StacksDialog(const ClusterStore& store, const QString& jobId, QWidget* parent)
    : QDialog(parent), store_(store), jobId_(jobId) {
  setObjectName(QStringLiteral("stacksDialog"));
  setWindowTitle(tr("Stacks of %1").arg(jobId));
  auto* layout = new QVBoxLayout(this);
  status_ = new QLabel(this);
  status_->setWordWrap(true);
  layout->addWidget(status_);
  text_ = new QPlainTextEdit(this);
  text_->setObjectName(QStringLiteral("stacksText"));
  text_->setReadOnly(true);
  text_->setLineWrapMode(QPlainTextEdit::NoWrap);
  text_->setFont(QFontDatabase::systemFont(QFontDatabase::FixedFont));
  layout->addWidget(text_, 1);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, this);
  auto* again = buttons->addButton(tr("Take Again"), QDialogButtonBox::ActionRole);
  connect(again, &QPushButton::clicked, this, &StacksDialog::take);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  layout->addWidget(buttons);
  resize(900, 640);
  take();
}

QString StacksDialog::text() const { return text_->toPlainText(); }

void StacksDialog::take() {
  if (waiting_ > 0) return;
  ranks_.clear();
  problems_.clear();
  const JobEntry* job = store_.job(jobId_.toStdString());
  if (job) {
    for (const auto& [agentId, part] : job->parts) {
      const AgentEntry* agent = store_.agent(agentId);
      if (!agent || jobStateEnded(part.state)) continue;
      ++waiting_;
      auto result = std::make_shared<Result<StacksReply>>(unavailable("not asked"));
      const AgentAddress address = agent->address;
      const std::string key = agent->publicKey, jobId = jobId_.toStdString();
      const CurveKeyPair keys = store_.keys();
      QThread* thread = QThread::create([result, address, key, keys, jobId] {
        auto client = AgentClient::connect(address, keys, key, std::chrono::seconds(10));
        *result = client ? (*client)->stacks(jobId, std::nullopt, kStacksTimeout) : Result<StacksReply>(client.error());
      });
      connect(thread, &QThread::finished, this, [this, result, id = agentId] { arrived(id, *result); });
      connect(thread, &QThread::finished, thread, &QObject::deleteLater);
      thread->start();
    }
  }
  render();
}

void StacksDialog::arrived(const QString& agent, const Result<StacksReply>& reply) {
  --waiting_;
  if (reply) {
    ranks_.insert(ranks_.end(), reply->ranks.begin(), reply->ranks.end());
  } else {
    problems_ << tr("%1: %2").arg(agent, QString::fromStdString(reply.error().message));
  }
  render();
}

void StacksDialog::render() {
  std::sort(ranks_.begin(), ranks_.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  QString text;
  for (const auto& rank : ranks_) text += QString::fromStdString(kpi::evidenceText(rank)) + QStringLiteral("\n");
  text_->setPlainText(text);
  QString status = waiting_ > 0
                       ? tr("Taking the stacks of %1 on %2 (up to a minute)…")
                             .arg(jobId_, waiting_ == 1 ? tr("its agent") : tr("%1 agents").arg(waiting_))
                   : ranks_.empty() && problems_.isEmpty() ? tr("Job %1 has no running ranks.").arg(jobId_)
                   : tr("What the %1 running ranks of %2 are doing now (taken at %3).")
                         .arg(ranks_.size())
                         .arg(jobId_, QTime::currentTime().toString(QStringLiteral("HH:mm:ss")));
  if (!problems_.isEmpty()) status += QStringLiteral("\n") + problems_.join(QStringLiteral("\n"));
  status_->setText(status);
}

}  // namespace lockstep::app
