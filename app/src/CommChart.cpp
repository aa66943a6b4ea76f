#include "CommChart.h"

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QCursor>
#include <QLegend>
#include <QStackedBarSeries>
#include <QToolTip>
#include <QValueAxis>
#include <algorithm>
#include <cmath>
#include <iterator>

#include "Present.h"
#include "lockstep/protocol/names.h"

namespace lockstep::app {
namespace {

// Each kind's colour in the bars, by its number (lockstep.proto): Tableau 10, all-reduce taking the
// red that exposed communication has elsewhere. What no kind accounts for is grey.
constexpr const char* kKindColors[] = {"#e15759", "#f28e2b", "#4e79a7", "#59a14f", "#b07aa1",
                                       "#9c755f", "#edc948", "#76b7b2", "#ff9da7", "#bab0ac",
                                       "#8cd17d", "#499894"};
static_assert(static_cast<std::size_t>(CollectiveKind::kPull) == std::size(kKindColors));

QColor colorOf(const std::optional<CollectiveKind>& kind) {
  const std::size_t i = kind ? static_cast<std::size_t>(*kind) - 1 : std::size(kKindColors);
  return QColor(QString::fromLatin1(i < std::size(kKindColors) ? kKindColors[i] : "#a0a0a0"));
}

}  // namespace

CommChart::CommChart(QChart* chart, QObject* parent)
    : QObject(parent), chart_(chart), series_(new QStackedBarSeries), x_(new QBarCategoryAxis), y_(new QValueAxis) {
  chart_->addSeries(series_);
  y_->setRange(0, 100);
  chart_->addAxis(x_, Qt::AlignBottom);
  chart_->addAxis(y_, Qt::AlignLeft);
  series_->attachAxis(x_);
  series_->attachAxis(y_);
  chart_->legend()->setAlignment(Qt::AlignBottom);
  setParts({Part{}});
}

QString CommChart::partName(const Part& part) const {
  if (part) return qtext(std::string(titleOf(*part)));
  return parts_.size() > 1 ? tr("other") : tr("communication");
}

QStringList CommChart::partNames() const {
  QStringList out;
  for (const auto& part : parts_) out << partName(part);
  return out;
}

// The kinds the job's ranks waited on, in kCollectiveKindNames' order, then "other"; or only
// "communication" when they reported none.
std::vector<CommChart::Part> CommChart::partsOf(const kpi::JobKpis& k) const {
  std::vector<Part> parts;
  for (const auto& c : k.collectives) {
    if (c.exposedShare) parts.push_back(c.kind);
  }
  parts.push_back(Part{});
  return parts;
}

CommChart::Bar CommChart::barOf(const kpi::RankKpis& r, const std::vector<Part>& parts) const {
  Bar bar{r.rank, r.commOverhead ? *r.commOverhead * 100 : 0, std::vector<double>(parts.size(), 0.0)};
  double kinds = 0;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    const auto it =
        std::find_if(r.collectives.begin(), r.collectives.end(), [&](const auto& c) { return c.kind == *parts[i]; });
    if (it != r.collectives.end() && it->exposedShare) bar.pcts[i] = *it->exposedShare * 100;
    kinds += bar.pcts[i];
  }
  // Collectives timed on their own can add up to a little more than the step's exposed time.
  bar.pcts.back() = std::max(0.0, bar.totalPct - kinds);
  bar.totalPct = std::max(bar.totalPct, kinds);
  return bar;
}

void CommChart::setParts(std::vector<Part> parts) {
  if (parts == parts_) return;
  series_->clear();  // deletes the old sets
  sets_.clear();
  parts_ = std::move(parts);
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    auto* set = new QBarSet(partName(parts_[i]));
    connect(set, &QBarSet::hovered, this, [this](bool inside, int index) {
      if (!inside) return QToolTip::hideText();
      QToolTip::showText(QCursor::pos(), toolTipOf(index));
    });
    sets_.push_back(set);
    series_->append(set);
  }
  chart_->legend()->setVisible(parts_.size() > 1);
  recolor();
}

void CommChart::recolor() {
  for (std::size_t i = 0; i < sets_.size(); ++i) {
    const QColor color = colorOf(parts_[i]);
    if (sets_[i]->color() != color) sets_[i]->setColor(color);
    if (sets_[i]->borderColor() != color) sets_[i]->setBorderColor(color);
  }
}

void CommChart::refresh(const kpi::JobKpis& k) {
  std::vector<Part> parts = partsOf(k);
  std::vector<Bar> bars;
  for (const auto& r : k.ranks) bars.push_back(barOf(r, parts));
  // "other" only where the kinds leave some of a rank's wait unaccounted for.
  const bool other = std::any_of(bars.begin(), bars.end(), [](const Bar& b) { return b.pcts.back() >= 0.05; });
  if (parts.size() > 1 && !other) {
    parts.pop_back();
    for (auto& bar : bars) bar.pcts.pop_back();
  }
  setParts(std::move(parts));
  const bool many = bars.size() > static_cast<std::size_t>(kMaxBars);
  if (many) {
    std::partial_sort(bars.begin(), bars.begin() + kMaxBars, bars.end(), [](const Bar& a, const Bar& b) {
      return a.totalPct > b.totalPct || (a.totalPct == b.totalPct && a.rank < b.rank);
    });
    bars.resize(kMaxBars);
  }
  // The categories are the ranks in rank order, or places 1..N among the highest: they change
  // only when the job does, since every change lays the axis out again.
  QStringList categories;
  ranks_.clear();
  for (const auto& bar : bars) {
    categories << QString::number(many ? static_cast<int>(ranks_.size()) + 1 : static_cast<int>(bar.rank));
    ranks_.push_back(bar.rank);
  }
  setCategories(categories);
  // A fanned-in job's frame has the rows of the ranks in view and of the slowest, not every rank's.
  const bool partial = k.ranks.size() < k.worldSize;
  const QString title = many && partial ? tr("Exposed comm. (%): the %1 highest of %2 ranks in view (of %3)")
                                              .arg(kMaxBars)
                                              .arg(k.ranks.size())
                                              .arg(k.worldSize)
                        : many    ? tr("Exposed comm. (%): the %1 highest of %2 ranks").arg(kMaxBars).arg(k.ranks.size())
                        : partial ? tr("Exposed comm. per rank (%), %1 of %2 ranks").arg(categories.size()).arg(k.worldSize)
                        : categories.size() > 16
                            ? tr("Exposed comm. per rank (%), ranks 0–%1").arg(categories.size() - 1)
                            : tr("Exposed communication per rank (% of step)");
  if (chart_->title() != title) chart_->setTitle(title);
  fitHeight(bars);
  bars_ = std::move(bars);
  // One change for each whole set: replacing bar by bar lays the chart out once per bar.
  for (std::size_t i = 0; i < sets_.size(); ++i) {
    QList<qreal> values;
    for (const auto& bar : bars_) values << bar.pcts[i];
    bool same = sets_[i]->count() == values.size();
    for (int j = 0; same && j < values.size(); ++j) same = sets_[i]->at(j) == values[j];
    if (same) continue;
    sets_[i]->remove(0, sets_[i]->count());
    sets_[i]->append(values);
  }
}

// Up to the highest bar, in round steps (most ranks wait a few percent: on 0-100 their parts
// would be a pixel tall); set only when it changed, as every change lays the axis out again.
void CommChart::fitHeight(const std::vector<Bar>& bars) {
  double highest = 1;
  for (const auto& bar : bars) highest = std::max(highest, bar.totalPct);
  const double step = present::tickStep(std::min(100.0, highest), 5);
  const double top = std::min(100.0, std::ceil(highest / step) * step);
  const QString format = QStringLiteral("%.%1f").arg(present::tickDecimals(step));
  if (y_->max() == top && y_->labelFormat() == format) return;
  y_->setTickType(QValueAxis::TicksDynamic);
  y_->setTickAnchor(0);
  y_->setTickInterval(step);
  y_->setLabelFormat(format);
  y_->setRange(0, top);
}

void CommChart::setCategories(const QStringList& categories) {
  if (x_->categories() == categories) return;
  x_->clear();
  x_->append(categories);
  // Past 16 bars the numbers under them overlap: hide them, hovering a bar names it.
  const bool crowded = categories.size() > 16;
  x_->setLabelsVisible(!crowded);
  x_->setGridLineVisible(!crowded);
}

QString CommChart::toolTipOf(int index) const {
  if (index < 0 || index >= static_cast<int>(bars_.size())) return {};
  const Bar& bar = bars_[static_cast<std::size_t>(index)];
  QString text =
      tr("rank %1: %2% of its step time waiting on communication").arg(bar.rank).arg(bar.totalPct, 0, 'f', 1);
  if (parts_.size() == 1) return text;
  for (std::size_t i = 0; i < parts_.size(); ++i) {
    if (bar.pcts[i] > 0) text += QStringLiteral("\n%1 %2%").arg(partName(parts_[i])).arg(bar.pcts[i], 0, 'f', 1);
  }
  return text;
}

}  // namespace lockstep::app
