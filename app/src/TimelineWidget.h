#pragma once
// Where every rank's steps went: one lane per rank, grouped under its node (natural order), each
// step drawn as its phases (kpi/timeline.h) on one clock across nodes, its collectives over them, the newest on the right
// while it follows the job. Like Perfetto: Ctrl+wheel (or W/S) zooms at the pointer, dragging or
// Shift+wheel (or A/D) pans, the wheel scrolls the lanes; panning stops following, setFollow
// resumes it. Hovering a box shows its figures; a stalled rank's lane stops with a red mark, and a
// click on a lane's name asks for the job's stacks.
//
// Only the lanes in view are read (under the job's lock) and drawn, and at most one box per pixel
// column of a lane, so a refresh costs the same at 8 ranks and at 1024.

#include <QScrollBar>
#include <QString>
#include <QWidget>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "lockstep/kpi/timeline.h"

namespace lockstep::app {

class TimelineWidget : public QWidget {
  Q_OBJECT
 public:
  static constexpr int kLaneHeight = 14;
  static constexpr int kLabelWidth = 130;

  // Calls its argument with the job's timeline, under the job's lock.
  using Reader = std::function<void(const std::function<void(const kpi::Timeline&)>&)>;

  explicit TimelineWidget(QWidget* parent = nullptr);

  // empty: nothing to show, and `why` says so in place of "No steps yet"
  void setSource(Reader reader, QString why = {});
  const QString& why() const { return why_; }
  void setStalledRanks(std::set<std::uint32_t> ranks) { stalled_ = std::move(ranks); }
  void refresh();  // reads the lanes in view again; the dashboard calls it on its timer

  bool following() const { return follow_; }
  void setFollow(bool follow);
  // The time range in view, on this client's clock (Unix µs).
  std::pair<std::int64_t, std::int64_t> viewRange() const { return {viewEndUs_ - viewSpanUs_, viewEndUs_}; }
  void setViewRange(std::int64_t fromUs, std::int64_t toUs);
  // Scrolls `rank`'s lane into the middle of the view and marks it (at 1024 ranks, the one to look at).
  void showRank(std::uint32_t rank);
  std::optional<std::uint32_t> markedRank() const { return marked_; }

  // What is drawn (tests): the rows in order ("node-a", "rank 0", ...), and a lane's area.
  QStringList rowLabels() const;
  QRect laneRect(std::uint32_t rank) const;  // empty when not in view
  QString tooltipAt(QPoint pos) const;        // what hovering there shows ("": nothing)
  QSize sizeHint() const override { return {900, 420}; }
  QSize minimumSizeHint() const override { return {300, 120}; }

 Q_SIGNALS:
  void followChanged(bool following);
  void stacksRequested();

 protected:
  void paintEvent(QPaintEvent* event) override;
  void resizeEvent(QResizeEvent* event) override;
  void wheelEvent(QWheelEvent* event) override;
  void mousePressEvent(QMouseEvent* event) override;
  void mouseMoveEvent(QMouseEvent* event) override;
  void mouseReleaseEvent(QMouseEvent* event) override;
  void keyPressEvent(QKeyEvent* event) override;
  bool event(QEvent* event) override;

 private:
  struct Row {
    bool node = false;  // a node's heading, else a rank's lane
    std::uint32_t rank = 0;
    QString label;
    std::int64_t offsetUs = 0;               // its node's clock offset
    std::vector<kpi::TimelineStep> steps;    // those in view (only for rows in view)
    std::int64_t lastEndUs = 0;              // its newest step's end, on this client's clock
    std::vector<kpi::TimelinePhase> phases;  // the named phases in view (only for rows in view)
  };
  QRectF lanesRect() const;
  int visibleRows() const;
  double xOf(std::int64_t us) const;
  std::int64_t usAt(double x) const;
  void zoom(double factor, double atX);
  void pan(double pixels);
  void layoutScrollBar();
  void paintAxis(QPainter& p, const QRectF& area);
  void paintRow(QPainter& p, const Row& row, const QRectF& rect);
  void paintPhases(QPainter& p, const Row& row, const QRectF& rect);
  void paintCollectives(QPainter& p, const Row& row, const QRectF& rect);
  static void paintSwatch(QPainter& p, const QRectF& r, kpi::Phase phase);
  QString collectiveTip(const Row& row, std::int64_t at, std::int64_t slack) const;
  void paintFooter(QPainter& p);

  Reader reader_;
  QString why_;
  std::vector<Row> rows_;  // every row's heading; boxes only for those in view
  std::map<std::string, ClockOffset> clocks_;
  std::set<std::uint32_t> stalled_;
  std::optional<std::uint32_t> marked_;  // showRank's
  std::int64_t originUs_ = 0;  // the first step's start: "0 s" on the axis
  std::int64_t newestUs_ = 0;
  std::int64_t viewEndUs_ = 0;
  std::int64_t viewSpanUs_ = 10'000'000;
  bool follow_ = true;
  QScrollBar* scroll_;
  std::optional<QPoint> dragFrom_;
};

}  // namespace lockstep::app
