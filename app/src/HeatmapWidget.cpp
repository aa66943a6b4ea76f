#include "HeatmapWidget.h"

#include <QHelpEvent>
#include <QImage>
#include <QScrollBar>
#include <QWheelEvent>
#include <QPainter>
#include <QToolTip>
#include <algorithm>
#include <cmath>

namespace lockstep::app {
namespace {

// A perceptually ordered ramp (dark blue to yellow), readable in light and dark palettes.
QColor ramp(double percent) {
  static const QColor stops[] = {QColor(48, 18, 59), QColor(40, 110, 200), QColor(30, 180, 150), QColor(160, 220, 60),
                                 QColor(250, 230, 40)};
  const double t = std::clamp(percent / 100.0, 0.0, 1.0) * 4.0;
  const int i = std::min(static_cast<int>(t), 3);
  const double f = t - i;
  const QColor& a = stops[i];
  const QColor& b = stops[i + 1];
  return QColor::fromRgbF(static_cast<float>(a.redF() + (b.redF() - a.redF()) * f),
                          static_cast<float>(a.greenF() + (b.greenF() - a.greenF()) * f),
                          static_cast<float>(a.blueF() + (b.blueF() - a.blueF()) * f));
}

constexpr int kLabelWidth = 78;
constexpr int kTitleHeight = 20;

}  // namespace

HeatmapWidget::HeatmapWidget(QWidget* parent) : QWidget(parent), scroll_(new QScrollBar(Qt::Vertical, this)) {
  setMinimumSize(200, 120);
  setAttribute(Qt::WA_OpaquePaintEvent, false);
  scroll_->hide();
  connect(scroll_, &QScrollBar::valueChanged, this, qOverload<>(&QWidget::update));
}

void HeatmapWidget::setRows(std::vector<Row> rows, QString title) {
  rows_ = std::move(rows);
  title_ = std::move(title);
  layoutScrollBar();
  update();
}

QRectF HeatmapWidget::gridRect() const {
  const int bar = scroll_->isVisible() ? scroll_->width() : 0;
  return QRectF(kLabelWidth, kTitleHeight, width() - kLabelWidth - 8 - bar, height() - kTitleHeight - 18);
}

double HeatmapWidget::rowHeight() const {
  const double fit = gridRect().height() / static_cast<double>(std::max<std::size_t>(rows_.size(), 1));
  return std::max(fit, static_cast<double>(kMinRowHeight));
}

std::size_t HeatmapWidget::columns() const {
  std::size_t n = 0;
  for (const auto& r : rows_) n = std::max(n, r.values.size());
  return n;
}

int HeatmapWidget::visibleRowCount() const {
  const int fit = static_cast<int>(std::floor(gridRect().height() / rowHeight()));
  return std::clamp(fit, 0, rowCount());
}

int HeatmapWidget::firstVisibleRow() const { return scroll_->isVisible() ? scroll_->value() : 0; }

void HeatmapWidget::scrollToRow(int row) { scroll_->setValue(row); }

void HeatmapWidget::layoutScrollBar() {
  const int height = static_cast<int>(gridRect().height());
  const bool needed = rowCount() * kMinRowHeight > height;
  scroll_->setVisible(needed);
  scroll_->setGeometry(width() - scroll_->sizeHint().width(), kTitleHeight, scroll_->sizeHint().width(), height);
  const int visible = visibleRowCount();
  scroll_->setRange(0, std::max(0, rowCount() - visible));
  scroll_->setPageStep(std::max(1, visible));
}

void HeatmapWidget::resizeEvent(QResizeEvent*) { layoutScrollBar(); }

void HeatmapWidget::wheelEvent(QWheelEvent* e) {
  if (!scroll_->isVisible()) return QWidget::wheelEvent(e);
  scroll_->setValue(scroll_->value() - e->angleDelta().y() / 120 * 3);
}

void HeatmapWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  const QPalette& pal = palette();
  p.setPen(pal.color(QPalette::WindowText));
  QFont titleFont = font();
  titleFont.setBold(true);
  p.setFont(titleFont);
  QString title = title_;
  if (scroll_->isVisible()) {
    title += tr(" — rows %1–%2 of %3").arg(firstVisibleRow() + 1).arg(firstVisibleRow() + visibleRowCount()).arg(rowCount());
  }
  p.drawText(QRectF(0, 0, width(), kTitleHeight), Qt::AlignLeft | Qt::AlignVCenter,
             QFontMetrics(titleFont).elidedText(title, Qt::ElideRight, width()));
  p.setFont(font());
  const QRectF grid = gridRect();
  if (rows_.empty()) {
    p.setPen(pal.color(QPalette::PlaceholderText));
    p.drawText(grid, Qt::AlignCenter, tr("No samples yet"));
    return;
  }
  // One pixel per cell, scaled up: a row's cells are one drawImage, not a fillRect each.
  const int first = firstVisibleRow(), shown = visibleRowCount();
  const std::size_t cols = std::max<std::size_t>(columns(), 1);
  QImage cells(static_cast<int>(cols), std::max(shown, 1), QImage::Format_RGB32);
  cells.fill(pal.color(QPalette::AlternateBase));
  for (int i = 0; i < shown; ++i) {
    const auto& values = rows_[static_cast<std::size_t>(first + i)].values;
    // Right-aligned: the newest second is at the right edge whatever the row's length.
    const std::size_t x0 = cols - std::min(cols, values.size());
    auto* line = reinterpret_cast<QRgb*>(cells.scanLine(i));
    for (std::size_t c = 0; c < values.size() && x0 + c < cols; ++c) {
      if (!std::isnan(values[c])) line[x0 + c] = ramp(values[c]).rgb();
    }
  }
  const double rh = rowHeight();
  p.drawImage(QRectF(grid.left(), grid.top(), grid.width(), rh * shown), cells);
  const int labelEvery = std::max(1, static_cast<int>(std::ceil(12.0 / rh)));
  p.setPen(pal.color(QPalette::WindowText));
  for (int i = 0; i < shown; ++i) {
    if ((first + i) % labelEvery != 0) continue;
    p.drawText(QRectF(0, grid.top() + i * rh, kLabelWidth - 4, std::max(rh, 12.0)), Qt::AlignRight | Qt::AlignVCenter,
               rows_[static_cast<std::size_t>(first + i)].label);
  }
  p.setPen(pal.color(QPalette::PlaceholderText));
  p.drawText(QRectF(grid.left(), grid.bottom() + 2, grid.width(), 14), Qt::AlignLeft, tr("%1 s ago").arg(cols));
  p.drawText(QRectF(grid.left(), grid.bottom() + 2, grid.width(), 14), Qt::AlignRight, tr("now"));
}

bool HeatmapWidget::event(QEvent* e) {
  if (e->type() != QEvent::ToolTip || rows_.empty()) return QWidget::event(e);
  auto* help = static_cast<QHelpEvent*>(e);
  const QRectF grid = gridRect();
  const int row = firstVisibleRow() + static_cast<int>((help->pos().y() - grid.top()) / rowHeight());
  if (row < firstVisibleRow() || row >= firstVisibleRow() + visibleRowCount() || !grid.contains(help->pos())) {
    QToolTip::hideText();
    return true;
  }
  const auto& values = rows_[static_cast<std::size_t>(row)].values;
  const std::size_t cols = columns();
  const double colWidth = cols ? grid.width() / static_cast<double>(cols) : grid.width();
  const int fromRight = static_cast<int>((grid.right() - help->pos().x()) / colWidth);
  const int col = static_cast<int>(values.size()) - 1 - fromRight;
  if (col >= 0 && col < static_cast<int>(values.size()) && !std::isnan(values[static_cast<std::size_t>(col)])) {
    QToolTip::showText(help->globalPos(), tr("%1: %2% (%3 s ago)")
                                              .arg(rows_[static_cast<std::size_t>(row)].label)
                                              .arg(values[static_cast<std::size_t>(col)], 0, 'f', 0)
                                              .arg(fromRight));
  } else {
    QToolTip::hideText();
  }
  return true;
}

}  // namespace lockstep::app
