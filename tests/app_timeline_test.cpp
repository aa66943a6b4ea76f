// Issue 35: the app's timeline (Qt Test, offscreen; a real window under xvfb for the docs'
// screenshot). Two real agents, one whose clock is 3 s ahead (a test knob), four real trainer
// ranks with rank 1 computing 4x slower: the timeline draws a lane per rank under its node, every
// node's lanes on this machine's clock, and rank 1's compute boxes the longest.

#include <QApplication>
#include <QImage>
#include <QPushButton>
#include <QtTest>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>

#include "TimelineWidget.h"
#include "lockstep/present/present.h"
#include "support/app_support.h"

using namespace lockstep;
using namespace lockstep::test;

namespace {

constexpr std::int64_t kShiftUs = 3'000'000;

// Pixels of `phase`'s colour in `area` of `image`.
int pixelsOf(const QImage& image, const QRect& area, kpi::Phase phase) {
  const QRgb want = QColor(QString::fromUtf8(present::phaseColor(phase).data(), 7)).rgb();
  int n = 0;
  for (int y = area.top(); y <= area.bottom(); ++y) {
    for (int x = area.left(); x <= area.right(); ++x) n += (image.pixel(x, y) | 0xff000000) == (want | 0xff000000);
  }
  return n;
}

}  // namespace

class AppTimelineTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    app::registerMetaTypes();
  }

  void theTimelineDrawsEveryRankOnOneClock() {
    TempDir dir;
    TwoNodes nodes(dir, {{"LOCKSTEP_TEST_SLOWDOWN", "1:4"}}, kShiftUs);
    auto& [a, b] = nodes;
    App app(dir, dir.file("history.db"));
    for (const auto* agent : {&a, &b}) {
      const QString problem = connectAuthorized(app, *agent);
      QVERIFY2(problem.isEmpty(), qPrintable(problem));
    }
    JobSpec spec = smallJob("gui-timeline", 4, 1'000'000);  // runs until stopped
    spec.layers = {256, 512, 10};
    spec.dataset = SyntheticDataset{4096, 256, 10, 3};
    spec.checkpointDir = dir.file("ckpt");  // rank 0 reports each checkpoint as a phase
    spec.checkpointEvery = 40;
    QSignalSpy launched(&app.window.control(), &app::JobControl::launchFinished);
    auto placed = app.store.place(spec, {{idOf(a), 2}, {idOf(b), 2}});
    QVERIFY2(placed, placed ? "" : placed.error().message.c_str());
    app.window.control().launch(*placed);
    QTRY_COMPARE_WITH_TIMEOUT(launched.count(), 1, kJobMs);
    QVERIFY2(launched.at(0).at(1).toBool(), qPrintable(launched.at(0).at(2).toString()));
    QTRY_COMPARE_WITH_TIMEOUT(app.window.dashboard()->jobId(), QStringLiteral("gui-timeline"), kConnectMs);

    app.window.resize(1400, 900);
    app.window.show();
    auto* dashboard = app.window.dashboard();
    dashboard->showTimeline();
    auto* timeline = dashboard->timeline();
    const QStringList rows = {"node-a", "rank 0", "rank 1", "node-b", "rank 2", "rank 3"};
    QTRY_COMPARE_WITH_TIMEOUT((app.window.refreshNow(), timeline->rowLabels()), rows, kJobMs);

    // Both nodes' clocks measured; node-b's 3 s ahead, within the stated uncertainty.
    const auto live = app.store.job("gui-timeline")->live;
    QTRY_VERIFY_WITH_TIMEOUT(live->readTimeline([](const kpi::Timeline& t) { return t.clocks().size(); }) == 2, kConnectMs);
    const auto clocks = live->readTimeline([](const kpi::Timeline& t) { return t.clocks(); });
    QVERIFY(std::abs(clocks.at("node-a").offsetUs) <= clocks.at("node-a").uncertaintyUs);
    QVERIFY(std::abs(clocks.at("node-b").offsetUs - kShiftUs) <= clocks.at("node-b").uncertaintyUs);

    // A few seconds of steps; then the lanes' newest steps end together on this machine's clock.
    QTest::qWait(3000);
    app.window.refreshNow();
    const auto ends = live->readTimeline([](const kpi::Timeline& t) {
      std::vector<std::int64_t> out;
      for (const auto* lane : t.lanes()) out.push_back(lane->steps.back().endUs - t.offsetOf(lane->node));
      return out;
    });
    QCOMPARE(ends.size(), 4u);
    const auto [low, high] = std::minmax_element(ends.begin(), ends.end());
    QVERIFY2(*high - *low < 500'000, qPrintable(QStringLiteral("the lanes' ends are %1 µs apart").arg(*high - *low)));

    // Drawn: each lane has boxes; rank 1's compute is the widest, the others wait in communication.
    timeline->setViewRange(timeline->viewRange().second - 400'000, timeline->viewRange().second);
    app.window.refreshNow();
    const QImage image = timeline->grab().toImage();
    std::vector<int> compute;
    for (std::uint32_t rank = 0; rank < 4; ++rank) {
      const QRect lane = timeline->laneRect(rank);
      QVERIFY2(!lane.isEmpty(), qPrintable(QStringLiteral("rank %1 is not in view").arg(rank)));
      compute.push_back(pixelsOf(image, lane, kpi::Phase::kCompute));
      QVERIFY2(compute.back() > 0, qPrintable(QStringLiteral("rank %1 has no compute drawn").arg(rank)));
    }
    for (std::uint32_t rank : {0u, 2u, 3u}) {
      QVERIFY2(compute[1] > compute[rank], qPrintable(QStringLiteral("rank 1: %1 px of compute, rank %2: %3").arg(compute[1]).arg(rank).arg(compute[rank])));
      QVERIFY(pixelsOf(image, timeline->laneRect(rank), kpi::Phase::kCommunication) > pixelsOf(image, timeline->laneRect(1), kpi::Phase::kCommunication));
    }
    QVERIFY(!timeline->following());

    // The slowest rank is a click away (at 1024 ranks its lane is far down the list).
    auto* toSlowest = dashboard->findChild<QPushButton*>(QStringLiteral("timelineSlowest"));
    QVERIFY(toSlowest != nullptr);
    QTRY_COMPARE_WITH_TIMEOUT((app.window.refreshNow(), toSlowest->text()), QStringLiteral("Go to rank 1, the slowest"), kJobMs);
    toSlowest->click();
    QCOMPARE(timeline->markedRank(), std::optional<std::uint32_t>(1));

    // Rank 0's checkpoints reach its lane live, as boxes of their own; no other rank writes them.
    const auto newestCheckpoint = [&] {
      return live->readTimeline([](const kpi::Timeline& t) -> std::optional<std::pair<std::int64_t, std::int64_t>> {
        for (const auto* lane : t.lanes()) {
          if (lane->rank != 0 || lane->phases.empty()) continue;
          const auto& p = lane->phases.back();
          return std::pair{p.startUs() - t.offsetOf(lane->node), p.endUs - t.offsetOf(lane->node)};
        }
        return std::nullopt;
      });
    };
    QTRY_VERIFY_WITH_TIMEOUT(newestCheckpoint().has_value(), kJobMs);
    const auto [from, to] = *newestCheckpoint();
    timeline->setViewRange(from - 10'000, to + 10'000);
    app.window.refreshNow();
    const QImage around = timeline->grab().toImage();
    QVERIFY2(pixelsOf(around, timeline->laneRect(0), kpi::Phase::kNamed) > 0, "rank 0's checkpoint is drawn");
    for (std::uint32_t rank : {1u, 2u, 3u}) QCOMPARE(pixelsOf(around, timeline->laneRect(rank), kpi::Phase::kNamed), 0);

    // For docs/: the window as a user sees it, around that checkpoint (under xvfb, with a real X server).
    if (const char* shot = std::getenv("LOCKSTEP_TIMELINE_SCREENSHOT")) {
      const std::int64_t half = std::max<std::int64_t>(4'000, 4 * (to - from));
      timeline->setViewRange((from + to) / 2 - half, (from + to) / 2 + half);
      app.window.refreshNow();
      QTest::qWait(200);
      QVERIFY(app.window.grab().save(QString::fromLocal8Bit(shot)));
    }
    app.window.control().stopJob("gui-timeline");
    QTRY_VERIFY_WITH_TIMEOUT(processesOfJob("gui-timeline").empty(), kJobMs);
  }

  // A user's own PyTorch DDP program: its checkpoints and evaluations (lockstep.phase) reach its
  // ranks' lanes live, as boxes of their own with their names.
  void aProgramsCheckpointsAndEvaluationsAreDrawnLive() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    App app(dir, dir.file("history.db"));
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    const std::string program = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/programs/ddp_mlp.py";
    JobSpec spec = commandJob("gui-phases", 2,
                              {"/usr/bin/python3", program, "--instrument", "--steps", "60", "--phase-every", "20",
                               "--phase-s", "0.3", "--eval-every", "25"},
                              dir.path().string());
    QSignalSpy launched(&app.window.control(), &app::JobControl::launchFinished);
    auto placed = app.store.place(spec, {{idOf(agent), 2}});
    QVERIFY2(placed, placed ? "" : placed.error().message.c_str());
    app.window.control().launch(*placed);
    QTRY_COMPARE_WITH_TIMEOUT(launched.count(), 1, kJobMs);
    QVERIFY2(launched.at(0).at(1).toBool(), qPrintable(launched.at(0).at(2).toString()));
    QTRY_COMPARE_WITH_TIMEOUT(app.window.dashboard()->jobId(), QStringLiteral("gui-phases"), kConnectMs);
    app.window.resize(1400, 900);
    app.window.show();
    app.window.dashboard()->showTimeline();
    auto* timeline = app.window.dashboard()->timeline();

    // Each rank's first checkpoint (after step 20) and eval (before step 25's report).
    const auto live = app.store.job("gui-phases")->live;
    const auto phasesOf = [&](std::uint32_t rank) {
      return live->readTimeline([rank](const kpi::Timeline& t) {
        std::map<std::string, std::pair<std::int64_t, std::int64_t>> out;  // name -> its first, on this clock
        for (const auto* lane : t.lanes()) {
          if (lane->rank != rank) continue;
          for (const auto& p : lane->phases) out.try_emplace(p.name, p.startUs() - t.offsetOf(lane->node), p.endUs - t.offsetOf(lane->node));
        }
        return out;
      });
    };
    QTRY_VERIFY_WITH_TIMEOUT(phasesOf(0).size() == 2 && phasesOf(1).size() == 2, 120'000);
    const auto [from, to] = phasesOf(0).at("checkpoint");
    QVERIFY2(to - from >= 300'000, qPrintable(QStringLiteral("the checkpoint took %1 µs").arg(to - from)));
    const std::int64_t evalEnd = phasesOf(0).at("eval").second;
    timeline->setViewRange(from - 100'000, evalEnd + 100'000);
    app.window.refreshNow();
    const QImage image = timeline->grab().toImage();
    for (std::uint32_t rank : {0u, 1u}) {
      const QRect lane = timeline->laneRect(rank);
      QVERIFY2(pixelsOf(image, lane, kpi::Phase::kNamed) > lane.width() / 4, qPrintable(QStringLiteral("rank %1's phases").arg(rank)));
    }
    const QRect lane0 = timeline->laneRect(0);
    const double pxPerUs = static_cast<double>(lane0.width()) / static_cast<double>(evalEnd + 200'000 - from);
    const QPoint inCheckpoint(lane0.left() + static_cast<int>(static_cast<double>(100'000 + (to - from) / 2) * pxPerUs), lane0.center().y());
    QVERIFY2(timeline->tooltipAt(inCheckpoint).contains(QStringLiteral("rank 0 · checkpoint ")), qPrintable(timeline->tooltipAt(inCheckpoint)));

    // For docs/: the window as a user sees it (under xvfb, with a real X server).
    if (const char* shot = std::getenv("LOCKSTEP_TIMELINE_PHASES_SCREENSHOT")) {
      QTest::qWait(1500);  // the job list (its ranks' progress) is listed again every second
      app.window.refreshNow();
      QVERIFY(app.window.grab().save(QString::fromLocal8Bit(shot)));
    }
    app.window.control().stopJob("gui-phases");
    QTRY_VERIFY_WITH_TIMEOUT(processesOfJob("gui-phases").empty(), kJobMs);
  }

  // Among 300 lanes, showRank scrolls one into view and marks it.
  void showRankScrollsItsLaneIntoViewAndMarksIt() {
    kpi::Timeline t;
    for (std::uint32_t rank = 0; rank < 300; ++rank) {
      StepReport r;
      r.jobId = "j";
      r.rank = rank;
      r.worldSize = 300;
      r.step = 1;
      r.timeUnixUs = 1'800'000'000'000'000;
      r.stepTimeUs = 100'000;
      t.add(r, "node-" + std::to_string(rank / 8));
    }
    app::TimelineWidget widget;
    widget.resize(900, 300);
    widget.setSource([&](const std::function<void(const kpi::Timeline&)>& f) { f(t); });
    QVERIFY(!widget.laneRect(0).isEmpty());
    QVERIFY(widget.laneRect(250).isEmpty());
    widget.showRank(250);
    const QRect lane = widget.laneRect(250);
    QVERIFY2(!lane.isEmpty(), "rank 250 is in view");
    QVERIFY(widget.laneRect(0).isEmpty());
    QCOMPARE(widget.markedRank(), std::optional<std::uint32_t>(250));
    // Its name is marked: the label cell has the highlight's colour, another lane's has not.
    const QImage image = widget.grab().toImage();
    const QRgb mark = widget.palette().color(QPalette::Highlight).lighter(170).rgb();
    QCOMPARE(image.pixel(2, lane.center().y()) | 0xff000000, mark | 0xff000000);
    QVERIFY((image.pixel(2, widget.laneRect(251).center().y()) | 0xff000000) != (mark | 0xff000000));
  }

  // A program's named phase is a box of its own over the step it ran in, with its name on hover;
  // the optimizer is cut from the end of compute, after the all-reduce.
  void aNamedPhaseAndTheOptimizerAreBoxesOfTheirOwn() {
    kpi::Timeline t;
    const auto step = [](std::uint32_t rank, std::uint64_t n, std::int64_t endUs, std::int64_t dataUs) {
      StepReport r;
      r.jobId = "j";
      r.rank = rank;
      r.worldSize = 2;
      r.step = n;
      r.samples = 64;
      r.timeUnixUs = endUs;
      r.dataTimeUs = dataUs;
      r.computeTimeUs = 60'000;
      r.exposedCommTimeUs = 20'000;
      r.optimizerTimeUs = 20'000;
      r.stepTimeUs = dataUs + 80'000;
      return r;
    };
    constexpr std::int64_t kT0 = 1'800'000'000'000'000;
    for (std::uint32_t rank : {0u, 1u}) {
      t.add(step(rank, 1, kT0 + 120'000, 20'000), "node-a");
      t.add(step(rank, 2, kT0 + 720'000, 500'000), "node-a");  // rank 0's checkpoint ran in it
    }
    // Named as programs may name things: a "%1" in it is no placeholder.
    t.add(PhaseReport{"j", 0, 2, 0, "checkpoint %1", kT0 + 600'000, 450'000, 1}, "node-a");
    app::TimelineWidget widget;
    widget.resize(1000, 200);
    widget.setSource([&](const std::function<void(const kpi::Timeline&)>& f) { f(t); });
    widget.setViewRange(kT0, kT0 + 720'000);
    const QImage image = widget.grab().toImage();
    const QRect lane0 = widget.laneRect(0), lane1 = widget.laneRect(1);
    QVERIFY(!lane0.isEmpty() && !lane1.isEmpty());
    const int named = pixelsOf(image, lane0, kpi::Phase::kNamed);
    QVERIFY2(named > lane0.width() / 2 * (lane0.height() - 4), qPrintable(QStringLiteral("%1 px of the checkpoint").arg(named)));
    QCOMPARE(pixelsOf(image, lane1, kpi::Phase::kNamed), 0);
    for (const QRect& lane : {lane0, lane1}) QVERIFY(pixelsOf(image, lane, kpi::Phase::kOptimizer) > 0);
    QVERIFY2(pixelsOf(image, lane1, kpi::Phase::kData) > 4 * pixelsOf(image, lane0, kpi::Phase::kData),
             "rank 0's long data box is mostly under its checkpoint");
    // Hover: the phase over its step, the optimizer's box with its step's figures.
    const double pxPerUs = static_cast<double>(lane0.width()) / 720'000;
    const QPoint inCheckpoint(lane0.left() + static_cast<int>(300'000 * pxPerUs), lane0.center().y());
    QVERIFY2(widget.tooltipAt(inCheckpoint).contains(QStringLiteral("rank 0 · checkpoint %1 450.0 ms, after step 1")),
             qPrintable(widget.tooltipAt(inCheckpoint)));
    const QPoint inOptimizer(lane1.left() + static_cast<int>(710'000 * pxPerUs), lane1.center().y());
    QVERIFY2(widget.tooltipAt(inOptimizer).contains(QStringLiteral("step 2 · optimizer 20.0 ms")), qPrintable(widget.tooltipAt(inOptimizer)));
  }
};

QTEST_MAIN(AppTimelineTest)
#include "app_timeline_test.moc"
