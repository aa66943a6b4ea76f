#pragma once
// Utilization of many devices over time as a grid of coloured cells: one row per GPU (or CPU rank),
// one column per second, newest on the right. Rows are at least kMinRowHeight pixels: beyond what
// fits, a scroll bar (and the wheel) moves through them, and only the rows in view are drawn, as
// one image. Labels thin out to every k-th row when rows get short; a cell's value is in its
// tooltip.

#include <QString>
#include <QWidget>
#include <vector>

class QScrollBar;

namespace lockstep::app {

class HeatmapWidget : public QWidget {
  Q_OBJECT
 public:
  static constexpr int kMinRowHeight = 4;

  explicit HeatmapWidget(QWidget* parent = nullptr);

  struct Row {
    QString label;
    std::vector<double> values;  // one per column, percent; NaN for no sample
  };
  void setRows(std::vector<Row> rows, QString title);
  int rowCount() const { return static_cast<int>(rows_.size()); }
  QString rowLabel(int row) const { return row >= 0 && row < rowCount() ? rows_[static_cast<std::size_t>(row)].label : QString(); }
  int firstVisibleRow() const;
  int visibleRowCount() const;
  void scrollToRow(int row);
  QSize sizeHint() const override { return {420, 240}; }

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  bool event(QEvent* event) override;

 private:
  QRectF gridRect() const;
  double rowHeight() const;
  std::size_t columns() const;
  void layoutScrollBar();
  std::vector<Row> rows_;
  QString title_;
  QScrollBar* scroll_;
};

}  // namespace lockstep::app
