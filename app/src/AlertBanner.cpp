#include "AlertBanner.h"

#include <QEvent>
#include <QHBoxLayout>
#include <QLabel>
#include <QPushButton>
#include <QStyle>

#include "AlertsPanel.h"

namespace lockstep::app {

AlertBanner::AlertBanner(AlertLog& log, QWidget* parent) : QFrame(parent), log_(log) {
  setObjectName(QStringLiteral("alertBanner"));
  setFrameShape(QFrame::StyledPanel);
  auto* layout = new QHBoxLayout(this);
  layout->setContentsMargins(10, 4, 4, 4);
  auto* icon = new QLabel(this);
  icon->setPixmap(style()->standardIcon(QStyle::SP_MessageBoxWarning).pixmap(20, 20));
  text_ = new QLabel(this);
  text_->setObjectName(QStringLiteral("alertBannerText"));
  text_->setWordWrap(true);
  text_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  more_ = new QLabel(this);
  more_->setObjectName(QStringLiteral("alertBannerMore"));
  show_ = new QPushButton(tr("Show"), this);
  show_->setObjectName(QStringLiteral("alertBannerShow"));
  show_->setToolTip(tr("Open the Alerts panel at this alert"));
  silence_ = new QPushButton(tr("Silence 1 h"), this);
  silence_->setObjectName(QStringLiteral("alertBannerSilence"));
  silence_->setToolTip(tr("No banner or desktop notification for this rule of this job for an hour, in this app only: "
                          "the agent still notifies the job's webhooks."));
  close_ = new QPushButton(QStringLiteral("\u00d7"), this);
  close_->setObjectName(QStringLiteral("alertBannerClose"));
  close_->setToolTip(tr("Close this alert's banner (the Alerts panel keeps it)"));
  close_->setFlat(true);
  close_->setFixedWidth(close_->sizeHint().height());
  layout->addWidget(icon);
  layout->addWidget(text_, 1);
  layout->addWidget(more_);
  layout->addWidget(show_);
  layout->addWidget(silence_);
  layout->addWidget(close_);

  connect(show_, &QPushButton::clicked, this, [this] {
    if (shown_) Q_EMIT showRequested(shown_);
  });
  connect(silence_, &QPushButton::clicked, this, [this] {
    if (const AlertEntry* e = log_.entry(shown_)) {
      const std::string job = e->jobId, rule = e->rule;
      log_.silence(job, rule, AlertsPanel::kSilenceSeconds);
    }
  });
  connect(close_, &QPushButton::clicked, this, [this] {
    if (shown_) log_.close(shown_);
  });
  connect(&log_, &AlertLog::changed, this, &AlertBanner::refresh);
  applyPalette();
  refresh();
}

QString AlertBanner::text() const {
  if (!shown_) return {};
  return more_->text().isEmpty() ? text_->text() : text_->text() + QLatin1Char(' ') + more_->text();
}

void AlertBanner::refresh() {
  const auto entries = log_.bannerEntries();
  if (entries.empty()) {
    shown_ = 0;
    text_->clear();
    more_->clear();
    hide();
    return;
  }
  const AlertEntry* e = entries.front();
  shown_ = e->serial;
  text_->setText(QString::fromStdString(e->message));
  text_->setToolTip(e->alert.evidence.empty() ? QString() : QString::fromStdString(e->alert.evidence).left(2000));
  more_->setText(entries.size() > 1 ? tr("(+%1 more)").arg(entries.size() - 1) : QString());
  silence_->setEnabled(!e->rule.empty());
  show();
}

void AlertBanner::changeEvent(QEvent* event) {
  if (event->type() == QEvent::PaletteChange) applyPalette();
  QFrame::changeEvent(event);
}

// A red that reads in a light or a dark palette.
void AlertBanner::applyPalette() {
  const bool dark = palette().color(QPalette::Window).lightness() < 128;
  const QString style = dark ? QStringLiteral("#alertBanner { background: #5c1f1f; border: 1px solid #a33; border-radius: 3px; }"
                                              " #alertBanner QLabel { color: #ffdede; }")
                             : QStringLiteral("#alertBanner { background: #fdecea; border: 1px solid #e0a0a0; border-radius: 3px; }"
                                              " #alertBanner QLabel { color: #611a15; }");
  if (styleSheet() != style) setStyleSheet(style);
}

}  // namespace lockstep::app
