#include "TimelineWidget.h"

#include <QHelpEvent>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

#include "lockstep/present/present.h"
#include "lockstep/protocol/names.h"

namespace lockstep::app {
namespace {

constexpr int kAxisHeight = 20;
constexpr int kFooterHeight = 18;
constexpr std::int64_t kShortestSpanUs = 1'000;           // 1 ms across the view
constexpr std::int64_t kLongestSpanUs = 7LL * 24 * 3600'000'000;  // a week

QColor colorOf(kpi::Phase phase) { return QColor(QString::fromUtf8(present::phaseColor(phase).data(), 7)); }

QString ms(std::int64_t us) { return QString::number(static_cast<double>(us) / 1e3, 'f', us < 10'000 ? 2 : 1); }

}  // namespace

TimelineWidget::TimelineWidget(QWidget* parent) : QWidget(parent), scroll_(new QScrollBar(Qt::Vertical, this)) {
  setMouseTracking(true);
  setFocusPolicy(Qt::StrongFocus);
  connect(scroll_, &QScrollBar::valueChanged, this, [this] { refresh(); });
}

void TimelineWidget::setSource(Reader reader, QString why) {
  reader_ = std::move(reader);
  why_ = std::move(why);
  marked_.reset();  // another job's rank
  if (!follow_) return setFollow(true);  // which refreshes
  refresh();
}

void TimelineWidget::setFollow(bool follow) {
  if (follow == follow_) return;
  follow_ = follow;
  Q_EMIT followChanged(follow_);
  refresh();
}

void TimelineWidget::setViewRange(std::int64_t fromUs, std::int64_t toUs) {
  viewSpanUs_ = std::clamp(toUs - fromUs, kShortestSpanUs, kLongestSpanUs);
  viewEndUs_ = fromUs + viewSpanUs_;
  setFollow(false);
  refresh();
}

// Every row's heading, in order; for the rows in view, the steps that overlap the view.
void TimelineWidget::refresh() {
  if (!reader_) {
    rows_.clear();
    update();
    return;
  }
  const int first = scroll_->value(), shown = visibleRows();
  reader_([&](const kpi::Timeline& t) {
    const auto span = t.span();
    originUs_ = span.first;
    newestUs_ = span.second;
    if (follow_) viewEndUs_ = newestUs_;
    clocks_ = t.clocks();
    rows_.clear();
    const std::int64_t from = viewEndUs_ - viewSpanUs_, to = viewEndUs_;
    std::string node;
    for (const auto* lane : t.lanes()) {
      if (rows_.empty() || lane->node != node) {
        node = lane->node;
        rows_.push_back({true, 0, QString::fromStdString(node), 0, {}, 0, {}});
      }
      Row row{false, lane->rank, tr("rank %1").arg(lane->rank), t.offsetOf(lane->node), {}, 0, {}};
      if (!lane->steps.empty()) row.lastEndUs = lane->steps.back().endUs - row.offsetUs;
      const int index = static_cast<int>(rows_.size());
      if (index >= first && index < first + shown) {
        // Steps come in time order: walk back from the newest to the first that ends before the view.
        for (auto it = lane->steps.rbegin(); it != lane->steps.rend(); ++it) {
          const std::int64_t end = it->endUs - row.offsetUs;
          if (end < from) break;
          if (end - it->stepUs <= to) row.steps.push_back(*it);
        }
        std::reverse(row.steps.begin(), row.steps.end());
        for (const auto& phase : lane->phases) {
          const std::int64_t end = phase.endUs - row.offsetUs;
          if (end >= from && end - phase.durationUs <= to) row.phases.push_back(phase);
        }
      }
      rows_.push_back(std::move(row));
    }
  });
  layoutScrollBar();
  // Fewer rows (another job, a taller window) moved the scroll bar: read the lanes now in view.
  if (scroll_->value() != first) return refresh();
  update();
}

void TimelineWidget::showRank(std::uint32_t rank) {
  marked_ = rank;
  refresh();  // the rows and the scroll bar's range as they are now
  for (std::size_t i = 0; i < rows_.size(); ++i) {
    if (rows_[i].node || rows_[i].rank != rank) continue;
    scroll_->setValue(std::max(0, static_cast<int>(i) - visibleRows() / 2));  // refreshes when it moves
    break;
  }
  update();  // the mark
}

QStringList TimelineWidget::rowLabels() const {
  QStringList out;
  for (const auto& row : rows_) out << row.label;
  return out;
}

QRectF TimelineWidget::lanesRect() const {
  const double right = width() - (scroll_->isVisible() ? scroll_->width() : 0);
  return QRectF(kLabelWidth, kAxisHeight, std::max(1.0, right - kLabelWidth), std::max(0, height() - kAxisHeight - kFooterHeight));
}

int TimelineWidget::visibleRows() const { return std::max(1, static_cast<int>(lanesRect().height()) / kLaneHeight); }

QRect TimelineWidget::laneRect(std::uint32_t rank) const {
  const int first = scroll_->value();
  for (int i = first; i < std::min<int>(static_cast<int>(rows_.size()), first + visibleRows()); ++i) {
    const Row& row = rows_[static_cast<std::size_t>(i)];
    if (row.node || row.rank != rank) continue;
    const QRectF area = lanesRect();
    return QRect(static_cast<int>(area.left()), static_cast<int>(area.top()) + (i - first) * kLaneHeight,
                 static_cast<int>(area.width()), kLaneHeight);
  }
  return {};
}

double TimelineWidget::xOf(std::int64_t us) const {
  const QRectF area = lanesRect();
  return area.left() + static_cast<double>(us - (viewEndUs_ - viewSpanUs_)) / static_cast<double>(viewSpanUs_) * area.width();
}

std::int64_t TimelineWidget::usAt(double x) const {
  const QRectF area = lanesRect();
  return viewEndUs_ - viewSpanUs_ + static_cast<std::int64_t>((x - area.left()) / area.width() * static_cast<double>(viewSpanUs_));
}

void TimelineWidget::zoom(double factor, double atX) {
  const std::int64_t anchor = usAt(atX);
  const double share = (atX - lanesRect().left()) / lanesRect().width();
  viewSpanUs_ = std::clamp(static_cast<std::int64_t>(static_cast<double>(viewSpanUs_) * factor), kShortestSpanUs, kLongestSpanUs);
  viewEndUs_ = anchor + static_cast<std::int64_t>((1.0 - share) * static_cast<double>(viewSpanUs_));
  setFollow(false);
  refresh();
}

void TimelineWidget::pan(double pixels) {
  viewEndUs_ -= static_cast<std::int64_t>(pixels / lanesRect().width() * static_cast<double>(viewSpanUs_));
  setFollow(false);
  refresh();
}

void TimelineWidget::layoutScrollBar() {
  const int rows = static_cast<int>(rows_.size()), shown = visibleRows();
  scroll_->setVisible(rows > shown);
  scroll_->setGeometry(width() - scroll_->sizeHint().width(), kAxisHeight, scroll_->sizeHint().width(),
                       std::max(0, height() - kAxisHeight - kFooterHeight));
  QSignalBlocker quiet(scroll_);
  scroll_->setRange(0, std::max(0, rows - shown));
  scroll_->setPageStep(shown);
}

void TimelineWidget::resizeEvent(QResizeEvent*) { refresh(); }

void TimelineWidget::wheelEvent(QWheelEvent* e) {
  const QPoint delta = e->angleDelta();
  if (e->modifiers() & Qt::ControlModifier) return zoom(std::pow(0.8, delta.y() / 120.0), e->position().x());
  if ((e->modifiers() & Qt::ShiftModifier) || delta.x() != 0) {
    return pan((delta.x() != 0 ? delta.x() : delta.y()) / 120.0 * lanesRect().width() / 10);
  }
  // Three lanes a notch; a touchpad's small steps add up to at least one.
  const int lanes = delta.y() / 40;
  scroll_->setValue(scroll_->value() - (lanes != 0 ? lanes : delta.y() > 0 ? 1 : delta.y() < 0 ? -1 : 0));
}

void TimelineWidget::mousePressEvent(QMouseEvent* e) {
  if (e->button() != Qt::LeftButton) return;
  if (e->position().x() < kLabelWidth) {
    if (e->position().y() < kAxisHeight) return;
    const int row = scroll_->value() + static_cast<int>((e->position().y() - kAxisHeight) / kLaneHeight);
    if (row >= 0 && row < static_cast<int>(rows_.size()) && stalled_.count(rows_[static_cast<std::size_t>(row)].rank) &&
        !rows_[static_cast<std::size_t>(row)].node) {
      Q_EMIT stacksRequested();
    }
    return;
  }
  dragFrom_ = e->position().toPoint();
}

void TimelineWidget::mouseMoveEvent(QMouseEvent* e) {
  if (!dragFrom_) return;
  const QPoint now = e->position().toPoint();
  pan(now.x() - dragFrom_->x());
  dragFrom_ = now;
}

void TimelineWidget::mouseReleaseEvent(QMouseEvent*) { dragFrom_.reset(); }

void TimelineWidget::keyPressEvent(QKeyEvent* e) {
  const double middle = lanesRect().center().x();
  switch (e->key()) {
    case Qt::Key_W: return zoom(0.8, middle);
    case Qt::Key_S: return zoom(1.25, middle);
    case Qt::Key_A: return pan(lanesRect().width() / 10);
    case Qt::Key_D: return pan(-lanesRect().width() / 10);
    case Qt::Key_F: return setFollow(true);
    default: QWidget::keyPressEvent(e);
  }
}

void TimelineWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  const QPalette& pal = palette();
  p.fillRect(rect(), pal.color(QPalette::Base));
  const QRectF area = lanesRect();
  paintAxis(p, area);
  if (rows_.empty()) {
    p.setPen(pal.color(QPalette::PlaceholderText));
    p.drawText(area, Qt::AlignCenter | Qt::TextWordWrap, why_.isEmpty() ? tr("No steps yet") : why_);
    return;
  }
  const int first = scroll_->value();
  for (int i = first; i < std::min<int>(static_cast<int>(rows_.size()), first + visibleRows()); ++i) {
    paintRow(p, rows_[static_cast<std::size_t>(i)], QRectF(0, area.top() + (i - first) * kLaneHeight, area.right(), kLaneHeight));
  }
  paintFooter(p);
}

void TimelineWidget::paintAxis(QPainter& p, const QRectF& area) {
  const double spanS = static_cast<double>(viewSpanUs_) / 1e6;
  const double step = present::tickStep(spanS, std::max(2, static_cast<int>(area.width() / 90)));
  const double fromS = static_cast<double>(viewEndUs_ - viewSpanUs_ - originUs_) / 1e6;
  p.setPen(palette().color(QPalette::PlaceholderText));
  // Bounded: a step too small to move t (a view far from the origin) must not loop forever.
  int ticks = 0;
  for (double t = std::ceil(fromS / step) * step; t <= fromS + spanS && ticks < 100; t += step, ++ticks) {
    const double x = xOf(originUs_ + static_cast<std::int64_t>(t * 1e6));
    p.drawLine(QPointF(x, kAxisHeight - 4), QPointF(x, area.bottom()));
    p.drawText(QRectF(x + 2, 0, 88, kAxisHeight - 2), Qt::AlignLeft | Qt::AlignBottom,
               QString::number(t, 'f', present::tickDecimals(step)) + " s");
  }
  p.setPen(palette().color(QPalette::WindowText));
  p.drawText(QRectF(0, 0, kLabelWidth - 6, kAxisHeight - 2), Qt::AlignRight | Qt::AlignBottom,
             follow_ ? tr("following") : tr("paused (F follows)"));
}

void TimelineWidget::paintRow(QPainter& p, const Row& row, const QRectF& rect) {
  const QPalette& pal = palette();
  QFont f = font();
  f.setBold(row.node);
  p.setFont(f);
  const bool stalled = !row.node && stalled_.count(row.rank) > 0;
  if (!row.node && marked_ == row.rank) p.fillRect(QRectF(0, rect.top(), kLabelWidth, rect.height()), pal.color(QPalette::Highlight).lighter(170));
  p.setPen(stalled ? QColor("#c0392b") : pal.color(QPalette::WindowText));
  p.drawText(QRectF(row.node ? 4 : 16, rect.top(), kLabelWidth - 20, rect.height()), Qt::AlignLeft | Qt::AlignVCenter,
             stalled ? row.label + tr(" — stalled ▸") : row.label);
  p.setFont(font());
  if (row.node) {
    p.fillRect(QRectF(kLabelWidth, rect.top() + rect.height() - 1, rect.width() - kLabelWidth, 1), pal.color(QPalette::Mid));
    return;
  }
  const QRectF area = lanesRect();
  // At most one box per pixel column: a box narrower than a pixel where one was drawn is skipped.
  double drawnTo = -1;
  for (const auto& step : row.steps) {
    for (const auto& box : kpi::boxesOf(step, row.offsetUs)) {
      const double x0 = std::max(area.left(), xOf(box.startUs)), x1 = std::min(area.right(), xOf(box.startUs + box.durationUs));
      if (x1 < area.left() || x0 > area.right() || (x1 - x0 < 1 && std::floor(x0) <= drawnTo)) continue;
      p.fillRect(QRectF(x0, rect.top() + 2, std::max(1.0, x1 - x0), rect.height() - 4), colorOf(box.phase));
      drawnTo = std::floor(std::max(x0 + 1, x1));
    }
  }
  paintPhases(p, row, rect);
  paintCollectives(p, row, rect);
  if (stalled && row.lastEndUs > 0) {
    const double x = xOf(row.lastEndUs);
    if (x >= area.left() && x <= area.right()) p.fillRect(QRectF(x, rect.top(), 3, rect.height()), QColor("#c0392b"));
  }
}

// The phases the program named, after (over) the steps' boxes, with their names where they fit.
void TimelineWidget::paintPhases(QPainter& p, const Row& row, const QRectF& rect) {
  const QRectF area = lanesRect();
  const QFontMetrics metrics(font());
  for (const auto& phase : row.phases) {
    const kpi::Box box = kpi::boxOf(phase, row.offsetUs);
    const double x0 = std::max(area.left(), xOf(box.startUs)), x1 = std::min(area.right(), xOf(box.startUs + box.durationUs));
    if (x1 < area.left() || x0 > area.right()) continue;
    const QRectF shape(x0, rect.top() + 1, std::max(1.0, x1 - x0), rect.height() - 2);
    p.fillRect(shape, colorOf(box.phase));
    if (shape.width() < 24) continue;
    p.setPen(Qt::white);
    p.drawText(shape.adjusted(3, 0, -3, 0), Qt::AlignLeft | Qt::AlignVCenter,
               metrics.elidedText(QString::fromStdString(phase.name), Qt::ElideRight, static_cast<int>(shape.width() - 6)));
  }
}

// The collectives the lane's steps ran, over its boxes (kpi/timeline.h): a strip along the lane's
// top where one ran (those a pixel holds several of merged: runs at least a pixel apart), and where
// the rank waited on one, a bar up from the lane's bottom as tall as the share of the pixel's time
// it waited (the lane's height where it waited all of it). A wide one is outlined and labelled.
void TimelineWidget::paintCollectives(QPainter& p, const Row& row, const QRectF& rect) {
  const QRectF area = lanesRect();
  const auto columns = static_cast<std::size_t>(std::max(1.0, area.width()));
  const std::int64_t from = viewEndUs_ - viewSpanUs_, usPerPixel = viewSpanUs_ / static_cast<std::int64_t>(columns) + 1;
  std::vector<kpi::CollectiveBox> shown;
  std::vector<kpi::Box> ran, waited;
  for (const auto& step : row.steps) {
    for (const auto& c : kpi::collectiveBoxesOf(step, row.offsetUs)) {
      if (c.box.startUs + c.box.durationUs < from || c.box.startUs > viewEndUs_) continue;
      shown.push_back(c);
      ran.push_back(c.box);
      if (c.exposedUs > 0) waited.push_back(c.exposed());
    }
  }
  if (shown.empty()) return;
  const QColor color = colorOf(kpi::Phase::kCollective);
  const auto span = [&](const kpi::Box& b) {
    const double x0 = std::max(area.left(), xOf(b.startUs));
    return std::pair{x0, std::max(1.0, std::min(area.right(), xOf(b.startUs + b.durationUs)) - x0)};
  };
  for (const auto& run : kpi::mergedBoxes(std::move(ran), usPerPixel)) {
    const auto [x, w] = span(run);
    p.fillRect(QRectF(x, rect.top() + 1, w, 2), color);
  }
  const double tall = rect.height() - 2;
  const auto heights = kpi::coverage(waited, from, viewEndUs_, columns);
  for (std::size_t c = 0; c < columns;) {  // a rectangle for each run of columns of one height
    const double h = std::ceil(heights[c] * tall);
    std::size_t end = c + 1;
    while (end < columns && std::ceil(heights[end] * tall) == h) ++end;
    if (h > 0) p.fillRect(QRectF(area.left() + static_cast<double>(c), rect.bottom() - 1 - h, static_cast<double>(end - c), h), color);
    c = end;
  }
  const QFontMetrics metrics(font());
  std::stable_sort(shown.begin(), shown.end(), [](const auto& a, const auto& b) { return a.box.startUs < b.box.startUs; });
  const auto labelEnds = kpi::labelEnds(shown);
  for (std::size_t i = 0; i < shown.size(); ++i) {
    const auto& c = shown[i];
    const auto [x, w] = span(c.box);
    if (w < 6) continue;
    p.setPen(color);
    p.drawRect(QRectF(x + 0.5, rect.top() + 1.5, w - 1, rect.height() - 3));
    const double room = std::min(area.right(), xOf(labelEnds[i])) - x - 8;
    if (room < 22) continue;
    // Its bytes where they fit, else its kind alone.
    QString label = QString::fromStdString(present::collectiveLabel(c.kind, c.bytes));
    if (metrics.horizontalAdvance(label) > room) label = QString::fromUtf8(titleOf(c.kind).data(), static_cast<int>(titleOf(c.kind).size()));
    p.setPen(Qt::white);
    p.drawText(QRectF(x + 4, rect.top(), room, rect.height()), Qt::AlignLeft | Qt::AlignVCenter,
               metrics.elidedText(label, Qt::ElideRight, static_cast<int>(room)));
  }
}

// The legend's swatch of a phase: a collective's as it is drawn (a strip along its top, where it
// was waited on filled).
void TimelineWidget::paintSwatch(QPainter& p, const QRectF& r, kpi::Phase phase) {
  if (phase != kpi::Phase::kCollective) return p.fillRect(r, colorOf(phase));
  p.setPen(colorOf(phase));
  p.drawRect(r.adjusted(0.5, 0.5, -0.5, -0.5));
  p.fillRect(QRectF(r.left() + r.width() / 2, r.top(), r.width() / 2, r.height()), colorOf(phase));
}

void TimelineWidget::paintFooter(QPainter& p) {
  const QRectF line(4, height() - kFooterHeight, width() - 8, kFooterHeight);
  double x = line.left();
  for (const auto phase : kpi::kEveryPhase) {
    paintSwatch(p, QRectF(x, line.top() + 5, 10, 8), phase);
    const QString name = QString::fromUtf8(present::phaseLegend(phase).data(), static_cast<int>(present::phaseLegend(phase).size()));
    p.setPen(palette().color(QPalette::WindowText));
    const int wide = QFontMetrics(font()).horizontalAdvance(name);
    p.drawText(QRectF(x + 13, line.top(), wide + 2, line.height()), Qt::AlignLeft | Qt::AlignVCenter, name);
    x += 20 + wide;
  }
  QStringList clocks;
  for (const auto& [node, c] : clocks_) {
    clocks << tr("%1 %2 ms ± %3 ms").arg(QString::fromStdString(node)).arg(c.offsetUs / 1e3, 0, 'f', 3).arg(c.uncertaintyUs / 1e3, 0, 'f', 3);
  }
  p.setPen(palette().color(QPalette::PlaceholderText));
  p.drawText(QRectF(x + 10, line.top(), line.right() - x - 10, line.height()), Qt::AlignRight | Qt::AlignVCenter,
             QFontMetrics(font()).elidedText(clocks.isEmpty() ? tr("clocks: as each node stamped them (not measured)")
                                                              : tr("clocks against this machine: ") + clocks.join(", "),
                                             Qt::ElideLeft, static_cast<int>(line.right() - x - 10)));
}

QString TimelineWidget::tooltipAt(QPoint pos) const {
  const QRectF area = lanesRect();
  if (!area.contains(pos)) return {};
  const int index = scroll_->value() + static_cast<int>((pos.y() - area.top()) / kLaneHeight);
  if (index < 0 || index >= static_cast<int>(rows_.size()) || rows_[static_cast<std::size_t>(index)].node) return {};
  const Row& row = rows_[static_cast<std::size_t>(index)];
  const std::int64_t at = usAt(pos.x()), slack = viewSpanUs_ / static_cast<std::int64_t>(std::max(1.0, area.width()));
  // The phases first: they are drawn over the steps. A collective under the pointer comes after
  // its step's figures.
  const QString collective = collectiveTip(row, at, slack);
  const auto withCollective = [&](const QString& text) { return collective.isEmpty() ? text : text + QLatin1Char('\n') + collective; };
  for (auto it = row.phases.rbegin(); it != row.phases.rend(); ++it) {
    const kpi::Box box = kpi::boxOf(*it, row.offsetUs);
    if (at < box.startUs - slack || at > box.startUs + box.durationUs + slack) continue;
    // One arg() for all: a name with "%1" in it stays as it is.
    QString text = tr("%1 · %2 %3 ms, after step %4")
                       .arg(row.label, QString::fromStdString(it->name), ms(box.durationUs), QString::number(it->step));
    if (it->attempt > 0) text += tr("\nattempt %1").arg(it->attempt);
    return withCollective(text);
  }
  for (const auto& step : row.steps) {
    for (const auto& box : kpi::boxesOf(step, row.offsetUs)) {
      if (at < box.startUs - slack || at > box.startUs + box.durationUs + slack) continue;
      QString text = tr("%1 · step %2 · %3 %4 ms of %5 ms")
                         .arg(row.label)
                         .arg(step.step)
                         .arg(QString::fromUtf8(kpi::phaseName(box.phase).data()))
                         .arg(ms(box.durationUs))
                         .arg(ms(step.stepUs));
      if (step.dataUs) {
        text += tr("\ndata %1 ms, compute %2 ms, communication %3 ms").arg(ms(*step.dataUs)).arg(ms(*step.computeUs)).arg(ms(*step.commUs));
        if (step.optimizerUs) text += tr(" (the optimizer %1 ms of the compute)").arg(ms(*step.optimizerUs));
      }
      if (step.attempt > 0) text += tr("\nattempt %1").arg(step.attempt);
      return withCollective(text);
    }
  }
  return collective;
}

// The collective under the pointer, and how many more a pixel there holds (zoomed out).
QString TimelineWidget::collectiveTip(const Row& row, std::int64_t at, std::int64_t slack) const {
  std::optional<kpi::CollectiveBox> first;
  std::uint64_t step = 0;
  int more = 0;
  for (const auto& s : row.steps) {
    for (const auto& c : kpi::collectiveBoxesOf(s, row.offsetUs)) {
      if (at < c.box.startUs - slack || at > c.box.startUs + c.box.durationUs + slack) continue;
      if (first) {
        ++more;
        continue;
      }
      first = c;
      step = s.step;
    }
  }
  if (!first) return {};
  QString text = tr("%1 · step %2 · %3 %4 ms, %5 ms of it exposed")
                     .arg(row.label)
                     .arg(step)
                     .arg(QString::fromStdString(present::collectiveLabel(first->kind, first->bytes)))
                     .arg(ms(first->box.durationUs))
                     .arg(ms(first->exposedUs));
  if (more > 0) text += tr("\n%n more collective(s) here: zoom in (Ctrl+wheel) to tell them apart", nullptr, more);
  return text;
}

bool TimelineWidget::event(QEvent* e) {
  if (e->type() != QEvent::ToolTip) return QWidget::event(e);
  auto* help = static_cast<QHelpEvent*>(e);
  const QString text = tooltipAt(help->pos());
  if (text.isEmpty()) {
    QToolTip::hideText();
  } else {
    QToolTip::showText(help->globalPos(), text, this);
  }
  return true;
}

}  // namespace lockstep::app
