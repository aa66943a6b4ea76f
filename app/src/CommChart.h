#pragma once
// The dashboard's exposed communication per rank: a bar per rank, or beyond kMaxBars the ranks that
// wait longest, most first (a bar per rank at 1024 ranks is neither readable nor cheap to lay out).
// Each bar is stacked by the kind of collective the rank waited on (kpi::CollectiveKpis's
// exposedShare), and what no collective it reported accounts for as "other" (where any rank has
// some); a job whose ranks report no kinds has one part, "communication". The height fits the
// highest bar. Hovering a bar names its rank and its parts.
// GUI thread only; the chart is the dashboard's, which styles it.

#include <QObject>
#include <QStringList>
#include <optional>
#include <vector>

#include "lockstep/kpi/kpi.h"

QT_BEGIN_NAMESPACE
class QChart;
class QStackedBarSeries;
class QBarSet;
class QBarCategoryAxis;
class QValueAxis;
QT_END_NAMESPACE

namespace lockstep::app {

class CommChart : public QObject {
  Q_OBJECT
 public:
  static constexpr int kMaxBars = 32;

  CommChart(QChart* chart, QObject* parent);
  void refresh(const kpi::JobKpis& k);
  // What is shown (tests): bars, the parts' names in stacking order, a bar's hover text.
  int barCount() const { return static_cast<int>(ranks_.size()); }
  QStringList partNames() const;
  QString toolTipOf(int bar) const;
  // The parts' colours again after the chart's theme changed (a theme sets its own).
  void recolor();

 private:
  using Part = std::optional<CollectiveKind>;  // none: "other" (or "communication": no kinds)
  struct Bar {
    std::uint32_t rank = 0;
    double totalPct = 0;
    std::vector<double> pcts;  // by part
  };
  std::vector<Part> partsOf(const kpi::JobKpis& k) const;
  Bar barOf(const kpi::RankKpis& r, const std::vector<Part>& parts) const;
  void setParts(std::vector<Part> parts);
  void setCategories(const QStringList& categories);
  void fitHeight(const std::vector<Bar>& bars);
  QString partName(const Part& part) const;

  QChart* chart_;
  QStackedBarSeries* series_;
  QBarCategoryAxis* x_;
  QValueAxis* y_;
  std::vector<Part> parts_;
  std::vector<QBarSet*> sets_;        // by part
  std::vector<std::uint32_t> ranks_;  // by bar
  std::vector<Bar> bars_;
};

}  // namespace lockstep::app
