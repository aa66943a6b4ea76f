// Issue 46 §1: the app watches a job on more nodes than its fan-in rule allows through the job's
// supervising agent (docs/fan-in.md): the job's records are left out of every agent's stream to
// the app, and its dashboard is drawn from the frames, whose KPIs equal what every agent's stream
// holds. Real agents on two nodes, a real trainer job across them, the app offscreen.

#include <QtTest>
#include <atomic>
#include <set>

#include "AgentWorker.h"
#include "ChartSeries.h"
#include "HeatmapWidget.h"
#include "TimelineWidget.h"
#include "lockstep/kpi/frame.h"
#include "lockstep/kpi/stream.h"
#include "support/app_support.h"

using namespace lockstep;
using namespace lockstep::test;
using namespace std::chrono_literals;

// Two real agents, lockstepctl paired with both, and an app that fans in every job on more than
// one node.
struct FanInPair {
  TempDir dir;
  AgentProcess a{dir, "node-a"}, b{dir, "node-b"};
  Ctl ctl{dir, dir.file("config")};
  App app{dir, {}, app::FanInRule{1}};
  bool paired = ctl.pairWith(a) && ctl.pairWith(b);
  auto parts() { return std::tie(dir, a, b, ctl, app); }
};

class AppFanInTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    app::registerMetaTypes();
  }

  // Jobs on more than one node are fanned in: this one, on two, is.
  void aJobOnMoreNodesThanTheRuleIsDrawnFromItsSupervisingAgentsFrames() {
    FanInPair nodes;
    QVERIFY(nodes.paired);
    auto [dir, a, b, ctl, app] = nodes.parts();
    for (const AgentProcess* agent : {&a, &b}) {
      const QString problem = connectAuthorized(app, *agent);
      QVERIFY2(problem.isEmpty(), qPrintable(problem));
    }
    // Every record each agent's worker hands on, counted on the worker's thread.
    std::atomic<int> jobRecords{0}, nodeRecords{0};
    for (const auto& agent : app.store.agents()) {
      QObject::connect(
          agent->worker.get(), &app::AgentWorker::messagesReceived, agent->worker.get(),
          [&](QString, app::MessageBatch batch) {
            for (const auto& m : *batch) ++(jobOf(m.payload).empty() ? nodeRecords : jobRecords);
          },
          Qt::DirectConnection);
    }

    // An alert that fires on the first reading: its events reach the app in the frames.
    auto run = ctl({"start", "--ranks-per-agent", "1,1", "--job-id", "wide", "--layers", "16,32,4", "--dataset",
                    "synthetic:n=2048", "--steps", "3000", "--alert", "exposed_comm > 0% -> notify"});
    QVERIFY2(run.status.exitCode == 0, (run.out + run.err).c_str());
    QTRY_VERIFY_WITH_TIMEOUT(app.store.job("wide") != nullptr, kConnectMs);
    const app::JobEntry* job = app.store.job("wide");
    QVERIFY(job->live->fannedIn());
    app.window.dashboard()->showJob(QStringLiteral("wide"));
    QTRY_VERIFY_WITH_TIMEOUT(app.points(QStringLiteral("throughput")) > 0, kJobMs);

    // The job's last frame: once it is in, the app's KPIs are every stream's at its moment.
    auto supervising = connectAuthorized(job->spec.agents.front().node == a.name() ? a : b, dir);
    std::optional<FrameReply> last;
    QVERIFY(waitUntil(
        [&] {
          auto f = supervising->frame({"wide", 0, kMaxFrameRanks, 0}, 5s);
          if (f && f->ended) last = std::move(*f);
          return last.has_value();
        },
        60s));
    QTRY_VERIFY_WITH_TIMEOUT(job->live->published()->lastReportUnixUs == last->timeUnixUs, kConnectMs);
    const kpi::JobKpis shown = job->live->published()->kpis;

    std::vector<StreamMessage> all;
    for (const AgentProcess* agent : {&a, &b}) {
      auto client = connectAuthorized(*agent, dir);
      for (std::uint64_t after = 0;;) {
        auto batch = client->fetch(after, 5000, 0, 5s);
        QVERIFY2(batch.ok(), batch ? "" : batch.error().message.c_str());
        if (batch->messages.empty()) break;
        after = batch->messages.back().seq;
        all.insert(all.end(), batch->messages.begin(), batch->messages.end());
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const StreamMessage& x, const StreamMessage& y) {
      return timeOf(x.payload) < timeOf(y.payload);
    });
    kpi::JobTracker tracker(job->spec);
    kpi::StreamReader reader([&](const std::string& id) -> RecordSink* { return id == "wide" ? &tracker : nullptr; });
    reader.read(all);
    const kpi::JobKpis full = tracker.snapshot(last->timeUnixUs);
    QCOMPARE(shown.step, std::uint64_t{3000});
    QCOMPARE(shown.ranks.size(), std::size_t{2});
    // And its nodes as the heatmap's rows, each its least busy rank's CPU %, as on the wire (float).
    kpi::JobKpis expected = full;
    expected.nodeBlocks = kpi::nodeBlocks(job->spec.ranks, full.ranks, full.gpus);
    for (auto& block : expected.nodeBlocks) {
      for (kpi::Maybe* m : {&block.meanPct, &block.leastPct}) {
        if (*m) *m = static_cast<float>(**m);
      }
    }
    QCOMPARE(expected.nodeBlocks.size(), std::size_t{2});
    QVERIFY2(shown == expected, "the app's KPIs of the fanned-in job are every stream's, exactly");
    // Its frames hold every one of its ranks: the heatmap draws their devices, not the blocks.
    const app::HeatmapWidget* heatmap = app.window.dashboard()->heatmap();
    // Drawn at the dashboard's next refresh: one before it may hold rank 0's row alone (rank 1's first
    // CPU sample came later), as it did in 2 of 5 runs beside two busy loops.
    QTRY_COMPARE_WITH_TIMEOUT((app.window.refreshNow(), heatmap->rowCount()), 2, kConnectMs);
    QCOMPARE(heatmap->rowLabel(0), QStringLiteral("rank 0"));

    // Not one of the job's records came to the app; the nodes' own still do.
    QCOMPARE(jobRecords.load(), 0);
    QVERIFY(nodeRecords.load() > 0);
    // The frames' alert events reached the app's alerts.
    QTRY_VERIFY_WITH_TIMEOUT(!app.store.alerts().entries("wide").empty(), kConnectMs);
    // Its charts: a point a frame; its timeline says why it has no steps, and how to get them.
    QVERIFY(app.points(QStringLiteral("loss")) > 0);
    app.window.dashboard()->showTimeline();
    app.window.refreshNow();
    const QString why = app.window.dashboard()->timeline()->why();
    QVERIFY2(why.contains(QStringLiteral("watched through its supervising agent")) &&
                 why.contains(QStringLiteral("--fan-in-nodes 2")),
             qPrintable(why));
  }

  // Its figures come from its supervising agent alone: an app that does not hold that agent says
  // which to add, rather than show a job that never moves.
  void aFannedInJobWithoutItsSupervisingAgentSaysWhichAgentToAdd() {
    FanInPair nodes;
    QVERIFY(nodes.paired);
    auto [dir, a, b, ctl, app] = nodes.parts();
    auto run = ctl({"start", "--ranks-per-agent", "1,1", "--job-id", "elsewhere", "--layers", "16,32,4", "--dataset",
                    "synthetic:n=2048", "--steps", "100000000"});
    QVERIFY2(run.status.exitCode == 0, (run.out + run.err).c_str());
    auto client = connectAuthorized(a, dir);
    const auto status = jobStatusOn(*client, "elsewhere");
    QVERIFY(status.has_value());
    const AgentProcess& other = status->spec.agents.front().node == a.name() ? b : a;
    const QString problem = connectAuthorized(app, other);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QTRY_VERIFY_WITH_TIMEOUT(app.store.job("elsewhere") != nullptr, kConnectMs);
    app.window.dashboard()->showJob(QStringLiteral("elsewhere"));
    const QString expected = QStringLiteral("add the agent of its first node, %1")
                                 .arg(QString::fromStdString(status->spec.agents.front().node));
    QTRY_VERIFY_WITH_TIMEOUT(app.dashboardLabel("jobBanner").contains(expected), kConnectMs);
    QVERIFY2(app.dashboardLabel("jobBanner").contains(QStringLiteral("No agent this app is connected to supervises")),
             qPrintable(app.dashboardLabel("jobBanner")));
    QCOMPARE(ctl({"stop", "elsewhere"}).status.exitCode, 0);
    // Once it ended, how it ended still shows, with why its figures did not come.
    QTRY_VERIFY_WITH_TIMEOUT(app.dashboardLabel("jobBanner").startsWith(QStringLiteral("Stopped")), kConnectMs);
    QVERIFY2(app.dashboardLabel("jobBanner").contains(expected), qPrintable(app.dashboardLabel("jobBanner")));
  }

  // A fanned-in job's heatmap is its nodes, each its least busy device, where its frames hold some of
  // its ranks: the blocks of the newest frame, with the points they had.
  void theHeatmapOfAFannedInJobIsItsNodesWhereItsFramesHoldSomeRanks() {
    app::FrameSeries series(600, 300);
    kpi::JobKpis k;
    k.worldSize = 16384;
    k.ranks.resize(264);  // ranks 0-255 and the slowest
    k.elapsedSeconds = 10;
    k.nodeBlocks = {{"n1", 1, 8, 80.0, 20.0}, {"n2", 1, 8, 90.0, 85.0}};
    series.add(k);
    k.elapsedSeconds = 11;
    k.nodeBlocks = {{"n2", 1, 8, 90.0, 60.0}, {"n3", 1, 0, std::nullopt, std::nullopt}};  // n1 left the job
    series.add(k);
    const auto& blocks = series.view().nodeBlocks;
    QCOMPARE(blocks.size(), std::size_t{2});
    QVERIFY(!blocks.count("n1"));
    QCOMPARE(blocks.at("n2").least.size(), std::size_t{2});
    QCOMPARE(blocks.at("n2").least.front().y, 85.0);
    QCOMPARE(blocks.at("n2").least.back().y, 60.0);
    QVERIFY2(blocks.at("n3").least.empty(), "a node without a reading is a row all the same");
    k.elapsedSeconds = 12;
    k.ranks.resize(16384);  // every rank in the frame: their devices' rows are the heatmap
    series.add(k);
    QVERIFY(series.view().nodeBlocks.empty());
    k.ranks.resize(264);
    k.nodeBlocks.clear();  // an agent that sends none
    k.elapsedSeconds = 13;
    series.add(k);
    QVERIFY(series.view().nodeBlocks.empty());
  }

  // The worker asks ten times a second, naming the frame it holds; that frame comes again without
  // its KPIs (FrameRequest::heldUnixUs), with the events the last did not bring.
  void theFrameHeldComesAgainWithoutItsKpisAndChangesNothingButItsEvents() {
    JobSpec spec = smallJob("held", 2, 10);
    app::LiveJob live(spec, kpi::Settings{}, true);
    kpi::JobKpis k;
    k.jobId = "held";
    k.step = 3;
    k.elapsedSeconds = 10;
    const FrameReply whole{"held", 1'700'000'000'000'000, false, JobState::kRunning, kpi::encodeFrame(k), {}, 0, {}};
    std::string why;
    QVERIFY2(live.addFrame(whole, &why), why.c_str());
    QVERIFY(live.publish(whole.timeUnixUs, 0));
    JobEvent alert{"held", JobEventKind::kAlertFiring, whole.timeUnixUs, {}, {}, {}, "alert fired", "", {}};
    FrameReply held = whole;
    held.kpis.clear();
    held.events = {StreamMessage{1, "node-a", alert}};
    QVERIFY2(live.addFrame(held, &why), why.c_str());
    QCOMPARE(live.takeAlertEvents().size(), std::size_t{1});
    QVERIFY2(!live.publish(whole.timeUnixUs, 0), "nothing new to draw");
    QCOMPARE(live.published()->kpis.step, 3u);
    FrameReply another = held;
    another.timeUnixUs += 100'000;  // not the frame held, and without KPIs: refused
    QVERIFY(!live.addFrame(another, &why));
    QVERIFY2(why.find("not the one held") != std::string::npos, why.c_str());
  }

  // Frames come ten times a second; a device's points at most every kDevicePointSeconds.
  void aDevicesPointsComeAtMostTwiceASecond() {
    app::FrameSeries series(600, 300);
    kpi::JobKpis k;
    k.worldSize = 16;
    k.gpus.resize(1);
    k.gpus[0].node = "n1";
    k.gpus[0].utilizationPct = 50.0;
    for (int tenth = 0; tenth <= 10; ++tenth) {
      k.elapsedSeconds = 10 + tenth / 10.0;
      series.add(k);
    }
    QCOMPARE(series.view().gpuUtilization.at({"n1", 0}).size(), std::size_t{3});  // at 10, 10.5 and 11 s
  }

  // A job is watched one way for the app's life: decided at its first spec, whatever a later
  // attempt's nodes (an elastic restart without the lost ones).
  void aJobIsDecidedOnceAtItsFirstSpec() {
    app::FanInBook book(app::FanInRule{2});
    JobSpec wide = smallJob("wide", 3, 10);
    wide.ranks = {{0, "n1", 0, std::nullopt}, {1, "n2", 0, std::nullopt}, {2, "n3", 0, std::nullopt}};
    // A job without agents has no supervision to make its frames: it is never fanned in.
    QVERIFY(!app::FanInRule{2}.fannedIn(wide));
    wide.agents = {{"n1", "10.0.0.1:7070", "key-1"}, {"n2", "10.0.0.2:7070", "key-2"}};
    QVERIFY(!book.decided("wide").has_value());
    QVERIFY(book.decide(wide));
    JobSpec narrower = wide;
    narrower.attempt = 1;
    narrower.ranks.pop_back();
    QVERIFY(!app::FanInRule{2}.fannedIn(narrower));
    QVERIFY2(book.decide(narrower), "an attempt on fewer nodes is watched as the job was");
    QCOMPARE(book.decided("wide"), std::optional<bool>(true));
    JobSpec narrow = narrower;
    narrow.jobId = "narrow";
    QVERIFY(!book.decide(narrow));
  }
};

QTEST_MAIN(AppFanInTest)
#include "app_fan_in_test.moc"
