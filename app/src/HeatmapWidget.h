#pragma once
// Utilization of many devices over time as a grid of coloured cells: one row per GPU (or CPU rank),
// one column per second, newest on the right. Stays readable at 64 rows: labels thin out to every
// k-th row when rows get short, and a cell's value is in its tooltip.

#include <QString>
#include <QWidget>
#include <vector>

namespace lockstep::app {

class HeatmapWidget : public QWidget {
  Q_OBJECT
 public:
  explicit HeatmapWidget(QWidget* parent = nullptr);

  struct Row {
    QString label;
    std::vector<double> values;  // one per column, percent; NaN for no sample
  };
  void setRows(std::vector<Row> rows, QString title);
  int rowCount() const { return static_cast<int>(rows_.size()); }
  QSize sizeHint() const override { return {420, 240}; }

 protected:
  void paintEvent(QPaintEvent* event) override;
  bool event(QEvent* event) override;

 private:
  QRectF gridRect() const;
  std::vector<Row> rows_;
  QString title_;
};

}  // namespace lockstep::app
