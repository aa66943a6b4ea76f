#include "HeatmapWidget.h"

#include <QHelpEvent>
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

HeatmapWidget::HeatmapWidget(QWidget* parent) : QWidget(parent) {
  setMinimumSize(200, 120);
  setAttribute(Qt::WA_OpaquePaintEvent, false);
}

void HeatmapWidget::setRows(std::vector<Row> rows, QString title) {
  rows_ = std::move(rows);
  title_ = std::move(title);
  update();
}

QRectF HeatmapWidget::gridRect() const {
  return QRectF(kLabelWidth, kTitleHeight, width() - kLabelWidth - 8, height() - kTitleHeight - 18);
}

void HeatmapWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  const QPalette& pal = palette();
  p.setPen(pal.color(QPalette::WindowText));
  QFont titleFont = font();
  titleFont.setBold(true);
  p.setFont(titleFont);
  p.drawText(QRectF(0, 0, width(), kTitleHeight), Qt::AlignLeft | Qt::AlignVCenter, title_);
  p.setFont(font());
  const QRectF grid = gridRect();
  if (rows_.empty()) {
    p.setPen(pal.color(QPalette::PlaceholderText));
    p.drawText(grid, Qt::AlignCenter, tr("No samples yet"));
    return;
  }
  const double rowHeight = grid.height() / static_cast<double>(rows_.size());
  const int labelEvery = std::max(1, static_cast<int>(std::ceil(12.0 / rowHeight)));
  std::size_t columns = 0;
  for (const auto& r : rows_) columns = std::max(columns, r.values.size());
  const double colWidth = columns ? grid.width() / static_cast<double>(columns) : grid.width();
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    const double y = grid.top() + static_cast<double>(i) * rowHeight;
    const auto& values = rows_[i].values;
    // Right-aligned: the newest second is at the right edge whatever the row's length.
    const double x0 = grid.right() - static_cast<double>(values.size()) * colWidth;
    for (std::size_t c = 0; c < values.size(); ++c) {
      const QRectF cell(x0 + static_cast<double>(c) * colWidth, y, std::ceil(colWidth), std::max(1.0, rowHeight - (rowHeight > 4 ? 1 : 0)));
      p.fillRect(cell, std::isnan(values[c]) ? pal.color(QPalette::AlternateBase) : ramp(values[c]));
    }
    if (static_cast<int>(i) % labelEvery == 0) {
      p.setPen(pal.color(QPalette::WindowText));
      p.drawText(QRectF(0, y, kLabelWidth - 4, std::max(rowHeight, 12.0)), Qt::AlignRight | Qt::AlignVCenter,
                 rows_[i].label);
    }
  }
  p.setPen(pal.color(QPalette::PlaceholderText));
  p.drawText(QRectF(grid.left(), grid.bottom() + 2, grid.width(), 14), Qt::AlignLeft,
             tr("%1 s ago").arg(columns));
  p.drawText(QRectF(grid.left(), grid.bottom() + 2, grid.width(), 14), Qt::AlignRight, tr("now"));
}

bool HeatmapWidget::event(QEvent* e) {
  if (e->type() != QEvent::ToolTip || rows_.empty()) return QWidget::event(e);
  auto* help = static_cast<QHelpEvent*>(e);
  const QRectF grid = gridRect();
  const int row = static_cast<int>((help->pos().y() - grid.top()) / (grid.height() / static_cast<double>(rows_.size())));
  if (row < 0 || row >= static_cast<int>(rows_.size()) || !grid.contains(help->pos())) {
    QToolTip::hideText();
    return true;
  }
  const auto& values = rows_[static_cast<std::size_t>(row)].values;
  std::size_t columns = 0;
  for (const auto& r : rows_) columns = std::max(columns, r.values.size());
  const double colWidth = columns ? grid.width() / static_cast<double>(columns) : grid.width();
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
