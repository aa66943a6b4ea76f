// The app's cluster view (Qt Test, offscreen): each agent's GPUs with their readings, and the
// network under each node and under a job (issue 19), from real agents and the real ingest thread.

#include <QApplication>
#include <QRegularExpression>
#include <QScreen>
#include <QSignalSpy>
#include <QTableView>
#include <QtTest>
#include <algorithm>

#include "lockstep/client/launch.h"
#include "lockstep/common/clock.h"
#include "lockstep/kpi/network.h"
#include "lockstep/net/keys.h"
#include "HeatmapWidget.h"
#include "lockstep/report/report.h"
#include "support/app_support.h"

using namespace lockstep;
using namespace lockstep::test;

class AppClusterTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);  // window state goes to a test location
    app::registerMetaTypes();
  }

  void gpusOfAnAgentAreListedWithTheirReadings() {
    // The agent reads a stand-in NVML (tests/support/fake_nvml.c): 2 GPUs, the second without power.
    TempDir dir;
    AgentProcess agent(dir, "gpu-node", {"--nvml-library", LOCKSTEP_FAKE_NVML_PATH, "--sample-hz", "10"});
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    auto* gpus = app.window.findChild<QTableView*>(QStringLiteral("gpusView"))->model();
    QTRY_COMPARE_WITH_TIMEOUT(gpus->rowCount(), 2, kConnectMs);
    using Gpus = app::GpusModel;
    QCOMPARE(gpus->index(0, Gpus::kName).data().toString(), QStringLiteral("Fake GPU 0"));
    QTRY_COMPARE_WITH_TIMEOUT((app.window.refreshNow(), gpus->index(0, Gpus::kUtil).data().toString()), QStringLiteral("50"), kConnectMs);
    QCOMPARE(gpus->index(1, Gpus::kUtil).data().toString(), QStringLiteral("51"));
    QVERIFY2(gpus->index(0, Gpus::kPower).data().toString().endsWith(QStringLiteral("W")),
             qPrintable(gpus->index(0, Gpus::kPower).data().toString()));
    QCOMPARE(gpus->index(1, Gpus::kPower).data().toString(), QStringLiteral("–"));  // unknown, not 0 W
  }

  // Issue 19: a job on two nodes is held against the slower of their links, as the nodes' agents
  // stream their interfaces (through the real ingest thread); a job on one node against none.
  void aJobOnTwoNodesIsHeldAgainstTheSlowerLink() {
    TempDir dir;
    App app(dir);
    auto keys = loadOrCreateKeyPair(dir.file("sim"), "agent");
    QVERIFY(keys.ok());
    const std::int64_t now = unixMicrosNow();
    const std::vector<std::pair<std::string, std::optional<std::uint64_t>>> nodes = {
        {"link-a", 25'000'000'000ull}, {"link-b", 10'000'000'000ull}, {"link-c", std::nullopt}};
    for (std::size_t a = 0; a < nodes.size(); ++a) {
      const auto port = static_cast<std::uint16_t>(1 + a);
      app.store.addAgent({"127.0.0.1", port}, keys->publicKey);
      auto hello = std::make_shared<NodeHello>();
      hello->nodeName = nodes[a].first;
      app.store.onHello(QStringLiteral("127.0.0.1:%1").arg(port), hello);
      std::vector<StreamMessage> batch;
      for (int i = 0; i < 2; ++i) {
        NetSample n{nodes[a].first, "eth0", now + i * 1'000'000, 1000ull * i, 1000ull * i, 0, 0, 0u, 0u, 0u, 0u, nodes[a].second};
        batch.push_back({batch.size() + 1, nodes[a].first, n});
      }
      app.store.onMessages(QStringLiteral("127.0.0.1:%1").arg(port), std::make_shared<const std::vector<StreamMessage>>(std::move(batch)));
    }
    JobSpec spec = smallJob("two-nodes", 2, 10);
    spec.ranks = {{0, "link-a", 0, std::nullopt}, {1, "link-b", 0, std::nullopt}};
    QTRY_VERIFY_WITH_TIMEOUT(app.store.linkOf(spec).has_value(), kConnectMs);
    QCOMPARE(app.store.linkOf(spec)->bytesPerSecond, 10e9 / 8);
    QCOMPARE(QString::fromStdString(app.store.linkOf(spec)->what), QStringLiteral("the 10 Gb/s link of link-b"));
    // The dashboard's Communication tile lists each of the job's nodes' busiest interface.
    const auto network = app.store.networkOf(spec);
    QCOMPARE(network.size(), std::size_t{2});
    QCOMPARE(QString::fromStdString(network[0].first), QStringLiteral("link-a"));
    QCOMPARE(network[1].second.linkBitsPerSecond.value_or(0), 10'000'000'000ull);
    QCOMPARE(app::networkText(network[1].second), QStringLiteral("eth0 \u2193%1 \u2191%1 of 10 Gb/s (0.0%)")
                                                      .arg(QString::fromStdString(kpi::formatBitsPerSecond(8000))));
    spec.ranks[1].node = "link-a";
    QVERIFY2(!app.store.linkOf(spec), "one node: its ranks do not use the link");
    spec.ranks[1].node = "link-c";
    QTRY_VERIFY_WITH_TIMEOUT(!app.store.network(QStringLiteral("127.0.0.1:3")).empty(), kConnectMs);
    QVERIFY2(!app.store.linkOf(spec), "a node whose link speed is unknown: no reference, not a guess");
  }

  void theClusterViewShowsEachNodesNetworkAgainstItsLink() {
    // Real counters: the agent samples this machine's interfaces, all but loopback.
    const std::string dev = readText("/proc/net/dev");
    if (std::count(dev.begin(), dev.end(), ':') < 2) QSKIP("this machine has no network interface but loopback");
    TempDir dir;
    AgentProcess agent(dir, "net-node", {"--sample-hz", "10"});
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    auto* agents = app.window.findChild<QTableView*>(QStringLiteral("agentsView"))->model();
    const auto network = [&] {
      app.window.refreshNow();
      return agents->index(0, app::AgentsModel::kNetwork).data().toString();
    };
    QTRY_VERIFY_WITH_TIMEOUT(network().contains(QStringLiteral("\u2193")), kConnectMs);
    // "eth0 ↓1.20 kb/s ↑800 b/s of 10.0 Gb/s (0.0%)", or the speed unknown where the driver gives none.
    const QRegularExpression shape(QStringLiteral(
        "^\\S+ \u2193[0-9.]+ [kMGT]?b/s \u2191[0-9.]+ [kMGT]?b/s( of [0-9.]+ [kMGT]?b/s \\([0-9.]+%\\)|, link speed unknown)$"));
    QVERIFY2(shape.match(network()).hasMatch(), qPrintable(network()));
    QVERIFY(!agents->index(0, app::AgentsModel::kNetwork).data(Qt::ToolTipRole).toString().isEmpty());
  }

  // Issue 31: the cluster view's Network column reads whole in a window that fits the screen (the
  // default layout at 1280 px cut it to "eth0 ↓0 b/s ↑0 …"): it wraps instead of eliding.
  void theNetworkColumnReadsWholeInAWindowThatFitsTheScreen() {
    TempDir dir;
    App app(dir);
    auto keys = loadOrCreateKeyPair(dir.file("sim"), "agent");
    QVERIFY(keys.ok());
    app.store.addAgent({"127.0.0.1", 1}, keys->publicKey);
    auto hello = std::make_shared<NodeHello>();
    hello->nodeName = "gpu-node-07";
    app.store.onHello(QStringLiteral("127.0.0.1:1"), hello);
    const std::int64_t now = unixMicrosNow();
    std::vector<StreamMessage> batch;
    for (int i = 0; i < 2; ++i) {
      NetSample n{hello->nodeName, "enp1s0f0", now + i * 1'000'000, 1'200'000'000ull * i, 800'000'000ull * i, 0, 0, 0u, 0u, 0u, 0u,
                  25'000'000'000ull};
      batch.push_back({batch.size() + 1, hello->nodeName, n});
    }
    app.store.onMessages(QStringLiteral("127.0.0.1:1"), std::make_shared<const std::vector<StreamMessage>>(std::move(batch)));
    app.window.show();
    const QRect screen = app.window.screen()->availableGeometry();
    QVERIFY2(app.window.width() <= screen.width(), qPrintable(QStringLiteral("%1 px on a %2 px screen").arg(app.window.width()).arg(screen.width())));
    app.window.applyDefaultLayout(QSize(1280, 800));  // a laptop's screen, as on first start there
    QCOMPARE(app.window.width(), 1280);
    auto* view = app.window.findChild<QTableView*>(QStringLiteral("agentsView"));
    const auto cellText = [&] {
      app.window.refreshNow();
      return view->model()->index(0, app::AgentsModel::kNetwork).data().toString();
    };
    QTRY_VERIFY_WITH_TIMEOUT(cellText().contains(QStringLiteral(" of 25 Gb/s")), kConnectMs);
    QApplication::processEvents();
    const QModelIndex cell = view->model()->index(0, app::AgentsModel::kNetwork);
    const QString text = cell.data().toString();
    const QRect rect = view->visualRect(cell).adjusted(3, 0, -3, 0);  // the cell's text margins
    const QRect needed = view->fontMetrics().boundingRect(rect, Qt::TextWordWrap, text);
    QVERIFY2(needed.height() <= rect.height() && needed.width() <= rect.width() && needed.height() <= 3 * view->fontMetrics().lineSpacing(),
             qPrintable(QStringLiteral("\"%1\" needs %2 x %3 px, the cell has %4 x %5")
                            .arg(text).arg(needed.width()).arg(needed.height()).arg(rect.width()).arg(rect.height())));
  }

  // Issue 31: twelve nodes, added in any order, are listed as people read them (node2 before
  // node10) in the agents and GPU tables and in the job's heatmap, through the real ingest thread.
  void twelveNodesAreListedInNaturalOrder() {
    TempDir dir;
    App app(dir);
    auto keys = loadOrCreateKeyPair(dir.file("sim"), "agent");
    QVERIFY(keys.ok());
    JobSpec spec = smallJob("twelve", 12, 10);
    spec.ranks.clear();
    for (std::uint32_t i = 1; i <= 12; ++i) spec.ranks.push_back({i - 1, "node" + std::to_string(i), 0, 0u});
    const std::int64_t now = unixMicrosNow();
    for (const int i : {7, 12, 1, 10, 2, 11, 3, 9, 4, 8, 5, 6}) {
      const std::string node = "node" + std::to_string(i);
      const QString id = QStringLiteral("127.0.0.1:%1").arg(i);
      app.store.addAgent({"127.0.0.1", static_cast<std::uint16_t>(i)}, keys->publicKey);
      auto hello = std::make_shared<NodeHello>();
      hello->nodeName = node;
      hello->gpus = {GpuInfo{0, "Fake GPU", "GPU-" + node, 1ull << 30}};
      app.store.onHello(id, hello);
      JobStatus status;
      status.spec = spec;
      status.state = JobState::kRunning;
      app.store.onJobs(id, std::make_shared<const std::vector<JobStatus>>(std::vector{status}));
      GpuSample gpu;
      gpu.node = node;
      gpu.jobId = "twelve";
      gpu.timeUnixUs = now;
      gpu.utilizationPct = static_cast<float>(i);
      app.store.onMessages(id, std::make_shared<const std::vector<StreamMessage>>(std::vector{StreamMessage{1, node, gpu}}));
    }
    QStringList expected;
    for (int i = 1; i <= 12; ++i) expected << QStringLiteral("node%1").arg(i);
    const auto column = [&](QAbstractItemModel* model, int c) {
      app.window.refreshNow();
      QStringList out;
      for (int row = 0; row < model->rowCount(); ++row) out << model->index(row, c).data().toString();
      return out;
    };
    QCOMPARE(column(app.window.agentsModel(), app::AgentsModel::kNode), expected);
    auto* gpus = app.window.findChild<QTableView*>(QStringLiteral("gpusView"))->model();
    QCOMPARE(column(gpus, app::GpusModel::kNode), expected);
    app.window.dashboard()->showJob(QStringLiteral("twelve"));
    const auto* heatmap = app.window.dashboard()->heatmap();
    QTRY_COMPARE_WITH_TIMEOUT((app.window.refreshNow(), heatmap->rowCount()), 12, kConnectMs);
    QStringList rows;
    for (int row = 0; row < heatmap->rowCount(); ++row) rows << heatmap->rowLabel(row);
    QStringList expectedRows;
    for (const auto& node : expected) expectedRows << node + QStringLiteral(":0");
    QCOMPARE(rows, expectedRows);
  }

  // A job's state is its supervisor's verdict once its supervision ended: a user's stop ends the job
  // stopped though a part of a program of the user's own failed as its peer went.
  void aJobIsWhatItsSupervisorDecidedOverItsParts() {
    TempDir dir;
    App app(dir);
    auto keys = loadOrCreateKeyPair(dir.file("sim"), "agent");
    QVERIFY(keys.ok());
    const JobSpec spec = smallJob("verdict", 2, 10);
    const auto part = [&](std::uint16_t port, JobState state, Supervision supervision, std::uint32_t attempt = 0) {
      const QString id = QStringLiteral("127.0.0.1:%1").arg(port);
      app.store.addAgent({"127.0.0.1", port}, keys->publicKey);
      JobStatus status;
      status.spec = spec;
      status.spec.attempt = attempt;
      status.state = state;
      status.supervision = std::move(supervision);
      app.store.onJobs(id, std::make_shared<const std::vector<JobStatus>>(std::vector{status}));
    };
    part(1, JobState::kStopped, {SupervisionState::kFollowing, JobState::kRunning, "", {}});
    part(2, JobState::kFailed, {});
    QCOMPARE(app.store.job("verdict")->state, JobState::kFailed);  // the parts', until the supervisor decides
    QVERIFY(!app.store.job("verdict")->over);
    part(1, JobState::kStopped, {SupervisionState::kEnded, JobState::kStopped, "stopped on request", {}});
    QCOMPARE(app.store.job("verdict")->state, JobState::kStopped);
    QVERIFY(app.store.job("verdict")->over);

    // A restart left the supervising agent's node out: its part stays at the attempt before, and its
    // verdict still decides.
    part(1, JobState::kFailed, {SupervisionState::kRestarting, JobState::kRunning, "", {}});
    // While it restarts, it is shown so, and may be stopped (the jobs table, the dashboard).
    app.window.dashboard()->showJob(QStringLiteral("verdict"));
    app.window.refreshNow();
    QCOMPARE(app.window.jobsModel()->index(0, app::JobsModel::kState).data().toString(), QStringLiteral("restarting"));
    QCOMPARE(app.window.dashboard()->findChild<QLabel*>(QStringLiteral("jobState"))->text(), QStringLiteral("restarting"));
    QVERIFY(app.window.dashboard()->findChild<QPushButton*>(QStringLiteral("stopJob"))->isEnabled());
    const QString banner = app.window.dashboard()->findChild<QLabel*>(QStringLiteral("jobBanner"))->text();
    QVERIFY2(banner.startsWith(QStringLiteral("Restarting: ")), qPrintable(banner));
    part(2, JobState::kRunning, {}, 1);
    part(2, JobState::kFailed, {}, 1);
    QVERIFY(!app.store.job("verdict")->over);
    part(1, JobState::kFailed, {SupervisionState::kEnded, JobState::kStopped, "stopped on request", {}});
    QCOMPARE(app.store.job("verdict")->state, JobState::kStopped);
    QVERIFY(app.store.job("verdict")->over);
  }

  // The history keeps one job per id: the launcher does not give a new job the id of one it holds
  // (from an earlier session of the app, or lockstepctl), and says which job holds it.
  void theLauncherRefusesAnIdTheHistoryHolds() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    const std::string path = dir.file("history.db");
    {
      auto h = history::History::open(path);
      QVERIFY(h);
      JobStatus held;
      held.spec = smallJob("held", 1, 5);
      held.state = JobState::kFinished;
      held.startedUnixUs = unixMicrosNow();
      QVERIFY(h->recordJob("node-a", held));
    }
    App app(dir, path);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    const auto refused = app.store.place(smallJob("held", 1, 5), {{idOf(agent), 1}});
    QVERIFY(!refused);
    QCOMPARE(refused.error().code, ErrorCode::kAlreadyExists);
    QVERIFY2(refused.error().message.find("job id held names a job in the history already (it started") != std::string::npos,
             refused.error().message.c_str());
    QVERIFY2(refused.error().message.find("(the History window's Delete…)") != std::string::npos, refused.error().message.c_str());
    QVERIFY(app.store.place(smallJob("new", 1, 5), {{idOf(agent), 1}}));
  }

  // Issue 46: the GPU table takes new samples only for the nodes that sent them, and says only
  // their rows changed (in runs of adjacent rows); an agent saying hello re-reads the table, and
  // the samples it held follow their rows.
  void theGpuTableUpdatesOnlyTheNodesThatReported() {
    TempDir dir;
    App app(dir);
    auto keys = loadOrCreateKeyPair(dir.file("sim"), "agent");
    QVERIFY(keys.ok());
    const auto hello = [&](int i) {
      app.store.addAgent({"127.0.0.1", static_cast<std::uint16_t>(i)}, keys->publicKey);
      auto h = std::make_shared<NodeHello>();
      h->nodeName = "node" + std::to_string(i);
      h->gpus = {GpuInfo{0, "Fake GPU", h->nodeName + "-0", 1ull << 30}, GpuInfo{1, "Fake GPU", h->nodeName + "-1", 1ull << 30}};
      app.store.onHello(QStringLiteral("127.0.0.1:%1").arg(i), h);
    };
    const auto sample = [&](int i, std::uint32_t gpu, float util) {
      const std::string node = "node" + std::to_string(i);
      GpuSample s;
      s.node = node;
      s.gpuIndex = gpu;
      s.timeUnixUs = unixMicrosNow();
      s.utilizationPct = util;
      QSignalSpy published(&app.store, &ClusterStore::gpusChanged);
      app.store.onMessages(QStringLiteral("127.0.0.1:%1").arg(i), std::make_shared<const std::vector<StreamMessage>>(std::vector{StreamMessage{1, node, s}}));
      QVERIFY(published.wait(kConnectMs));
    };
    for (int i = 1; i <= 3; ++i) hello(i);
    app.window.refreshNow();
    auto* gpus = app.window.findChild<QTableView*>(QStringLiteral("gpusView"))->model();
    const auto utils = [&] {
      QStringList out;
      for (int row = 0; row < gpus->rowCount(); ++row) out << gpus->index(row, app::GpusModel::kUtil).data().toString();
      return out.join(QLatin1Char(' '));
    };
    QCOMPARE(utils(), QStringLiteral("– – – – – –"));
    QSignalSpy changed(gpus, &QAbstractItemModel::dataChanged);
    QSignalSpy reset(gpus, &QAbstractItemModel::modelReset);
    const auto rowsChanged = [&] {
      QStringList out;
      for (const auto& args : changed) out << QStringLiteral("%1-%2").arg(args[0].toModelIndex().row()).arg(args[1].toModelIndex().row());
      changed.clear();
      return out.join(QLatin1Char(' '));
    };
    sample(2, 1, 42);
    app.window.refreshNow();
    QCOMPARE(utils(), QStringLiteral("– – – 42 – –"));
    QCOMPARE(rowsChanged(), QStringLiteral("2-3"));  // node2's rows only
    sample(1, 0, 10);
    sample(3, 0, 30);
    app.window.refreshNow();
    QCOMPARE(utils(), QStringLiteral("10 – – 42 30 –"));
    QCOMPARE(rowsChanged(), QStringLiteral("0-1 4-5"));  // not node2's, which sent nothing new
    app.window.refreshNow();
    QCOMPARE(rowsChanged(), QString());  // nothing came: nothing changed
    QCOMPARE(reset.count(), 0);
    hello(0);  // node0 comes first: every row moves down two
    app.window.refreshNow();
    QCOMPARE(reset.count(), 1);
    QCOMPARE(utils(), QStringLiteral("– – 10 – – 42 30 –"));
    sample(3, 1, 31);
    app.window.refreshNow();
    QCOMPARE(utils(), QStringLiteral("– – 10 – – 42 30 31"));
    QCOMPARE(rowsChanged(), QStringLiteral("6-7"));
  }

  // Issue 46: an agent's state change repaints its row, not the table; and one that keeps failing
  // the same way (nothing listens at its port) is announced once, not on every retry.
  void anAgentsStateChangeRepaintsItsRowOnly() {
    TempDir dir;
    App app(dir);
    auto keys = loadOrCreateKeyPair(dir.file("sim"), "agent");
    QVERIFY(keys.ok());
    const std::uint16_t free = freePort();
    for (std::uint16_t p = free; p < free + 3; ++p) app.store.addAgent({"127.0.0.1", p}, keys->publicKey);
    app.window.refreshNow();
    AgentsModel* model = app.window.agentsModel();
    QCOMPARE(model->rowCount(), 3);
    QSignalSpy changed(model, &QAbstractItemModel::dataChanged);
    QSignalSpy reset(model, &QAbstractItemModel::modelReset);
    QSignalSpy announced(&app.store, &ClusterStore::agentChanged);
    for (std::uint16_t p = free; p < free + 3; ++p) {
      const QString id = QStringLiteral("127.0.0.1:%1").arg(p);
      QTRY_COMPARE_WITH_TIMEOUT(app.window.agentsModel()->index(app.store.agentRow(id), AgentsModel::kState).data().toString(),
                                QStringLiteral("reconnecting"), kConnectMs);
    }
    QTRY_VERIFY(!changed.isEmpty());
    QCOMPARE(reset.count(), 0);
    for (const auto& args : changed) QCOMPARE(args[0].toModelIndex().row(), args[1].toModelIndex().row());
    QCOMPARE(announced.count(), 3);
    QTest::qWait(7000);  // each agent's next try (5 s without an answer, then its backoff) fails as the first did
    QCOMPARE(announced.count(), 3);
  }

  // Issue 31: a job's network survives a restart of the app and comes back from the history into
  // its report. The agent lives in a network namespace whose one interface (a veth) carries the
  // app's traffic to it; the job is started by another client and outlives the first app.
  void aJobsNetworkSurvivesARestartOfTheAppAndComesBackInItsReport() {
    TempDir dir;
    NamespacedLink link(dir);
    if (!link.made) QSKIP(qPrintable("network namespaces cannot be made here (they need root): " + QString::fromStdString(link.why)));
    AgentProcess agent(dir, "node-n", {"--sample-hz", "10"}, {link.nsAddress, link.ns});
    const std::string path = dir.file("history.db");
    ClientKeys client(dir);
    agent.authorize(client.keys.publicKey);
    auto connection = connectTo(agent, client);
    QVERIFY(connection);
    std::int64_t before = 0;
    {
      App app(dir, path);
      const QString problem = connectAuthorized(app, agent);
      QVERIFY2(problem.isEmpty(), qPrintable(problem));
      auto placed = placeJob({connection.get()}, {1}, smallJob("net-restart", 1, 4000000), std::chrono::seconds(10));
      QVERIFY(placed);
      QVERIFY(launchJob({connection.get()}, *placed, std::chrono::seconds(10)));
      QTRY_VERIFY_WITH_TIMEOUT(sqlCount(path, "SELECT count(*) FROM net_samples WHERE node = 'node-n'") >= 10, kJobMs);
    }
    before = sqlCount(path, "SELECT count(*) FROM net_samples WHERE node = 'node-n'");
    const std::int64_t lastBefore = sqlCount(path, "SELECT max(time_us) FROM net_samples");
    const std::int64_t firstBefore = sqlCount(path, "SELECT min(time_us) FROM net_samples WHERE interface LIKE 'lsw%'");
    App app(dir, path);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QTRY_VERIFY_WITH_TIMEOUT(sqlCount(path, "SELECT max(time_us) FROM net_samples") > lastBefore + 1'000'000, kJobMs);
    QVERIFY(connection->stopJob("net-restart", 0, std::chrono::seconds(20)));
    QTRY_VERIFY_WITH_TIMEOUT(recordedJob(path, "net-restart") && recordedJob(path, "net-restart")->finalKpis, kJobMs);
    QVERIFY(sqlCount(path, "SELECT count(*) FROM net_samples WHERE node = 'node-n'") > before);

    auto history = history::History::open(path);
    QVERIFY(history);
    auto data = report::load(*history, "net-restart", unixMicrosNow());
    QVERIFY2(data, data ? "" : data.error().message.c_str());
    QCOMPARE(data->network.size(), std::size_t{1});
    QCOMPARE(QString::fromStdString(data->network[0].node), QStringLiteral("node-n"));
    QVERIFY(!data->network[0].interfaces.empty());
    const auto& eth = data->network[0].interfaces[0];
    QVERIFY2(eth.interface.rfind("lsw", 0) == 0, eth.interface.c_str());
    QVERIFY2(eth.rxBytes + eth.txBytes > 0, "the app's own traffic crossed it");
    // The report's interface covers, without a gap, the time from the first sample the first app
    // kept to beyond the second app's first second.
    const double across = static_cast<double>(lastBefore + 1'000'000 - firstBefore) / 1e6;
    QVERIFY2(eth.seconds >= across, qPrintable(QStringLiteral("%1 s covered, %2 s expected").arg(eth.seconds).arg(across)));
  }
};

QTEST_MAIN(AppClusterTest)
#include "app_cluster_test.moc"
