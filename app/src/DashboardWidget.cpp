#include "DashboardWidget.h"

#include <QAreaSeries>
#include <QCheckBox>
#include <QTabWidget>
#include <QChart>
#include <QChartView>
#include <QCursor>
#include <QGridLayout>
#include <QHBoxLayout>
#include <QLineSeries>
#include <QMessageBox>
#include <QToolTip>
#include <QValueAxis>
#include <QVBoxLayout>
#include <algorithm>
#include <chrono>
#include <cmath>

#include "CommChart.h"
#include "HeatmapWidget.h"
#include "TimelineWidget.h"
#include "StacksDialog.h"
#include "Models.h"
#include "Present.h"
#include "lockstep/common/clock.h"
#include "lockstep/protocol/names.h"

namespace lockstep::app {
namespace {

constexpr int kMaxChartPoints = 600;   // what a chart draws; older points are thinned
constexpr int kMaxUtilLines = 16;      // beyond this, the heatmap is the readable view
constexpr double kUtilWindowSeconds = 300;  // the utilization chart's sliding window


// Keeps at most `max` points, evenly thinned, the last one always kept.
template <class Container, class Make>
QList<QPointF> thinned(const Container& points, Make make) {
  QList<QPointF> out;
  const std::size_t n = points.size();
  const std::size_t stride = std::max<std::size_t>(1, (n + kMaxChartPoints - 1) / kMaxChartPoints);
  out.reserve(static_cast<qsizetype>(n / stride + 1));
  for (std::size_t i = 0; i < n; i += stride) out.append(make(points[i]));
  if (n > 0 && (n - 1) % stride != 0) out.append(make(points[n - 1]));
  return out;
}

// A round tick interval (1, 2 or 5 times a power of ten) giving about five intervals over `span`.
// Fits an axis to the data, with ticks at round values. A sliding window (`margin` false) fits exactly.
// A chart's title, set only when it changed (a title change lays the chart out again).
void retitle(QChart* chart, const QString& title) {
  if (chart->title() != title) chart->setTitle(title);
}

// The range out to whole ticks, set only when it changed: every change lays the chart's axes and
// their labels out again, which at ten refreshes a second was most of the dashboard's cost.
void fitAxis(QValueAxis* axis, double lo, double hi, bool fromZero, bool margin = true) {
  if (fromZero) lo = 0;
  if (!(hi > lo)) hi = lo + 1;
  if (margin) hi += (hi - lo) * 0.05;
  const double interval = present::tickStep(hi - lo, 5);
  lo = std::floor(lo / interval) * interval;
  hi = std::ceil(hi / interval) * interval;
  const QString format = QStringLiteral("%.%1f").arg(present::tickDecimals(interval));
  if (axis->tickType() == QValueAxis::TicksDynamic && axis->tickInterval() == interval && axis->labelFormat() == format &&
      axis->min() == lo && axis->max() == hi) {
    return;
  }
  axis->setTickType(QValueAxis::TicksDynamic);
  axis->setTickAnchor(0);
  axis->setTickInterval(interval);
  axis->setLabelFormat(format);
  axis->setRange(lo, hi);
}

// A kind of collective as the Communication tile's tooltip lists it: "all-gather: 24 a step,
// 8.0 MiB a step, 31.0% of step time (2.1% exposed), bus 120.0 GB/s".
QString collectiveLine(const kpi::CollectiveKpis& c) {
  return DashboardWidget::tr("%1: %2 a step, %3 a step, %4 of step time (%5 exposed), bus %6")
      .arg(qtext(std::string(titleOf(c.kind))), QString::number(c.perStep, 'g', 3), qtext(present::bytes(c.bytesPerStep.value_or(NAN))),
           percent(c.timeShare), percent(c.exposedShare), qtext(present::bandwidth(c.busBandwidth)));
}

// Why communication is slow (report/diagnosis.h), each kind of collective, then each of the job's
// nodes' busiest interface against its link.
QString communicationToolTip(const std::string& advice, const std::vector<std::pair<std::string, kpi::NetRate>>& network,
                             const std::vector<kpi::CollectiveKpis>& collectives) {
  QStringList lines;
  if (!advice.empty()) lines << qtext(advice);
  if (!collectives.empty()) lines << DashboardWidget::tr("Collectives, the mean of the ranks:");
  for (const auto& c : collectives) lines << collectiveLine(c);
  if (!network.empty()) lines << DashboardWidget::tr("Network of the job's nodes:");
  for (const auto& [node, rate] : network) lines << QStringLiteral("%1: %2").arg(qtext(node), networkText(rate));
  return lines.join(QLatin1Char('\n'));
}

}  // namespace

KpiTile::KpiTile(const QString& title, QWidget* parent) : QFrame(parent) {
  setFrameShape(QFrame::StyledPanel);
  setObjectName(title);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(10, 6, 10, 6);
  layout->setSpacing(1);
  auto* caption = new QLabel(title, this);
  QFont small = caption->font();
  small.setPointSizeF(small.pointSizeF() * 0.9);
  caption->setFont(small);
  caption->setForegroundRole(QPalette::PlaceholderText);
  value_ = new QLabel(dash(), this);
  QFont big = value_->font();
  big.setPointSizeF(big.pointSizeF() * 1.6);
  big.setBold(true);
  value_->setFont(big);
  detail_ = new QLabel(this);
  detail_->setWordWrap(true);  // a long detail takes a second line, not the next tile
  detail_->setFont(small);
  detail_->setForegroundRole(QPalette::PlaceholderText);
  layout->addWidget(caption);
  layout->addWidget(value_);
  layout->addWidget(detail_);
}

void KpiTile::set(const QString& value, const QString& detail) {
  value_->setText(value);
  detail_->setText(detail);
}

DashboardWidget::DashboardWidget(ClusterStore& store, QWidget* parent) : QWidget(parent), store_(store) {
  auto* outer = new QVBoxLayout(this);
  empty_ = new QLabel(tr("Select a job, or start one with Job ▸ New Job (Ctrl+N)."), this);
  empty_->setAlignment(Qt::AlignCenter);
  empty_->setForegroundRole(QPalette::PlaceholderText);
  outer->addWidget(empty_);
  body_ = new QWidget(this);
  outer->addWidget(body_);
  auto* layout = new QVBoxLayout(body_);
  layout->setContentsMargins(0, 0, 0, 0);

  auto* header = new QHBoxLayout;
  title_ = new QLabel(body_);
  QFont titleFont = title_->font();
  titleFont.setPointSizeF(titleFont.pointSizeF() * 1.3);
  titleFont.setBold(true);
  title_->setFont(titleFont);
  title_->setObjectName(QStringLiteral("jobTitle"));
  // Shrinks (and is cut) rather than widening the window when even the short form does not fit.
  title_->setMinimumWidth(1);
  state_ = new QLabel(body_);
  state_->setObjectName(QStringLiteral("jobState"));
  QFont stateFont = state_->font();
  stateFont.setBold(true);
  state_->setFont(stateFont);
  stop_ = new QPushButton(tr("Stop Job…"), body_);
  stop_->setObjectName(QStringLiteral("stopJob"));
  connect(stop_, &QPushButton::clicked, this, &DashboardWidget::stopJob);
  stacks_ = new QPushButton(tr("Stacks…"), body_);
  stacks_->setObjectName(QStringLiteral("showStacks"));
  stacks_->setToolTip(tr("What each rank is doing now: its state, threads, Python stacks or native backtrace, log"));
  connect(stacks_, &QPushButton::clicked, this, &DashboardWidget::showStacks);
  header->addWidget(title_);
  header->addSpacing(12);
  header->addWidget(state_);
  header->addStretch(1);
  header->addWidget(stacks_);
  header->addWidget(stop_);
  layout->addLayout(header);
  banner_ = new QLabel(body_);
  banner_->setObjectName(QStringLiteral("jobBanner"));
  banner_->setWordWrap(true);
  banner_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  layout->addWidget(banner_);

  auto* tiles = new QGridLayout;
  const QStringList names = {tr("Throughput"), tr("Scaling efficiency"), tr("GPU utilization"), tr("MFU"),
                             tr("Communication"), tr("Slowest rank"), tr("Loss"), tr("ETA"), tr("Cost"), tr("Energy")};
  for (int i = 0; i < names.size(); ++i) {
    auto* tile = new KpiTile(names[i], body_);
    tiles_.insert(names[i], tile);
    tiles->addWidget(tile, i / 5, i % 5);
  }
  layout->addLayout(tiles);
  buildCharts();
  views_ = new QTabWidget(body_);
  views_->setObjectName(QStringLiteral("dashboardViews"));
  auto* chartsPage = new QWidget(views_);
  auto* charts = new QGridLayout(chartsPage);
  charts->setContentsMargins(0, 0, 0, 0);
  charts->addWidget(makeView(utilChart_), 0, 0);
  charts->addWidget(heatmap_, 0, 1);
  charts->addWidget(makeView(throughputChart_), 0, 2);
  charts->addWidget(makeView(splitChart_), 1, 0);
  charts->addWidget(makeView(lossChart_), 1, 1);
  charts->addWidget(makeView(commChart_), 1, 2);
  views_->addTab(chartsPage, tr("Charts"));
  views_->addTab(buildTimelinePage(), tr("Timeline"));
  connect(views_, &QTabWidget::currentChanged, this, [this] { refresh(); });
  layout->addWidget(views_, 1);
  body_->hide();
  applyTheme();
}

// Only while its tab is shown: the timeline reads the lanes in view under the job's lock.
void DashboardWidget::refreshTimeline(const JobEntry& job, const std::optional<Stall>& stall) {
  if (views_->currentWidget() != timeline_->parentWidget()) return;
  timeline_->setStalledRanks(stall ? std::set<std::uint32_t>(stall->ranks.begin(), stall->ranks.end()) : std::set<std::uint32_t>{});
  if (timelineOf_ == job.live) return timeline_->refresh();
  timelineOf_ = job.live;
  // A fanned-in job's steps stay on its nodes: only its KPIs come to this app (FanIn.h).
  if (job.live->fannedIn()) {
    return timeline_->setSource({}, tr("On more than %1 nodes, this job is watched through its supervising agent, and "
                                       "its steps stay on its nodes.\nTo see them here, start lockstep with --fan-in-nodes %2")
                                        .arg(store_.fanIn().nodesOver)
                                        .arg(job.nodes.size()));
  }
  timeline_->setSource([live = job.live](const std::function<void(const kpi::Timeline&)>& f) { live->readTimeline(f); });
}

QWidget* DashboardWidget::buildTimelinePage() {
  auto* page = new QWidget(body_);
  auto* column = new QVBoxLayout(page);
  column->setContentsMargins(0, 0, 0, 0);
  auto* bar = new QHBoxLayout;
  auto* follow = new QCheckBox(tr("Follow the newest steps"), page);
  follow->setObjectName(QStringLiteral("timelineFollow"));
  follow->setChecked(true);
  auto* hint = new QLabel(tr("Ctrl+wheel or W/S zooms, drag or A/D pans; hover a box for its figures"), page);
  hint->setForegroundRole(QPalette::PlaceholderText);
  toSlowest_ = new QPushButton(tr("Go to the slowest rank"), page);
  toSlowest_->setObjectName(QStringLiteral("timelineSlowest"));
  toSlowest_->setEnabled(false);
  bar->addWidget(follow);
  bar->addWidget(toSlowest_);
  bar->addSpacing(12);
  bar->addWidget(hint, 1);
  column->addLayout(bar);
  timeline_ = new TimelineWidget(page);
  timeline_->setObjectName(QStringLiteral("timeline"));
  column->addWidget(timeline_, 1);
  connect(follow, &QCheckBox::toggled, timeline_, &TimelineWidget::setFollow);
  connect(timeline_, &TimelineWidget::followChanged, follow, &QCheckBox::setChecked);
  connect(timeline_, &TimelineWidget::stacksRequested, this, &DashboardWidget::showStacks);
  connect(toSlowest_, &QPushButton::clicked, this, [this] {
    if (slowestRank_) timeline_->showRank(*slowestRank_);
  });
  return page;
}

QChartView* DashboardWidget::makeView(QChart* chart) {
  auto* view = new QChartView(chart, body_);
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumSize(260, 180);
  return view;
}

void DashboardWidget::buildCharts() {
  auto makeChart = [](const QString& title) {
    auto* chart = new QChart;
    chart->setTitle(title);
    chart->legend()->hide();
    chart->setMargins(QMargins(4, 4, 4, 4));
    chart->setBackgroundRoundness(0);
    return chart;
  };
  auto attach = [](QChart* chart, QAbstractSeries* series, QValueAxis* x, QValueAxis* y) {
    chart->addSeries(series);
    series->attachAxis(x);
    series->attachAxis(y);
  };
  auto axes = [](QChart* chart, const QString& xTitle, const QString& yTitle, QValueAxis** x, QValueAxis** y) {
    *x = new QValueAxis;
    (*x)->setTitleText(xTitle);
    (*x)->setLabelFormat(QStringLiteral("%.0f"));
    *y = new QValueAxis;
    (*y)->setTitleText(yTitle);
    (*y)->setLabelFormat(QStringLiteral("%.0f"));
    chart->addAxis(*x, Qt::AlignBottom);
    chart->addAxis(*y, Qt::AlignLeft);
  };

  utilChart_ = makeChart(tr("Utilization over time"));
  axes(utilChart_, tr("s"), tr("%"), &utilX_, &utilY_);
  utilY_->setRange(0, 100);
  heatmap_ = new HeatmapWidget(body_);

  throughputChart_ = makeChart(tr("Throughput (samples/s)"));
  axes(throughputChart_, tr("s"), tr("samples/s"), &throughputX_, &throughputY_);
  throughput_ = new QLineSeries;
  attach(throughputChart_, throughput_, throughputX_, throughputY_);

  splitChart_ = makeChart(tr("Step time split (ms)"));
  axes(splitChart_, tr("step"), tr("ms"), &splitX_, &splitY_);
  splitZero_ = new QLineSeries;
  splitData_ = new QLineSeries;
  splitCompute_ = new QLineSeries;
  splitExposed_ = new QLineSeries;
  // Stacked: each area spans from the previous boundary to its own cumulative line.
  const QList<QPair<QLineSeries*, QLineSeries*>> bands = {{splitData_, splitZero_}, {splitCompute_, splitData_},
                                                          {splitExposed_, splitCompute_}};
  const QStringList bandNames = {tr("data"), tr("compute"), tr("exposed comm.")};
  for (int i = 0; i < bands.size(); ++i) {
    auto* area = new QAreaSeries(bands[i].first, bands[i].second);
    area->setName(bandNames[i]);
    attach(splitChart_, area, splitX_, splitY_);
  }
  splitChart_->legend()->show();
  splitChart_->legend()->setAlignment(Qt::AlignBottom);

  lossChart_ = makeChart(tr("Loss (all ranks' samples)"));
  axes(lossChart_, tr("step"), tr("loss"), &lossX_, &lossY_);
  loss_ = new QLineSeries;
  attach(lossChart_, loss_, lossX_, lossY_);

  commChart_ = makeChart(tr("Exposed communication per rank (% of step)"));
  comm_ = new CommChart(commChart_, this);
}

void DashboardWidget::applyTheme() {
  // Follow the system palette: dark charts on a dark window.
  const bool dark = palette().color(QPalette::Window).lightness() < 128;
  for (QChart* chart : {utilChart_, throughputChart_, splitChart_, lossChart_, commChart_}) {
    chart->setTheme(dark ? QChart::ChartThemeDark : QChart::ChartThemeLight);
    chart->setBackgroundBrush(palette().brush(QPalette::Base));
    chart->setTitleBrush(palette().brush(QPalette::WindowText));
  }
  comm_->recolor();  // the theme set its own colours
}

void DashboardWidget::changeEvent(QEvent* event) {
  QWidget::changeEvent(event);
  // The system switched light/dark (the application palette), or someone set ours.
  if (event->type() == QEvent::PaletteChange || event->type() == QEvent::ApplicationPaletteChange) applyTheme();
}

void DashboardWidget::showJob(const QString& jobId) {
  jobId_ = jobId;
  recorded_.reset();
  refresh();
}

void DashboardWidget::showRecorded(std::shared_ptr<const JobEntry> job) {
  jobId_ = job ? QString::fromStdString(job->id) : QString();
  recorded_ = std::move(job);
  refresh();
}

void DashboardWidget::showTimeline() {
  views_->setCurrentWidget(timeline_->parentWidget());
  refresh();
}

int DashboardWidget::chartPointCount(const QString& chart) const {
  if (chart == QLatin1String("throughput")) return static_cast<int>(throughput_->count());
  if (chart == QLatin1String("loss")) return static_cast<int>(loss_->count());
  if (chart == QLatin1String("split")) return static_cast<int>(splitCompute_->count());
  if (chart == QLatin1String("comm")) return comm_->barCount();
  if (chart == QLatin1String("heatmap")) return heatmap_->rowCount();
  return -1;
}

// A fanned-in job's figures come from its supervising agent alone: say when they do not.
QString DashboardWidget::frameBanner(const JobEntry& job) const {
  using std::chrono::duration_cast;
  using std::chrono::seconds;
  constexpr auto kLate = seconds(5);
  const auto since = job.live->sinceFrame();
  const bool ended = jobStateEnded(job.state) && !restarting(job.supervision);  // its frames go on through a restart
  if (since && (ended ? job.live->hasLastFrame() : *since < kLate)) return {};
  // Its first agent supervises it, its second once that took over (which then says so).
  const auto& agents = job.spec.agents;
  const QString first = QString::fromStdString(agents.front().node);  // a fanned-in job has agents (FanIn.h)
  const QString second = agents.size() > 1 ? QString::fromStdString(agents[1].node) : QString();
  const QString orSecond = second.isEmpty() ? QString() : tr(", or once that stops for good, its second, %1's").arg(second);
  // Frames come from the first agent, or from the second once it took over (it then follows the
  // job). A standby mirrors the supervision, and the job's end, but sends no frames.
  const AgentEntry* says = job.supervisor.isEmpty() ? nullptr : store_.agent(job.supervisor);
  const bool firstSays = says && says->hello && says->hello->nodeName == first.toStdString();
  const bool tookOver = says && (job.supervision.state == SupervisionState::kFollowing ||
                                 job.supervision.state == SupervisionState::kRestarting);
  if (!firstSays && !tookOver) {
    const AgentEntry* held = store_.agentOfNode(first.toStdString());
    if (!held) {
      return tr("No agent this app is connected to supervises this job, and its figures come from its supervising "
                "agent: add the agent of its first node, %1%2.")
          .arg(first, second.isEmpty() ? QString() : tr(" (or its second's, %1, once that took over)").arg(second));
    }
    if (held->state != AgentState::kConnected) {
      return tr("Its figures come from its supervising agent: %1's, which is %2%3.")
          .arg(first, agentStateText(held->state), orSecond);
    }
  }
  const QString from = job.supervisor.isEmpty() ? first : job.supervisor;
  if (ended) {
    return tr("No last figures from %1 yet: it reads the job's streams to their end first. If none come, "
              "lockstepctl watch %2 reads them from its nodes' streams while they hold them.")
        .arg(from, QString::fromStdString(job.id));
  }
  if (!since) return tr("Waiting for the job's figures from %1, which reads its nodes' streams first.").arg(from);
  return tr("No figures from %1 for %2: those shown are as of then.")
      .arg(from, duration(static_cast<double>(duration_cast<seconds>(*since).count())));
}

void DashboardWidget::refresh() {
  const JobEntry* job = recorded_ ? recorded_.get() : jobId_.isEmpty() ? nullptr : store_.job(jobId_.toStdString());
  empty_->setVisible(job == nullptr);
  body_->setVisible(job != nullptr);
  if (!job) return;
  // The KPIs the ingest thread last worked out (a recorded job's: as of the end of its recording).
  const auto published = job->live->published();
  const kpi::JobKpis& k = published->kpis;
  shownUpToUs_ = published->lastReportUnixUs;
  // A recorded job is shown as it was when recording ended, even if that was mid-run.
  const bool running = !recorded_ && !jobStateEnded(job->state);

  setTitle(*job);
  state_->setText(jobStateText(*job));
  QPalette statePalette = state_->palette();
  statePalette.setColor(QPalette::WindowText, jobStateColor(*job, palette()));
  state_->setPalette(statePalette);
  stop_->setEnabled(!recorded_ && !job->over);  // a job to restart, or to be judged, may be stopped
  stop_->setVisible(!recorded_);
  stacks_->setEnabled(running);
  stacks_->setVisible(!recorded_);

  // The end of a job, plainly.
  QString banner;
  const bool seen = published->lastReportUnixUs != 0;
  const QString steps = (k.totalSteps ? tr("%1 of %2 steps").arg(k.step).arg(k.totalSteps) : tr("%1 steps").arg(k.step)) +
                        (k.attempts == 2 ? tr(", 1 restart") : k.attempts > 2 ? tr(", %1 restarts").arg(k.attempts - 1) : QString());
  const QString took = duration(k.elapsedSeconds);
  const auto stall = job->stall();
  // Its parts ended (failed, or stopped unasked), and its supervisor runs it again.
  const auto state = restarting(job->supervision) ? JobState::kStarting : job->state;
  if (restarting(job->supervision)) {
    banner = tr("Restarting: %1")
                 .arg(job->supervision.message.empty() ? job->message : QString::fromStdString(job->supervision.message));
  }
  switch (state) {
    case JobState::kFinished:
      banner = !seen ? (recorded_ ? tr("Finished; no step reports of it were recorded, so it has no KPIs.")
                                  : tr("Finished before this app connected; its step reports are gone, so it has no KPIs here."))
               : k.timeToConvergenceSeconds && job->spec.targetLoss && k.step < k.totalSteps
                   ? tr("Finished: target loss %1 reached at step %2, after %3.").arg(*job->spec.targetLoss).arg(k.step).arg(took)
                   : tr("Finished: %1 in %2.").arg(steps, took);
      break;
    case JobState::kFailed:
      banner = seen ? tr("Failed after %1: %2").arg(steps, job->message) : tr("Failed: %1").arg(job->message);
      break;
    case JobState::kStopped:
      banner = seen ? tr("Stopped after %1 (%2).").arg(steps, took) : tr("Stopped.");
      break;
    default:
      if (stall) {
        banner = tr("Stalled %1: %2\n(lockstepctl stacks %3 shows each rank's stacks; the job's events keep them)")
                     .arg(duration(static_cast<double>(unixMicrosNow() - stall->sinceUnixUs) / 1e6),
                          QString::fromStdString(stall->message), QString::fromStdString(job->id));
      } else if (job->unjudged()) {
        banner = tr("This program reports no steps, so Lockstep cannot tell whether it is stuck (lockstep.step() "
                    "turns stall detection on); lockstepctl stacks %1 shows what its ranks are doing.")
                     .arg(QString::fromStdString(job->id));
      }
      break;
  }
  // A fanned-in job without figures says why: in place of "its step reports are gone" once it
  // finished, after how it failed or stopped.
  if (!recorded_ && job->live->fannedIn()) {
    const QString why = frameBanner(*job);
    const bool replaces = banner.isEmpty() || (job->state == JobState::kFinished && !seen);
    if (!why.isEmpty()) banner = replaces ? why : banner + QLatin1Char('\n') + why;
  }
  banner_->setText(banner);
  banner_->setVisible(!banner.isEmpty());
  QPalette bannerPalette = banner_->palette();
  bannerPalette.setColor(QPalette::WindowText, stall ? jobStateColor(JobState::kFailed, palette()) : jobStateColor(*job, palette()));
  banner_->setPalette(bannerPalette);

  const QString currency = QString::fromStdString(job->spec.prices.currency);
  // A program that reports no steps (or steps without timings) gets the reason instead of the detail.
  const QString noSteps = QString::fromStdString(k.noStepsReason);
  const QString noSplit = noSteps.isEmpty() ? QString::fromStdString(k.noTimingsReason) : noSteps;
  const auto unless = [](const QString& reason, const QString& detail) { return reason.isEmpty() ? detail : reason; };
  // Running: the last 10 s; ended: the mean over the job (present::jobThroughput).
  const QString throughput = figure(present::jobThroughput(k, !running), 0);
  if (running) {
    tiles_[tr("Throughput")]->set(throughput, unless(noSteps, k.tokensPerSecond ? tr("samples/s, last 10 s; %1 tokens/s").arg(figure(k.tokensPerSecond, 0))
                                                                                : tr("samples/s, last 10 s")));
  } else {
    tiles_[tr("Throughput")]->set(throughput, k.noStepsReason.empty() ? tr("samples/s, mean over the job") : QString::fromStdString(k.noStepsReason));
  }
  tiles_[tr("Scaling efficiency")]->set(
      percent(k.scalingEfficiency),
      k.scalingEfficiency ? QString::fromUtf8(std::string(kpi::scalingBasisName(k.scalingBasis)).c_str())
      : job->spec.isCommand() ? unless(noSplit, tr("no 1-rank run of this program in the history to compare with"))
                              : QString());
  tiles_[tr("GPU utilization")]->set(figure(k.gpuUtilizationPct, 0, "%"),
                                     k.gpuUtilizationPct ? tr("mean over the job") : tr("no GPU samples"));
  setMfuTile(k, noSteps);
  const QString commDetail = k.busBandwidth ? tr("exposed, of step time; bus %1").arg(qtext(present::bandwidth(k.busBandwidth)))
                                            : tr("exposed, of step time");
  const auto diagnosis = report::diagnoseCommunication(k, job->spec, store_.linkOf(job->nodes));
  // Under the figure, its split by kind: "all-gather 2.1% · reduce-scatter 0.9%".
  const QString kinds = qtext(present::collectiveSplit(k.collectives));
  tiles_[tr("Communication")]->set(percent(k.commOverhead),
                                   (!k.commOverhead ? unless(noSplit, commDetail)
                                    : diagnosis     ? commDetail + QStringLiteral("; ") + qtext(std::string(report::commBoundName(diagnosis->bound)))
                                                    : commDetail) +
                                       (kinds.isEmpty() ? QString() : QStringLiteral("\n") + kinds));
  tiles_[tr("Communication")]->setToolTip(
      communicationToolTip(diagnosis ? diagnosis->advice : std::string(), store_.networkOf(job->nodes), k.collectives));
  tiles_[tr("Slowest rank")]->set(
      k.slowestRank ? QStringLiteral("rank %1").arg(*k.slowestRank) : dash(),
      k.slowestRank ? tr("%1; imbalance %2")
                              .arg(QString::fromUtf8(std::string(kpi::slowCauseName(k.slowestCause)).c_str()))
                              .arg(k.loadImbalance ? QStringLiteral("%1×").arg(*k.loadImbalance, 0, 'f', 2) : dash()) +
                          (job->spec.rebalanceEvery > 0 && k.initialLoadImbalance
                               ? tr(" (%1× at the start; rebalanced)").arg(*k.initialLoadImbalance, 0, 'f', 2)
                               : QString())
                    : noSplit);
  tiles_[tr("Slowest rank")]->setToolTip(slowestRanksText(k));
  slowestRank_ = k.slowestRank;
  toSlowest_->setEnabled(k.slowestRank.has_value());
  toSlowest_->setText(k.slowestRank ? tr("Go to rank %1, the slowest").arg(*k.slowestRank) : tr("Go to the slowest rank"));
  const QString lastLoss = k.lastGlobalLoss ? tr("smoothed; last %1").arg(*k.lastGlobalLoss, 0, 'f', 4) : QString();
  tiles_[tr("Loss")]->set(figure(k.smoothedLoss, 4),
                          !noSteps.isEmpty() ? noSteps :
                          k.timeToConvergenceSeconds ? tr("target reached after %1").arg(duration(*k.timeToConvergenceSeconds))
                          : job->spec.targetLoss     ? tr("%1; target %2").arg(lastLoss).arg(*job->spec.targetLoss)
                                                     : lastLoss);
  tiles_[tr("ETA")]->set(running && k.etaSeconds ? duration(*k.etaSeconds) : dash(), steps);
  const Prices& prices = job->spec.prices;
  if (!prices.anySet()) {
    tiles_[tr("Cost")]->set(dash(), tr("no prices set for this job"));
  } else {
    // What waiting cost, beside the total: the tile's detail has room for the money only.
    QStringList detail;
    if (k.costProjected) detail << tr("projected %1").arg(money(*k.costProjected, currency));
    if (k.waitingCost) detail << tr("waiting %1").arg(money(*k.waitingCost, currency));
    if (k.stragglerCost) detail << tr("stragglers %1").arg(money(*k.stragglerCost, currency));
    tiles_[tr("Cost")]->set(k.costSoFar ? money(*k.costSoFar, currency) : dash(),
                            detail.join(QStringLiteral("; ")) + (k.costComplete ? QString() : tr(" (without unmeasured parts)")));
  }
  tiles_[tr("Cost")]->setToolTip(tr("Waiting on communication: %1").arg(qtext(report::waitingText(k, prices))));
  tiles_[tr("Energy")]->set(figure(k.energyKwh, 3, " kWh"),
                            k.energyKwh ? QString() : tr("no NVML energy counter"));
  if (ChartsOf of{published, jobId_, nodeFilter_}; !(of == chartsOf_)) {
    chartsOf_ = std::move(of);
    refreshCharts(*job, k);
  }
  refreshTimeline(*job, stall);
}

namespace {

// What the charts show of a job, copied out of its tracker under the job's lock; drawing it
// (QtCharts' replace and layout) comes after, without holding the ingest thread up.
struct ChartData {
  bool gpus = false;
  std::size_t devices = 0;
  std::uint32_t nodesPerBlock = 0;  // the heatmap's rows are blocks of nodes (a fanned-in job's); 0: devices
  double maxX = 0;
  std::vector<HeatmapWidget::Row> rows;
  std::vector<QList<QPointF>> lines;  // a line per device, or min, mean and max beyond kMaxUtilLines
  QList<QPointF> throughput, loss;
  std::vector<kpi::StepSplit> splits;  // grouped
};

QPointF point(const kpi::Point& p) { return {p.x, p.y}; }

// Utilization: GPUs when the job has GPU samples, else each rank's CPU %. The heatmap has a row
// per device; the chart a line per device up to kMaxUtilLines, beyond that min, mean and max.
void gatherUtilization(const JobSpec& spec, const ChartSeries& t, const QString& nodeFilter, ChartData& out) {
  std::vector<const std::deque<kpi::Point>*> series;
  QStringList labels;
  out.gpus = !t.gpuUtilization.empty();
  const auto shown = [&](const std::string& node) {
    return nodeFilter.isEmpty() || QString::fromStdString(node).contains(nodeFilter, Qt::CaseInsensitive);
  };
  if (out.gpus) {
    for (const auto& [key, s] : t.gpuUtilization) {
      if (!shown(key.first)) continue;
      labels << QStringLiteral("%1:%2").arg(QString::fromStdString(key.first)).arg(key.second);
      series.push_back(&s);
    }
  } else {
    std::map<std::uint32_t, std::string> nodeOf;
    for (const auto& p : spec.ranks) nodeOf[p.rank] = p.node;
    // CPU % of a rank can exceed 100 with several BLAS threads.
    for (const auto& [rank, s] : t.cpuPercent) {
      if (!shown(nodeOf[rank])) continue;
      labels << QStringLiteral("rank %1").arg(rank);
      series.push_back(&s);
    }
  }
  out.devices = series.size();
  for (const auto* s : series) {
    if (!s->empty()) out.maxX = std::max(out.maxX, s->back().x);
  }
  for (const auto& [first, block] : t.nodeBlocks) {
    if (!block.least.empty()) out.maxX = std::max(out.maxX, block.least.back().x);
  }
  const auto heatmapRow = [&](QString label, const std::deque<kpi::Point>& points) {
    HeatmapWidget::Row row{std::move(label), std::vector<double>(kHeatmapSeconds, NAN)};
    for (auto p = points.rbegin(); p != points.rend(); ++p) {
      const int age = static_cast<int>(std::floor(out.maxX - p->x));
      if (age >= kHeatmapSeconds) break;
      if (age >= 0) row.values[static_cast<std::size_t>(kHeatmapSeconds - 1 - age)] = p->y;
    }
    out.rows.push_back(std::move(row));
  };
  // A fanned-in job's heatmap: every block of its nodes, where its frames hold only some devices.
  for (const auto& [first, block] : t.nodeBlocks) {
    if (!shown(first)) continue;
    out.nodesPerBlock = std::max(out.nodesPerBlock, block.nodes);
    const QString node = QString::fromStdString(first);
    heatmapRow(block.nodes > 1 ? QStringLiteral("%1 (+%2)").arg(node).arg(block.nodes - 1) : node, block.least);
  }
  for (std::size_t i = 0; i < series.size() && t.nodeBlocks.empty(); ++i) {
    heatmapRow(labels[static_cast<qsizetype>(i)], *series[i]);
  }
  if (static_cast<int>(series.size()) <= kMaxUtilLines) {
    for (const auto* s : series) out.lines.push_back(thinned(*s, point));
    return;
  }
  // Per second of the visible window: the least, mean and most busy device.
  struct Bucket {
    double lo = INFINITY, hi = -INFINITY, sum = 0;
    int n = 0;
  };
  const double from = std::max(0.0, std::floor(out.maxX) - kUtilWindowSeconds);
  std::vector<Bucket> buckets(static_cast<std::size_t>(kUtilWindowSeconds) + 1);
  for (const auto* s : series) {
    for (auto p = s->rbegin(); p != s->rend() && p->x >= from; ++p) {
      Bucket& b = buckets[std::min(buckets.size() - 1, static_cast<std::size_t>(p->x - from))];
      b.lo = std::min(b.lo, p->y);
      b.hi = std::max(b.hi, p->y);
      b.sum += p->y;
      ++b.n;
    }
  }
  out.lines.resize(3);
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    const Bucket& b = buckets[i];
    if (b.n == 0) continue;
    const double x = from + static_cast<double>(i);
    out.lines[0] << QPointF(x, b.lo);
    out.lines[1] << QPointF(x, b.sum / b.n);
    out.lines[2] << QPointF(x, b.hi);
  }
}

ChartData gatherCharts(const JobSpec& spec, const ChartSeries& t, const QString& nodeFilter) {
  ChartData out;
  gatherUtilization(spec, t, nodeFilter, out);
  out.throughput = thinned(t.throughput, point);
  // Steps vary a lot one by one: show means over groups of steps (at most 150 groups).
  out.splits = kpi::groupedSplits(t.splits, 150);
  out.loss = thinned(t.loss, point);
  return out;
}

}  // namespace

void DashboardWidget::refreshCharts(const JobEntry& job, const kpi::JobKpis& k) {
  ChartData d = job.live->readCharts([&](const ChartSeries& t) { return gatherCharts(job.spec, t, nodeFilter_); });

  QString heatTitle = d.gpus ? tr("GPU utilization (%), last 2 minutes") : tr("CPU % per rank, last 2 minutes");
  if (d.nodesPerBlock > 0) {
    const QString nodes = d.nodesPerBlock > 1 ? tr("per %1 nodes").arg(d.nodesPerBlock) : tr("per node");
    heatTitle = d.gpus ? tr("GPU utilization (%) %1, its least busy GPU, last 2 minutes").arg(nodes)
                       : tr("CPU % %1, its least busy rank, last 2 minutes").arg(nodes);
  }
  if (!nodeFilter_.isEmpty()) heatTitle += tr(", nodes with “%1”").arg(nodeFilter_);
  heatmap_->setRows(std::move(d.rows), heatTitle);
  if (static_cast<int>(d.devices) <= kMaxUtilLines) {
    retitle(utilChart_, d.gpus ? tr("GPU utilization over time") : tr("CPU % per rank over time"));
  } else {
    retitle(utilChart_, d.gpus ? tr("GPU utilization: min, mean, max of %1").arg(d.devices)
                               : tr("CPU %: min, mean, max of %1 ranks").arg(d.devices));
  }
  while (utilSeries_.size() < d.lines.size()) {
    auto* s = new QLineSeries;
    utilChart_->addSeries(s);
    s->attachAxis(utilX_);
    s->attachAxis(utilY_);
    utilSeries_.push_back(s);
  }
  double maxY = 100;
  for (std::size_t i = 0; i < utilSeries_.size(); ++i) {
    if (i < d.lines.size()) {
      for (const auto& p : d.lines[i]) maxY = std::max(maxY, p.y());
      utilSeries_[i]->replace(d.lines[i]);
    } else {
      utilSeries_[i]->clear();
    }
  }
  fitAxis(utilX_, std::max(0.0, d.maxX - kUtilWindowSeconds), d.maxX, false, false);
  fitAxis(utilY_, 0, maxY, true, false);

  throughput_->replace(d.throughput);
  double tpMax = 1;
  for (const auto& p : d.throughput) tpMax = std::max(tpMax, p.y());
  fitAxis(throughputX_, d.throughput.isEmpty() ? 0 : d.throughput.front().x(),
          d.throughput.isEmpty() ? 1 : d.throughput.back().x(), false);
  fitAxis(throughputY_, 0, tpMax, true);

  QList<QPointF> zero, dataTop, compute, total;
  for (const auto& s : d.splits) {
    const double x = static_cast<double>(s.step);
    zero << QPointF(x, 0);
    dataTop << QPointF(x, s.dataMs);
    compute << QPointF(x, s.dataMs + s.computeMs);
    total << QPointF(x, s.dataMs + s.computeMs + s.exposedMs);
  }
  splitZero_->replace(zero);
  splitData_->replace(dataTop);
  splitCompute_->replace(compute);
  splitExposed_->replace(total);
  double splitMax = 1;
  for (const auto& p : total) splitMax = std::max(splitMax, p.y());
  fitAxis(splitX_, total.isEmpty() ? 0 : total.front().x(), total.isEmpty() ? 1 : total.back().x(), false);
  fitAxis(splitY_, 0, splitMax, true);

  loss_->replace(d.loss);
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& p : d.loss) {
    lo = std::min(lo, p.y());
    hi = std::max(hi, p.y());
  }
  if (!d.loss.isEmpty()) {
    fitAxis(lossX_, d.loss.front().x(), d.loss.back().x(), false);
    fitAxis(lossY_, lo, hi, false);
  }

  comm_->refresh(k);
}

// A few nodes by name, a cluster by count (all of them in the tooltip): the title never widens
// the window, whatever the job's size.
void DashboardWidget::setTitle(const JobEntry& job) {
  const auto of = std::make_pair(job.id, job.spec.attempt);
  if (of == titleOf_ && !recorded_) return;
  titleOf_ = of;
  title_->setText(tr("%1 — %2 ranks on %3").arg(jobId_).arg(job.spec.worldSize).arg(qtext(present::nodesText(job.nodes))));
  title_->setToolTip(qtext(present::nodesText(job.nodes, job.nodes.size())));
}

void DashboardWidget::setNodeFilter(const QString& text) {
  nodeFilter_ = text;
  refresh();
}

// Model FLOPs utilization (docs/kpis.md): the share, the FLOP/s against the peak, and in the tooltip
// where both came from.
void DashboardWidget::setMfuTile(const kpi::JobKpis& k, const QString& noSteps) {
  KpiTile* tile = tiles_[tr("MFU")];
  if (!k.modelFlopsPerSecond) {
    tile->set(dash(), !noSteps.isEmpty() ? noSteps : tr("no FLOPs reported (lockstep.step(..., flops=N))"));
    tile->setToolTip(QString());
    return;
  }
  tile->set(percent(k.mfu), k.mfu ? tr("%1 of %2 peak").arg(qtext(present::flopsRate(present::mfuFlopsRate(k))),
                                                            qtext(present::flopsRate(k.peakFlops)))
                                  : tr("%1; no peak known").arg(qtext(present::flopsRate(k.modelFlopsPerSecond))));
  tile->setToolTip(qtext(present::mfuBasisText(k)));
}

// The few slowest ranks by name, with their cause: who the stragglers are at 1024 ranks.
QString DashboardWidget::slowestRanksText(const kpi::JobKpis& k) {
  if (k.slowestRanks.empty()) return {};
  QStringList lines{tr("The slowest ranks (data + compute time per step, over the median rank's):")};
  for (const auto& s : k.slowestRanks) {
    lines << tr("rank %1 on %2: %3%4%, %5")
                 .arg(s.rank)
                 .arg(QString::fromStdString(s.node))
                 .arg(s.excess >= 0 ? QStringLiteral("+") : QString())
                 .arg(s.excess * 100, 0, 'f', 1)
                 .arg(QString::fromUtf8(std::string(kpi::slowCauseName(s.cause)).c_str()));
  }
  return lines.join(QLatin1Char('\n'));
}

void DashboardWidget::showStacks() {
  if (jobId_.isEmpty() || recorded_) return;
  auto* dialog = new StacksDialog(store_, jobId_, this);
  dialog->setAttribute(Qt::WA_DeleteOnClose);
  dialog->show();
}

void DashboardWidget::stopJob() {
  if (jobId_.isEmpty()) return;
  if (confirmStops_) {
    const auto answer = QMessageBox::question(
        this, tr("Stop job"),
        tr("Stop job %1? Its ranks get SIGTERM, and SIGKILL after the agents' grace period.").arg(jobId_),
        QMessageBox::Yes | QMessageBox::Cancel, QMessageBox::Cancel);
    if (answer != QMessageBox::Yes) return;
  }
  stop_->setEnabled(false);
  Q_EMIT stopRequested(jobId_);
}

}  // namespace lockstep::app
