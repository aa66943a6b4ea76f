#pragma once
// The live dashboard of one job: its state, KPI tiles and charts, and a Stop button. refresh()
// re-reads the job's KPI tracker; the main window calls it on a coalescing timer, so a burst of
// messages costs one repaint.

#include <QLabel>
#include <QPushButton>
#include <QWidget>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "ClusterStore.h"

QT_BEGIN_NAMESPACE
class QTabWidget;
class QChart;
class QChartView;
class QLineSeries;
class QAreaSeries;
class QValueAxis;
QT_END_NAMESPACE

namespace lockstep::app {

class CommChart;
class HeatmapWidget;
class TimelineWidget;

class KpiTile : public QFrame {
  Q_OBJECT
 public:
  KpiTile(const QString& title, QWidget* parent = nullptr);
  void set(const QString& value, const QString& detail = {});
  QString value() const { return value_->text(); }
  QString detail() const { return detail_->text(); }

 private:
  QLabel* value_;
  QLabel* detail_;
};

class DashboardWidget : public QWidget {
  Q_OBJECT
 public:
  explicit DashboardWidget(ClusterStore& store, QWidget* parent = nullptr);

  void showJob(const QString& jobId);  // a job of the store, live
  // A job from the history, frozen: its KPIs as loadRecordedJob worked them out.
  void showRecorded(std::shared_ptr<const JobEntry> job);
  bool showsRecorded() const { return recorded_ != nullptr; }
  QString jobId() const { return jobId_; }
  // The newest step report the last refresh showed (its stamp at the rank): what the dashboard is
  // up to date with. lockstep-bench-app reads it when the heatmap paints.
  std::int64_t shownUpToUnixUs() const { return shownUpToUs_; }
  // Only the heatmap rows of nodes whose name holds `text` (any case); "" shows every node.
  void setNodeFilter(const QString& text);
  void refresh();
  // Ask before stopping (the default); tests turn it off.
  void setConfirmStops(bool confirm) { confirmStops_ = confirm; }

  KpiTile* tile(const QString& name) const { return tiles_.value(name); }
  int chartPointCount(const QString& chart) const;
  const CommChart* commChart() const { return comm_; }
  const HeatmapWidget* heatmap() const { return heatmap_; }
  TimelineWidget* timeline() const { return timeline_; }
  void showTimeline();  // its tab

 public Q_SLOTS:
  void stopJob();  // asks (stopRequested) once the user confirmed
  void showStacks();  // what the job's ranks are doing now (StacksDialog)

 Q_SIGNALS:
  void stopRequested(QString jobId);

 protected:
  void changeEvent(QEvent* event) override;

 private:
  void buildCharts();
  QWidget* buildTimelinePage();
  QString frameBanner(const JobEntry& job) const;
  void refreshTimeline(const JobEntry& job, const std::optional<Stall>& stall);
  void applyTheme();
  void refreshCharts(const JobEntry& job, const kpi::JobKpis& k);
  static QString slowestRanksText(const kpi::JobKpis& k);
  void setMfuTile(const kpi::JobKpis& k, const QString& noSteps);
  void setTitle(const JobEntry& job);
  QChartView* makeView(QChart* chart);

  ClusterStore& store_;
  QString jobId_;
  std::shared_ptr<const JobEntry> recorded_;
  bool confirmStops_ = true;
  QLabel* title_;
  // Whose nodes the title names (a job's id and attempt): at 2,048 nodes, not sorted again each refresh.
  std::pair<std::string, std::uint32_t> titleOf_;
  QLabel* state_;
  QLabel* banner_;
  QPushButton* stop_;
  QPushButton* stacks_;
  QPushButton* toSlowest_ = nullptr;           // the timeline's: scrolls to the slowest rank
  std::optional<std::uint32_t> slowestRank_;  // as the KPIs last said
  QMap<QString, KpiTile*> tiles_;
  QWidget* body_;
  QLabel* empty_;

  QChart* utilChart_ = nullptr;
  std::vector<QLineSeries*> utilSeries_;
  QValueAxis* utilX_ = nullptr;
  QValueAxis* utilY_ = nullptr;
  HeatmapWidget* heatmap_ = nullptr;
  QTabWidget* views_ = nullptr;  // the charts, the timeline
  TimelineWidget* timeline_ = nullptr;
  std::shared_ptr<LiveJob> timelineOf_;  // the job the timeline reads
  QChart* throughputChart_ = nullptr;
  QLineSeries* throughput_ = nullptr;
  QValueAxis *throughputX_ = nullptr, *throughputY_ = nullptr;
  QChart* splitChart_ = nullptr;
  QLineSeries *splitData_ = nullptr, *splitCompute_ = nullptr, *splitExposed_ = nullptr, *splitZero_ = nullptr;
  QValueAxis *splitX_ = nullptr, *splitY_ = nullptr;
  QChart* lossChart_ = nullptr;
  QLineSeries* loss_ = nullptr;
  QValueAxis *lossX_ = nullptr, *lossY_ = nullptr;
  QChart* commChart_ = nullptr;
  CommChart* comm_ = nullptr;
  std::int64_t shownUpToUs_ = 0;
  // What the charts last drew: the KPIs published with their series, for which job and filter.
  // Until the ingest publishes again, a refresh (the 1 s tick that ages the ETA) leaves them be.
  struct ChartsOf {
    std::shared_ptr<const LiveJob::Published> published;
    QString jobId, nodeFilter;
    bool operator==(const ChartsOf&) const = default;
  } chartsOf_;
  QString nodeFilter_;
};

}  // namespace lockstep::app
