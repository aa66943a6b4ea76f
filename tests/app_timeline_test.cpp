// Issue 35: the app's timeline (Qt Test, offscreen; a real window under xvfb for the docs'
// screenshot). Two real agents, one whose clock is 3 s ahead (a test knob), four real trainer
// ranks with rank 1 computing 4x slower: the timeline draws a lane per rank under its node, every
// node's lanes on this machine's clock, and rank 1's compute boxes the longest.
//
// Issue 42: every collective a program ran on its rank's lane, and the dashboard's communication
// split by kind, fed an FSDP-like stream at 8 and at 1024 ranks (LOCKSTEP_COLLECTIVES_SHOTS=dir
// saves what they look like).

#include <QApplication>
#include <QBarSet>
#include <QChart>
#include <QElapsedTimer>
#include <QImage>
#include <QPushButton>
#include <QStackedBarSeries>
#include <QTabWidget>
#include <QtTest>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>

#include "CommChart.h"
#include "TimelineWidget.h"
#include "lockstep/common/clock.h"
#include "lockstep/net/keys.h"
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


// Issue 42: an FSDP-like job fed as the bench feeds the store (no agents): `nodes` nodes of 8
// ranks, each step an all-gather and a reduce-scatter per layer (and their spans), the higher
// ranks waiting longer on their reduce-scatters. Returns once every rank's last step is in the KPIs.
void feedFsdpJob(App& app, const std::string& jobId, int nodes, std::uint64_t steps) {
  constexpr int kRanksPerNode = 8, kLayers = 16;
  auto keys = loadOrCreateKeyPair(app.keys.configDir + "/sim-" + jobId, "agent");
  QVERIFY(keys.ok());
  JobSpec spec = smallJob(jobId, static_cast<std::uint32_t>(nodes * kRanksPerNode), 1000);
  for (std::uint32_t r = 0; r < spec.worldSize; ++r) spec.ranks.push_back({r, "gpu-" + std::to_string(r / kRanksPerNode), r % kRanksPerNode, std::nullopt});
  const auto idOfNode = [](int a) { return QStringLiteral("127.0.0.1:%1").arg(1 + a); };
  for (int a = 0; a < nodes; ++a) {
    app.store.addAgent({"127.0.0.1", static_cast<std::uint16_t>(1 + a)}, keys->publicKey);
    auto hello = std::make_shared<NodeHello>();
    hello->nodeName = "gpu-" + std::to_string(a);
    app.store.onHello(idOfNode(a), hello);
    JobStatus status;
    status.spec = spec;
    status.state = JobState::kRunning;
    for (int g = 0; g < kRanksPerNode; ++g) {
      RankStatus rank;
      rank.rank = static_cast<std::uint32_t>(a * kRanksPerNode + g);
      status.ranks.push_back(rank);
    }
    app.store.onJobs(idOfNode(a), std::make_shared<const std::vector<JobStatus>>(std::vector<JobStatus>{status}));
  }
  constexpr std::int64_t kStepUs = 200'000;
  const std::int64_t now = unixMicrosNow();
  for (int a = 0; a < nodes; ++a) {
    std::vector<StreamMessage> batch;
    for (std::uint64_t step = 1; step <= steps; ++step) {
      for (int g = 0; g < kRanksPerNode; ++g) {
        StepReport r;
        r.jobId = jobId;
        r.rank = static_cast<std::uint32_t>(a * kRanksPerNode + g);
        r.worldSize = spec.worldSize;
        r.step = step;
        r.samples = 64;
        r.loss = 2.0f;
        r.timeUnixUs = now - static_cast<std::int64_t>(steps - step) * kStepUs;
        const std::int64_t start = r.timeUnixUs - kStepUs;
        const std::int64_t waited = 200 + 20 * (r.rank % 64);  // per reduce-scatter
        CollectiveTimes gather{CollectiveKind::kAllGather, kLayers, 0, 0, kLayers * (32ull << 20)};
        CollectiveTimes scatter{CollectiveKind::kReduceScatter, kLayers, 0, 0, kLayers * (64ull << 20)};
        for (int layer = 0; layer < kLayers; ++layer) {
          const std::int64_t at = start + 4'000 + layer * 11'000;
          r.collectiveSpans.push_back({CollectiveKind::kAllGather, at, 6'000, layer == 0 ? 3'000 : 0, 32ull << 20});
          r.collectiveSpans.push_back({CollectiveKind::kReduceScatter, at + 6'000, 4'000, waited, 64ull << 20});
          gather.timeUs += 6'000, gather.exposedUs += layer == 0 ? 3'000 : 0;
          scatter.timeUs += 4'000, scatter.exposedUs += waited;
        }
        r.collectives = {scatter, gather};
        r.dataTimeUs = 4'000;
        r.exposedCommTimeUs = gather.exposedUs + scatter.exposedUs;
        r.computeTimeUs = kStepUs - *r.dataTimeUs - *r.exposedCommTimeUs;
        r.stepTimeUs = kStepUs;
        batch.push_back({batch.size() + 1, "gpu-" + std::to_string(a), r});
      }
    }
    app.store.onMessages(idOfNode(a), std::make_shared<const std::vector<StreamMessage>>(std::move(batch)));
  }
  // Every rank's every step: the messages of the last node in.
  const auto in = [&] {
    const auto published = app.store.job(jobId)->live->published();
    const auto& ranks = published->kpis.ranks;
    return static_cast<std::uint32_t>(std::count_if(ranks.begin(), ranks.end(), [&](const auto& r) { return r.step == steps; }));
  };
  QDeadlineTimer deadline(kConnectMs);
  while (in() < spec.worldSize && !deadline.hasExpired()) QThread::msleep(10);
  QCOMPARE(in(), spec.worldSize);
}

kpi::CollectiveKpis exposedOf(CollectiveKind kind, double share) {
  kpi::CollectiveKpis c;
  c.kind = kind;
  c.perStep = 16;
  c.exposedShare = share;
  return c;
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

  // Issue 42: an FSDP-like step (an all-gather and a reduce-scatter per layer) draws each
  // collective at the time it ran over the step's boxes, labelled where it is wide enough: only
  // outlined where it was hidden behind compute, filled where the rank waited on it.
  void aStepsCollectivesAreDrawnOverItsBoxes() {
    kpi::Timeline t;
    constexpr std::int64_t kT0 = 1'800'000'000'000'000;
    for (std::uint32_t rank : {0u, 1u}) {
      StepReport r;
      r.jobId = "j";
      r.rank = rank;
      r.worldSize = 2;
      r.step = 1;
      r.samples = 64;
      r.timeUnixUs = kT0 + 100'000;
      r.dataTimeUs = 5'000;
      r.computeTimeUs = 85'000;
      r.exposedCommTimeUs = 10'000;
      r.stepTimeUs = 100'000;
      for (int layer = 0; layer < 4; ++layer) {
        const std::int64_t at = kT0 + 10'000 + layer * 20'000;
        r.collectiveSpans.push_back({CollectiveKind::kAllGather, at, 12'000, 0, 8u << 20});
        // Rank 1 waits on each reduce-scatter's last 4 ms.
        r.collectiveSpans.push_back({CollectiveKind::kReduceScatter, at + 12'000, 6'000, rank == 1 ? 4'000 : 0, 16u << 20});
      }
      t.add(r, "node-a");
    }
    app::TimelineWidget widget;
    widget.resize(1200, 200);
    widget.setSource([&](const std::function<void(const kpi::Timeline&)>& f) { f(t); });
    widget.setViewRange(kT0, kT0 + 100'000);
    const QImage image = widget.grab().toImage();
    const QRect lane0 = widget.laneRect(0), lane1 = widget.laneRect(1);
    QVERIFY(!lane0.isEmpty() && !lane1.isEmpty());
    const int hidden = pixelsOf(image, lane0, kpi::Phase::kCollective), waited = pixelsOf(image, lane1, kpi::Phase::kCollective);
    QVERIFY2(hidden > lane0.width() / 2, qPrintable(QStringLiteral("%1 px of rank 0's collectives").arg(hidden)));
    QVERIFY2(pixelsOf(image, lane0, kpi::Phase::kCompute) > lane0.width() * 4, "rank 0's compute shows under them");
    QVERIFY2(waited > hidden + 500,  // 16 ms of 100 filled: some 170 px by the lane's height
             qPrintable(QStringLiteral("rank 1's exposed parts are filled: %1 px against %2").arg(waited).arg(hidden)));
    // Hovering one names it, after its step's figures; the step's own boxes stay as they were.
    const double pxPerUs = static_cast<double>(lane0.width()) / 100'000;
    const QPoint inAllGather(lane0.left() + static_cast<int>(16'000 * pxPerUs), lane0.center().y());
    const QString tip = widget.tooltipAt(inAllGather);
    QVERIFY2(tip.contains(QStringLiteral("step 1 · compute")) && tip.contains(QStringLiteral("all-gather 8.0 MiB 12.0 ms, 0.00 ms of it exposed")),
             qPrintable(tip));
    const QPoint inReduceScatter(lane1.left() + static_cast<int>(26'000 * pxPerUs), lane1.center().y());
    QVERIFY2(widget.tooltipAt(inReduceScatter).contains(QStringLiteral("reduce-scatter 16.0 MiB 6.00 ms, 4.00 ms of it exposed")),
             qPrintable(widget.tooltipAt(inReduceScatter)));
    if (const char* shots = std::getenv("LOCKSTEP_COLLECTIVES_SHOTS")) {
      QVERIFY(widget.grab().save(QString::fromLocal8Bit(shots) + QStringLiteral("/collectives.png")));
    }
  }

  // Issue 42: each rank's exposed communication stacked by the kind of collective it waited on,
  // the rest "other"; a job whose ranks name no kinds keeps one part. At 1024 ranks, the 32
  // that wait longest.
  void theCommunicationBarsAreStackedByKind() {
    QChart chart;
    app::CommChart comm(&chart, nullptr);
    kpi::JobKpis k;
    for (std::uint32_t rank = 0; rank < 8; ++rank) {
      kpi::RankKpis r;
      r.rank = rank;
      r.commOverhead = 0.04 + 0.01 * rank;
      r.collectives = {exposedOf(CollectiveKind::kReduceScatter, 0.01), exposedOf(CollectiveKind::kAllGather, 0.02 + 0.01 * rank)};
      k.ranks.push_back(r);
    }
    comm.refresh(k);
    QCOMPARE(comm.partNames(), QStringList{QStringLiteral("communication")});
    QCOMPARE(comm.barCount(), 8);
    k.collectives = {exposedOf(CollectiveKind::kReduceScatter, 0.01), exposedOf(CollectiveKind::kAllGather, 0.055)};
    comm.refresh(k);
    QCOMPARE(comm.partNames(), (QStringList{QStringLiteral("reduce-scatter"), QStringLiteral("all-gather"), QStringLiteral("other")}));
    auto* stacked = qobject_cast<QStackedBarSeries*>(chart.series().value(0));
    QVERIFY(stacked && stacked->barSets().size() == 3);
    QCOMPARE(stacked->barSets()[1]->at(3), 5.0);  // rank 3's all-gather
    QCOMPARE(stacked->barSets()[2]->at(3), 1.0);  // and what no kind accounts for
    QCOMPARE(comm.toolTipOf(3), QStringLiteral("rank 3: 7.0% of its step time waiting on communication\n"
                                               "reduce-scatter 1.0%\nall-gather 5.0%\nother 1.0%"));
    for (std::uint32_t rank = 8; rank < 1024; ++rank) {
      kpi::RankKpis r = k.ranks[rank % 8];
      r.rank = rank;
      k.ranks.push_back(r);
    }
    comm.refresh(k);
    QCOMPARE(comm.barCount(), 32);
    QVERIFY2(chart.title().contains(QStringLiteral("32 highest of 1024")), qPrintable(chart.title()));
    QVERIFY2(comm.toolTipOf(0).startsWith(QStringLiteral("rank 7: 11.0%")), qPrintable(comm.toolTipOf(0)));
  }

  // Issue 42: an FSDP-like job's Communication tile splits its exposed communication by kind, and
  // its timeline draws every collective on its rank's lane.
  void anFsdpJobsCommunicationIsSplitByKind() {
    TempDir dir;
    App app(dir);
    feedFsdpJob(app, "fsdp-8", 1, 30);
    app.window.resize(1400, 900);
    app.window.show();
    app.window.selectJob(QStringLiteral("fsdp-8"));
    app.window.refreshNow();
    const app::KpiTile* comm = app.window.dashboard()->tile(QStringLiteral("Communication"));
    QVERIFY2(comm->detail().contains(QStringLiteral("reduce-scatter ")) && comm->detail().contains(QStringLiteral(" · all-gather ")),
             qPrintable(comm->detail()));
    QVERIFY2(comm->toolTip().contains(QStringLiteral("all-gather: 16 a step, 512.0 MiB a step")), qPrintable(comm->toolTip()));
    // Its kinds account for all of its ranks' wait: no "other".
    QCOMPARE(app.window.dashboard()->commChart()->partNames(), (QStringList{QStringLiteral("reduce-scatter"), QStringLiteral("all-gather")}));
    auto* timeline = app.window.dashboard()->timeline();
    app.window.dashboard()->showTimeline();
    const auto [from, to] = timeline->viewRange();
    timeline->setViewRange(to - 200'000, to);
    app.window.refreshNow();
    const QRect lane = timeline->laneRect(7);
    QVERIFY(!lane.isEmpty());
    const double pxPerUs = static_cast<double>(lane.width()) / 200'000;
    const QPoint inAllGather(lane.left() + static_cast<int>(6'000 * pxPerUs), lane.center().y());
    QVERIFY2(timeline->tooltipAt(inAllGather).contains(QStringLiteral("all-gather 32.0 MiB 6.00 ms")), qPrintable(timeline->tooltipAt(inAllGather)));
    if (const char* shots = std::getenv("LOCKSTEP_COLLECTIVES_SHOTS")) {
      const QString at = QString::fromLocal8Bit(shots);
      timeline->setFollow(true);
      app.window.dashboard()->showTimeline();
      app.window.refreshNow();
      QTest::qWait(100);
      QVERIFY(app.window.grab().save(at + QStringLiteral("/fsdp-8-timeline.png")));
      timeline->setViewRange(to - 60'000, to - 20'000);
      app.window.refreshNow();
      QVERIFY(app.window.grab().save(at + QStringLiteral("/fsdp-8-timeline-zoomed.png")));
      auto* tabs = app.window.dashboard()->findChild<QTabWidget*>();
      tabs->setCurrentIndex(0);
      app.window.refreshNow();
      QTest::qWait(100);
      QVERIFY(app.window.grab().save(at + QStringLiteral("/fsdp-8-dashboard.png")));
    }
  }

  // Issue 42: the same at 1024 ranks: the tile, the 32 bars, and the timeline's lanes in view.
  void anFsdpJobOf1024RanksIsShownAsAt8() {
    TempDir dir;
    App app(dir);
    feedFsdpJob(app, "fsdp-1024", 128, 12);
    app.window.resize(1400, 900);
    app.window.show();
    app.window.selectJob(QStringLiteral("fsdp-1024"));
    app.window.refreshNow();
    const app::KpiTile* comm = app.window.dashboard()->tile(QStringLiteral("Communication"));
    QVERIFY2(comm->detail().contains(QStringLiteral("reduce-scatter ")), qPrintable(comm->detail()));
    QCOMPARE(app.window.dashboard()->chartPointCount(QStringLiteral("comm")), 32);
    auto* timeline = app.window.dashboard()->timeline();
    app.window.dashboard()->showTimeline();
    QElapsedTimer took;
    took.start();
    for (int i = 0; i < 10; ++i) {
      timeline->refresh();
      timeline->repaint();
    }
    // A bound against drawing every collective one by one (seconds a refresh), not a timing target.
    QVERIFY2(took.elapsed() < 30000, qPrintable(QStringLiteral("10 refreshes took %1 ms").arg(took.elapsed())));
    if (const char* shots = std::getenv("LOCKSTEP_COLLECTIVES_SHOTS")) {
      const QString at = QString::fromLocal8Bit(shots);
      QTest::qWait(100);
      QVERIFY(app.window.grab().save(at + QStringLiteral("/fsdp-1024-timeline.png")));
      auto* tabs = app.window.dashboard()->findChild<QTabWidget*>();
      tabs->setCurrentIndex(0);
      app.window.refreshNow();
      QTest::qWait(100);
      QVERIFY(app.window.grab().save(at + QStringLiteral("/fsdp-1024-dashboard.png")));
    }
  }
};

QTEST_MAIN(AppTimelineTest)
#include "app_timeline_test.moc"
