// The desktop app against real agents and real trainers (Qt Test, offscreen): connecting, the
// launcher, a live dashboard fed by real step reports, stopping, and the agent states a user sees
// when keys are wrong or an agent goes away.

#include <QAction>
#include <QApplication>
#include <QChart>
#include <QAbstractBarSeries>
#include <QBarSet>
#include <QChartView>
#include <QCheckBox>
#include <tuple>
#include <QComboBox>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QSignalSpy>
#include <QSpinBox>
#include <QStandardItemModel>
#include <QStandardPaths>
#include <QTableView>
#include <QTimer>
#include <QtTest>
#include <algorithm>
#include <memory>

#include <QSvgWidget>
#include <sqlite3.h>
#include <signal.h>
#include <sys/wait.h>

#include <QTableWidget>

#include <functional>

#include "ClusterStore.h"
#include "JobControl.h"
#include "DashboardWidget.h"
#include "HeatmapWidget.h"
#include "HistoryRecorder.h"
#include "HistoryWindow.h"
#include "LauncherDialog.h"
#include "MainWindow.h"
#include "Models.h"
#include "StacksDialog.h"
#include "lockstep/client/launch.h"
#include "lockstep/common/clock.h"
#include "lockstep/history/history.h"
#include "lockstep/net/keys.h"
#include "StacksDialog.h"
#include "support/app_support.h"

using namespace lockstep;
using namespace lockstep::test;
using lockstep::app::AgentsModel;
using lockstep::app::ClusterStore;
using lockstep::app::JobControl;
using lockstep::app::LauncherDialog;
using lockstep::app::MainWindow;


class AppTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);  // window state goes to a test location
    app::registerMetaTypes();
  }

  // The whole path a user takes: connect, fill the launcher, Start, watch, stop, see the end.
  void launchWatchAndStopAJob() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));

    // The launcher through the window, as Ctrl+N opens it: fill it in while it runs modally.
    QSignalSpy launched(&app.window.control(), &JobControl::launchFinished);
    const QString fillError = startFromLauncher(app, [&](LauncherDialog& dialog) {
      dialog.setField(QStringLiteral("jobId"), QStringLiteral("gui-job"));
      dialog.setField(QStringLiteral("layers"), QStringLiteral("32,64,10"));
      dialog.setField(QStringLiteral("samples"), QStringLiteral("4096"));
      dialog.setField(QStringLiteral("batchPerRank"), 32);
      dialog.setField(QStringLiteral("duration"), 1000000);  // runs until stopped
      dialog.setField(QStringLiteral("priceCoreHour"), QStringLiteral("0.05"));
      dialog.setField(QStringLiteral("ranks:") + idOf(agent), 2);
      return QString();
    });
    QVERIFY2(fillError.isEmpty(), qPrintable(fillError));
    QTRY_COMPARE_WITH_TIMEOUT(launched.count(), 1, kJobMs);
    QVERIFY2(launched.at(0).at(1).toBool(), qPrintable(launched.at(0).at(2).toString()));
    QCOMPARE(launched.at(0).at(0).toString(), QStringLiteral("gui-job"));

    // The new job is selected and its dashboard fills from the ranks' real step reports.
    QTRY_COMPARE_WITH_TIMEOUT(app.window.dashboard()->jobId(), QStringLiteral("gui-job"), kConnectMs);
    QTRY_COMPARE_WITH_TIMEOUT(app.dashboardLabel("jobState"), QStringLiteral("running"), kJobMs);
    const QString none = QStringLiteral("–");
    QTRY_VERIFY_WITH_TIMEOUT(app.tile(QStringLiteral("Throughput")) != none, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(app.tile(QStringLiteral("Loss")) != none, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(app.tile(QStringLiteral("Communication")) != none, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(app.tile(QStringLiteral("Cost")) != none, kJobMs);
    // What waiting on communication cost, beside the total (issue 19).
    const app::KpiTile* cost = app.window.dashboard()->tile(QStringLiteral("Cost"));
    QTRY_VERIFY_WITH_TIMEOUT(cost->detail().contains(QStringLiteral("waiting ")), kJobMs);
    QVERIFY2(cost->toolTip().contains(QStringLiteral("% of step time")), qPrintable(cost->toolTip()));
    // The network under the job, where this machine has an interface besides loopback.
    const std::string dev = readText("/proc/net/dev");
    if (std::count(dev.begin(), dev.end(), ':') >= 2) {
      const app::KpiTile* comm = app.window.dashboard()->tile(QStringLiteral("Communication"));
      QTRY_VERIFY_WITH_TIMEOUT(comm->toolTip().contains(QStringLiteral("Network of the job's nodes:\n")), kJobMs);
      QVERIFY2(comm->toolTip().contains(QStringLiteral("\u2193")), qPrintable(comm->toolTip()));
    }
    QTRY_VERIFY_WITH_TIMEOUT(app.points(QStringLiteral("throughput")) >= 2, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(app.points(QStringLiteral("loss")) >= 2, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(app.points(QStringLiteral("split")) >= 2, kJobMs);
    QTRY_COMPARE_WITH_TIMEOUT(app.points(QStringLiteral("comm")), 2, kJobMs);  // one bar per rank
    // Throughput is a number of samples per second, loss a finite number.
    bool ok = false;
    QVERIFY(QLocale().toDouble(app.tile(QStringLiteral("Throughput")), &ok) > 0 && ok);
    const double loss = app.tile(QStringLiteral("Loss")).toDouble(&ok);
    QVERIFY(ok && std::isfinite(loss) && loss > 0);
    // The agent's job list, polled every second, comes without the spec once this app holds it
    // (issue 46): the store keeps the whole spec all the same.
    const app::AgentEntry* listed = app.store.agent(idOf(agent));
    QVERIFY(listed);
    QTRY_VERIFY_WITH_TIMEOUT(listed->jobs.size() == 1 && listed->jobs[0].specOmitted, kJobMs);
    const app::JobEntry* entry = app.store.job("gui-job");
    QVERIFY(entry);
    QCOMPARE(entry->spec.ranks.size(), std::size_t{2});
    QCOMPARE(entry->spec.layers, (std::vector<std::uint32_t>{32, 64, 10}));
    QCOMPARE(entry->nodes, (std::vector<std::string>{"node-a"}));
    // GPU utilization is unknown for CPU ranks, not 0; their MFU is against the agent's CPU peak.
    QCOMPARE(app.tile(QStringLiteral("GPU utilization")), none);
    QTRY_VERIFY_WITH_TIMEOUT(app.tile(QStringLiteral("MFU")).endsWith(QStringLiteral("%")), kJobMs);
    const app::KpiTile* mfu = app.window.dashboard()->tile(QStringLiteral("MFU"));
    QVERIFY2(mfu->detail().contains(QStringLiteral("GFLOP/s peak")), qPrintable(mfu->detail()));
    QVERIFY2(mfu->toolTip().startsWith(QStringLiteral("FLOPs: declared by the program; peak: ")), qPrintable(mfu->toolTip()));
    QCOMPARE(app.dashboardLabel("jobBanner"), QString());
    auto* stopAction = app.window.findChild<QAction*>(QStringLiteral("stopJobAction"));
    QVERIFY(stopAction && stopAction->isEnabled());

    // Stop from the dashboard; the ranks go and the job's end is shown plainly.
    QSignalSpy stopped(&app.window.control(), &JobControl::stopFinished);
    app.window.dashboard()->findChild<QPushButton*>(QStringLiteral("stopJob"))->click();
    QTRY_COMPARE_WITH_TIMEOUT(stopped.count(), 1, kJobMs);
    QVERIFY2(stopped.at(0).at(1).toBool(), qPrintable(stopped.at(0).at(2).toString()));
    QTRY_COMPARE_WITH_TIMEOUT(app.dashboardLabel("jobState"), QStringLiteral("stopped"), kJobMs);
    QVERIFY2(app.dashboardLabel("jobBanner").startsWith(QStringLiteral("Stopped after")), qPrintable(app.dashboardLabel("jobBanner")));
    // An ended job's throughput is its mean over the job.
    QVERIFY(QLocale().toDouble(app.tile(QStringLiteral("Throughput")), &ok) > 0 && ok);
    QTRY_VERIFY_WITH_TIMEOUT(processesOfJob("gui-job").empty(), kJobMs);
    QVERIFY(!app.window.dashboard()->findChild<QPushButton*>(QStringLiteral("stopJob"))->isEnabled());
    QVERIFY(!stopAction->isEnabled());

    // The system switching to a dark palette turns the charts dark too.
    const QPalette light = QApplication::palette();
    QPalette dark = light;  // roughly what a desktop's dark theme sets
    dark.setColor(QPalette::Window, QColor(32, 32, 32));
    dark.setColor(QPalette::WindowText, QColor(230, 230, 230));
    dark.setColor(QPalette::Base, QColor(24, 24, 24));
    dark.setColor(QPalette::AlternateBase, QColor(44, 44, 44));
    dark.setColor(QPalette::Text, QColor(230, 230, 230));
    dark.setColor(QPalette::Button, QColor(48, 48, 48));
    dark.setColor(QPalette::ButtonText, QColor(230, 230, 230));
    dark.setColor(QPalette::PlaceholderText, QColor(150, 150, 150));
    QApplication::setPalette(dark);
    const auto views = app.window.dashboard()->findChildren<QChartView*>();
    QVERIFY(!views.isEmpty());
    const auto allCharts = [&](QChart::ChartTheme theme) {
      return std::all_of(views.begin(), views.end(), [&](QChartView* v) { return v->chart()->theme() == theme; });
    };
    QTRY_VERIFY_WITH_TIMEOUT(allCharts(QChart::ChartThemeDark), 5000);  // palette changes arrive as events
    app.window.refreshNow();
    if (const QByteArray shots = qgetenv("LOCKSTEP_TEST_SCREENSHOTS"); !shots.isEmpty()) {
      app.window.grab().save(QString::fromLocal8Bit(shots) + QStringLiteral("/dashboard-dark.png"));
    }
    QApplication::setPalette(light);
    QTRY_VERIFY_WITH_TIMEOUT(allCharts(QChart::ChartThemeLight), 5000);
  }

  // Issue 13: "Your program" in the launcher runs a PyTorch DDP script, and its reports fill the
  // same dashboard.
  void launchYourOwnProgramAndWatchItsReports() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    const QString script = QStringLiteral(LOCKSTEP_SOURCE_DIR "/tests/programs/ddp_mlp.py");
    QSignalSpy launched(&app.window.control(), &JobControl::launchFinished);
    const QString fillError = startFromLauncher(app, [&](LauncherDialog& dialog) {
      dialog.setField(QStringLiteral("kind"), 1);
      dialog.setField(QStringLiteral("jobId"), QStringLiteral("gui-own"));
      dialog.setField(QStringLiteral("program"), QStringLiteral("/usr/bin/python3"));
      dialog.setField(QStringLiteral("ranks:") + idOf(agent), 2);
      dialog.setField(QStringLiteral("workingDir"), QStringLiteral("relative/dir"));
      if (dialog.job() || !dialog.error().contains(QStringLiteral("is relative"))) {
        return QStringLiteral("a relative working directory was not refused: ") + dialog.error();
      }
      dialog.setField(QStringLiteral("workingDir"), QString::fromStdString(dir.path().string()));
      dialog.setField(QStringLiteral("arguments"), script + QStringLiteral(" --instrument --steps 100000 --sleep-ms 5"));
      dialog.setField(QStringLiteral("environment"), QStringLiteral("PYTHONUNBUFFERED=1"));
      return QString();
    });
    QVERIFY2(fillError.isEmpty(), qPrintable(fillError));
    QTRY_COMPARE_WITH_TIMEOUT(launched.count(), 1, kJobMs);
    QVERIFY2(launched.at(0).at(1).toBool(), qPrintable(launched.at(0).at(2).toString()));
    QTRY_COMPARE_WITH_TIMEOUT(app.window.dashboard()->jobId(), QStringLiteral("gui-own"), kConnectMs);
    const QString none = QStringLiteral("–");
    QTRY_VERIFY_WITH_TIMEOUT(app.tile(QStringLiteral("Throughput")) != none, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(app.tile(QStringLiteral("Loss")) != none, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(app.tile(QStringLiteral("Communication")) != none, kJobMs);
    QTRY_COMPARE_WITH_TIMEOUT(app.points(QStringLiteral("comm")), 2, kJobMs);  // exposed comm. of both ranks
    QTRY_VERIFY_WITH_TIMEOUT(app.points(QStringLiteral("split")) >= 2, kJobMs);
    if (const QByteArray shots = qgetenv("LOCKSTEP_TEST_SCREENSHOTS"); !shots.isEmpty()) {
      app.window.grab().save(QString::fromLocal8Bit(shots) + QStringLiteral("/dashboard-own-program.png"));
    }
    QSignalSpy stopped(&app.window.control(), &JobControl::stopFinished);
    app.window.dashboard()->findChild<QPushButton*>(QStringLiteral("stopJob"))->click();
    QTRY_COMPARE_WITH_TIMEOUT(stopped.count(), 1, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(processesOfJob("gui-own").empty(), kJobMs);
  }

  void invalidLauncherInputIsRefusedWithItsMessage() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));

    LauncherDialog dialog(app.store, &app.window);
    auto* start = dialog.findChild<QPushButton*>(QStringLiteral("start"));
    QVERIFY2(dialog.job(), qPrintable(dialog.error()));  // the defaults are a valid job
    QVERIFY(start->isEnabled());

    dialog.setField(QStringLiteral("layers"), QStringLiteral("32,six,10"));
    QVERIFY(!dialog.job());
    QVERIFY(!start->isEnabled());
    QVERIFY2(dialog.error().contains(QStringLiteral("'six' is not a whole number")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("layers"), QStringLiteral("32,64,10"));
    QVERIFY2(dialog.job(), qPrintable(dialog.error()));

    dialog.setField(QStringLiteral("lr"), QStringLiteral("fast"));
    QVERIFY2(dialog.error().contains(QStringLiteral("learning rate")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("lr"), QStringLiteral("-1"));
    QVERIFY(!dialog.job());
    QVERIFY2(dialog.error().contains(QStringLiteral("lr")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("lr"), QStringLiteral("0.05"));
    QVERIFY2(dialog.job(), qPrintable(dialog.error()));

    // Alert rules, webhooks and a budget (docs/alerts.md): checked in the form, carried in the job.
    dialog.setField(QStringLiteral("alerts"), QStringLiteral("gpu_util < x for 10m"));
    QVERIFY(!dialog.job());
    QVERIFY2(dialog.error().contains(QStringLiteral("at position 12")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("alerts"), QStringLiteral("exposed_comm > 40% for 2m; loss is nan -> notify,stop"));
    dialog.setField(QStringLiteral("notify"), QStringLiteral("ftp://hooks.example.org/x"));
    QVERIFY(!dialog.job());
    QVERIFY2(dialog.error().contains(QStringLiteral("not http:// or https://")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("notify"), QStringLiteral("https://hooks.example.org/x"));
    dialog.setField(QStringLiteral("budget"), QStringLiteral("25"));
    const auto alerting = dialog.job();
    QVERIFY2(alerting, qPrintable(dialog.error()));
    QCOMPARE(alerting->alertRules, (std::vector<std::string>{"exposed_comm > 40% for 2m", "loss is nan -> notify,stop"}));
    QCOMPARE(alerting->notify, std::vector<std::string>{"https://hooks.example.org/x"});
    QCOMPARE(alerting->budget.value_or(0), 25.0);
    dialog.setField(QStringLiteral("alerts"), QString());
    dialog.setField(QStringLiteral("notify"), QString());
    dialog.setField(QStringLiteral("budget"), QString());

    // What each rank may take (docs/fences.md): a size it cannot read is refused; the node's free
    // cores and memory are shown beside it.
    dialog.setField(QStringLiteral("memPerRank"), QStringLiteral("lots"));
    QVERIFY(!dialog.job());
    QVERIFY2(dialog.error().contains(QStringLiteral("'lots' is not a size")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("memPerRank"), QStringLiteral("256M"));
    dialog.setField(QStringLiteral("cpusPerRank"), 1);
    dialog.setField(QStringLiteral("processesPerRank"), 64);
    const auto fenced = dialog.job();
    QVERIFY2(fenced, qPrintable(dialog.error()));
    QCOMPARE(fenced->memPerRank, std::uint64_t{256} << 20);
    QCOMPARE(fenced->cpusPerRank, 1u);
    QCOMPARE(fenced->maxProcessesPerRank, 64u);
    const auto* agents = dialog.findChild<QTableWidget*>(QStringLiteral("agents"));
    QVERIFY(agents->item(0, 4)->text().endsWith(QStringLiteral("GiB")));
    QVERIFY(agents->item(0, 4)->data(Qt::UserRole).toUInt() >= 1);
    dialog.setField(QStringLiteral("memPerRank"), QString());

    dialog.setField(QStringLiteral("ranks:") + idOf(agent), 0);
    QVERIFY(!dialog.job());
    QVERIFY2(dialog.error().contains(QStringLiteral("rank")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("ranks:") + idOf(agent), 2);

    dialog.setField(QStringLiteral("npy"), true);
    dialog.setField(QStringLiteral("features"), QStringLiteral("/no/such/features.npy"));
    dialog.setField(QStringLiteral("labels"), QStringLiteral(""));
    QVERIFY(!dialog.job());
    QVERIFY2(!dialog.error().isEmpty(), "an empty labels path must be refused");
    QVERIFY(!start->isEnabled());
  }

  // Issue 45: the launcher offers the data-parallel kinds, each with a line on what it trades; the
  // CPU-only kinds are not offered for GPU ranks, and none is for the user's own program.
  void theLauncherOffersTheDataParallelKindsWithTheirTrades() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));

    LauncherDialog dialog(app.store, &app.window);
    auto* kinds = dialog.findChild<QComboBox*>(QStringLiteral("dataParallel"));
    auto* trade = dialog.findChild<QLabel*>(QStringLiteral("dataParallelTrade"));
    auto* staleness = dialog.findChild<QSpinBox*>(QStringLiteral("staleness"));
    QVERIFY(kinds && trade && staleness);
    QCOMPARE(kinds->count(), 6);
    const auto picked = [&](int kind) {
      dialog.setField(QStringLiteral("dataParallel"), kind);
      return dialog.job();
    };
    QStringList trades;
    const auto allReduce = picked(0);  // the default
    QVERIFY2(allReduce, qPrintable(dialog.error()));
    QCOMPARE(allReduce->sync, Sync::kAllReduce);
    QCOMPARE(allReduce->shard, Shard::kNone);
    QCOMPARE(allReduce->staleness, 0u);
    QVERIFY2(trade->text().contains(QStringLiteral("slowest rank")), qPrintable(trade->text()));
    trades << trade->text();

    const auto sharded = picked(1);
    QVERIFY2(sharded, qPrintable(dialog.error()));
    QCOMPARE(sharded->sync, Sync::kAllReduce);
    QCOMPARE(sharded->shard, Shard::kOptimizer);
    QVERIFY2(trade->text().contains(QStringLiteral("1/N of the optimizer state")), qPrintable(trade->text()));
    trades << trade->text();
    for (const auto& [index, shard, says] : {std::tuple{2, Shard::kGradients, "1/N of the gradients"},
                                             std::tuple{3, Shard::kParameters, "1/N of everything"}}) {
      const auto stage = picked(index);
      QVERIFY2(stage, qPrintable(dialog.error()));
      QCOMPARE(stage->shard, shard);
      QVERIFY2(trade->text().contains(QString::fromUtf8(says)), qPrintable(trade->text()));
      trades << trade->text();
    }

    const auto serverSync = picked(4);
    QVERIFY2(serverSync, qPrintable(dialog.error()));
    QCOMPARE(serverSync->sync, Sync::kParameterServer);
    QCOMPARE(serverSync->shard, Shard::kNone);
    QCOMPARE(serverSync->staleness, 0u);
    QVERIFY(staleness->isHidden());
    QVERIFY2(trade->text().contains(QStringLiteral("master model")), qPrintable(trade->text()));
    trades << trade->text();
    // Split over ranks: no more parts than the two ranks the form asks for.
    auto* psRanks = dialog.findChild<QSpinBox*>(QStringLiteral("psRanks"));
    QVERIFY(psRanks && !psRanks->isHidden());
    dialog.setField(QStringLiteral("psRanks"), 2);
    QVERIFY2(dialog.job(), qPrintable(dialog.error()));
    QCOMPARE(dialog.job()->psRanks, 2u);
    dialog.setField(QStringLiteral("psRanks"), 3);
    QVERIFY(!dialog.job());
    QVERIFY2(dialog.error().contains(QStringLiteral("--ps-ranks 3 with 2 ranks")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("psRanks"), 1);

    // Asynchronous: K is ranks - 1 unless the user says otherwise, and never less than the trainer takes.
    const auto serverAsync = picked(5);
    QVERIFY2(serverAsync, qPrintable(dialog.error()));
    QCOMPARE(serverAsync->sync, Sync::kParameterServer);
    QCOMPARE(serverAsync->staleness, 1u);  // two ranks
    QVERIFY(!staleness->isHidden());
    QVERIFY2(trade->text().contains(QStringLiteral("stale gradients")), qPrintable(trade->text()));
    trades << trade->text();
    trades.removeDuplicates();
    QCOMPARE(trades.size(), 6);
    QVERIFY(!dialog.findChild<QCheckBox*>(QStringLiteral("balanceDynamic"))->isEnabled());
    dialog.setField(QStringLiteral("ranks:") + idOf(agent), 3);
    QVERIFY2(dialog.job(), qPrintable(dialog.error()));
    QCOMPARE(dialog.job()->staleness, 2u);
    dialog.setField(QStringLiteral("staleness"), 1);
    QVERIFY(!dialog.job());
    QVERIFY2(dialog.error().contains(QStringLiteral("at least 2")), qPrintable(dialog.error()));
    dialog.setField(QStringLiteral("staleness"), 5);
    QVERIFY2(dialog.job(), qPrintable(dialog.error()));
    QCOMPARE(dialog.job()->staleness, 5u);
    if (const QByteArray shots = qgetenv("LOCKSTEP_TEST_SCREENSHOTS"); !shots.isEmpty()) {
      dialog.show();
      dialog.grab().save(QString::fromLocal8Bit(shots) + QStringLiteral("/launcher-parallel.png"));
    }

    // The user's own program does its own data parallelism: the choice is off and not in the job.
    dialog.setField(QStringLiteral("kind"), 1);
    QVERIFY(!kinds->isEnabled());
    QVERIFY2(kinds->toolTip().contains(QStringLiteral("Your program")), qPrintable(kinds->toolTip()));
    QVERIFY2(dialog.job(), qPrintable(dialog.error()));
    QCOMPARE(dialog.job()->sync, Sync::kAllReduce);
    QCOMPARE(dialog.job()->staleness, 0u);
    dialog.setField(QStringLiteral("kind"), 0);
    QVERIFY(kinds->isEnabled());

    // GPU ranks run every kind (ZeRO 1 to 3 and the parameter server): each is offered, and this
    // node having no GPU is the form's only complaint about it.
    dialog.setField(QStringLiteral("backend"), 1);
    const auto* items = qobject_cast<QStandardItemModel*>(kinds->model());
    QVERIFY2(!kinds->toolTip().contains(QStringLiteral("only")), qPrintable(kinds->toolTip()));
    for (int kind : {1, 2, 3, 4}) {
      QVERIFY2(items->item(kind)->isEnabled(), qPrintable(items->item(kind)->text()));
      dialog.setField(QStringLiteral("dataParallel"), kind);
      QCOMPARE(kinds->currentIndex(), kind);
      QVERIFY2(!trade->text().contains(QStringLiteral("only")), qPrintable(trade->text()));
      QVERIFY2(dialog.error().startsWith(QStringLiteral("node node-a has 0 free GPU(s)")), qPrintable(dialog.error()));
    }
    dialog.setField(QStringLiteral("dataParallel"), 0);
    dialog.setField(QStringLiteral("backend"), 0);
  }

  void anAgentThatRefusesTheAppsKeyIsShownAsNotAuthorized() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");  // the app's key is never authorized
    App app(dir);
    const QString problem = addAgent(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    QTRY_COMPARE_WITH_TIMEOUT(app.stateOf(idOf(agent)), QStringLiteral("not authorized"), kConnectMs);
  }

  void anAgentWithAnotherKeyIsShownAsWrongKey() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    AgentProcess other(dir, "node-b");
    App app(dir);
    agent.authorize(app.keys.keys.publicKey);
    // Pin node-b's key for node-a's address: whoever answers there is not who we pinned.
    auto added = app.window.addAgent(idOf(agent), QString::fromStdString(other.publicKey()));
    QVERIFY(added);
    QTRY_VERIFY_WITH_TIMEOUT(app.stateOf(idOf(agent)).startsWith(QStringLiteral("refused: wrong agent key")), kConnectMs);
  }

  void aKilledAgentShowsReconnectingAndRecovers() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));

    // A finished job stays in the jobs list across the outage, and is not duplicated by the replay.
    QSignalSpy launched(&app.window.control(), &JobControl::launchFinished);
    auto placed = app.store.place(smallJob("before-outage", 2, 30), {{idOf(agent), 2}});
    QVERIFY2(placed, placed ? "" : placed.error().message.c_str());
    app.window.control().launch(*placed);
    QTRY_COMPARE_WITH_TIMEOUT(launched.count(), 1, kJobMs);
    QVERIFY(launched.at(0).at(1).toBool());
    QTRY_COMPARE_WITH_TIMEOUT(app.dashboardLabel("jobState"), QStringLiteral("finished"), kJobMs);
    const QString banner = app.dashboardLabel("jobBanner");
    QVERIFY2(banner.startsWith(QStringLiteral("Finished: 30 of 30 steps")), qPrintable(banner));

    agent.kill();
    QTRY_COMPARE_WITH_TIMEOUT(app.stateOf(idOf(agent)), QStringLiteral("reconnecting"), kConnectMs);
    agent.restart();
    QTRY_COMPARE_WITH_TIMEOUT(app.stateOf(idOf(agent)), QStringLiteral("connected"), kConnectMs);
    app.window.refreshNow();
    QCOMPARE(app.window.jobsModel()->rowCount(), 1);
    QCOMPARE(app.dashboardLabel("jobBanner"), banner);
    QCOMPARE(app.points(QStringLiteral("loss")), 30);
  }

  // Issue 14: a partition is not a crash: no reset, only silence. The agent lives in a network
  // namespace joined to the app's by a veth pair whose far end goes down, then up again.
  void aPartitionedAgentShowsReconnectingAndRecovers() {
    TempDir dir;
    NamespacedLink link(dir);
    if (!link.made) QSKIP(qPrintable("network namespaces cannot be made here (they need root): " + QString::fromStdString(link.why)));
    AgentProcess agent(dir, "node-p", {}, {link.nsAddress, link.ns});
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    link.set(false);
    QTRY_COMPARE_WITH_TIMEOUT(app.stateOf(idOf(agent)), QStringLiteral("reconnecting"), kConnectMs);
    link.set(true);
    QTRY_COMPARE_WITH_TIMEOUT(app.stateOf(idOf(agent)), QStringLiteral("connected"), kConnectMs);
  }

  // Issue 5: what the app saw is in the history; the History window searches, opens a job's
  // dashboard as it was, compares, exports and deletes.
  void historyRecordsOpensComparesExportsAndDeletes() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    const std::string path = dir.file("history.db");
    App app(dir, path);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    for (const auto& [id, ranks] : {std::pair{"rec-2", 2u}, std::pair{"rec-1", 1u}}) {
      JobSpec spec = smallJob(id, ranks, 40);
      spec.name = "scaling";
      const QString launched = launch(app, agent, spec, ranks);
      QVERIFY2(launched.isEmpty(), qPrintable(launched));
      QTRY_VERIFY_WITH_TIMEOUT(recordedJob(path, id) && recordedJob(path, id)->finalKpis, kJobMs);
      QCOMPARE(recordedJob(path, id)->stepReports, 40u * ranks);  // every step of every rank
    }
    const auto twoRanks = *recordedJob(path, "rec-2");
    QCOMPARE(twoRanks.state, JobState::kFinished);
    QCOMPARE(twoRanks.finalKpis->step, 40u);
    QVERIFY(twoRanks.finalKpis->samplesPerSecond && *twoRanks.finalKpis->samplesPerSecond > 0);

    app::HistoryWindow* history = app.window.showHistory();
    QVERIFY(history);
    history->setConfirmDeletes(false);
    app::HistoryModel* model = history->model();
    QTRY_COMPARE_WITH_TIMEOUT(model->rowCount(), 2, kConnectMs);
    QCOMPARE(model->index(0, app::HistoryModel::kJob).data().toString(), QStringLiteral("rec-1"));  // newest first
    QCOMPARE(model->index(1, app::HistoryModel::kState).data().toString(), QStringLiteral("finished"));
    QCOMPARE(model->index(1, app::HistoryModel::kNodes).data().toString(), QStringLiteral("node-a"));
    QCOMPARE(model->index(1, app::HistoryModel::kGpuUtil).data().toString(), QStringLiteral("–"));
    history->setSearch(QStringLiteral("REC-2"));
    QCOMPARE(model->rowCount(), 1);
    history->setSearch(QString());
    history->setStateFilter(JobState::kFailed);
    QCOMPARE(model->rowCount(), 0);
    history->setStateFilter(std::nullopt);
    QCOMPARE(model->rowCount(), 2);

    // Open: the dashboard as it was, from the history alone.
    history->select({QStringLiteral("rec-2")});
    auto* opened = qobject_cast<app::RecordedJobWindow*>(history->openSelected());
    QVERIFY(opened);
    app::DashboardWidget* dashboard = opened->dashboard();
    QVERIFY(dashboard->showsRecorded());
    QVERIFY(dashboard->tile(QStringLiteral("Throughput"))->value() != QStringLiteral("–"));
    QVERIFY(dashboard->tile(QStringLiteral("Loss"))->value() != QStringLiteral("–"));
    QCOMPARE(dashboard->chartPointCount(QStringLiteral("loss")), 40);
    QCOMPARE(dashboard->chartPointCount(QStringLiteral("comm")), 2);
    auto* stop = dashboard->findChild<QPushButton*>(QStringLiteral("stopJob"));
    QVERIFY(stop && !stop->isVisibleTo(dashboard));
    const QString banner = dashboard->findChild<QLabel*>(QStringLiteral("jobBanner"))->text();
    QVERIFY2(banner.startsWith(QStringLiteral("Finished: 40 of 40 steps")), qPrintable(banner));
    if (const QByteArray shots = qgetenv("LOCKSTEP_TEST_SCREENSHOTS"); !shots.isEmpty()) {
      history->grab().save(QString::fromLocal8Bit(shots) + QStringLiteral("/history.png"));
      opened->grab().save(QString::fromLocal8Bit(shots) + QStringLiteral("/recorded.png"));
    }

    // Compare: the same workload at 1 and 2 ranks makes a scaling chart.
    history->select({QStringLiteral("rec-1"), QStringLiteral("rec-2")});
    auto* compare = qobject_cast<app::CompareDialog*>(history->compareSelected());
    QVERIFY(compare);
    QVERIFY(compare->comparison().throughput && compare->comparison().efficiency);
    QCOMPARE(compare->comparison().throughput->series.at(0).points.size(), 2u);
    QVERIFY(compare->findChild<QSvgWidget*>(QStringLiteral("chart-scaling")));
    QCOMPARE(compare->findChild<QTableWidget*>(QStringLiteral("compareTable"))->columnCount(), 3);
    if (const QByteArray shots = qgetenv("LOCKSTEP_TEST_SCREENSHOTS"); !shots.isEmpty()) {
      compare->grab().save(QString::fromLocal8Bit(shots) + QStringLiteral("/compare.png"));
    }

    // Export, as File > Export and the History view do once the file is chosen.
    auto h = history::History::open(path);
    QVERIFY(h);
    for (const char* name : {"rec-2.pdf", "rec-2.html", "rec-2.json", "rec-2.csv"}) {
      auto written = app::exportReport(*h, "rec-2", dir.file(name));
      QVERIFY2(written, written ? "" : written.error().message.c_str());
      QVERIFY(std::filesystem::file_size(dir.file(name)) > 0);
    }
    QVERIFY(std::filesystem::exists(dir.file("rec-2-gpus.csv")));
    QVERIFY(!app::exportReport(*h, "rec-2", dir.file("rec-2.docx")));

    // Delete: gone from the view and the file.
    history->select({QStringLiteral("rec-1")});
    history->deleteSelected();
    QCOMPARE(model->rowCount(), 1);
    QVERIFY(!recordedJob(path, "rec-1"));
    QCOMPARE(sqlCount(path, "SELECT count(*) FROM steps WHERE job_id = 'rec-1'"), 0);
  }

  // Issue 5: kill -9 the app while a job trains; start it again: the history holds everything it
  // had committed, and the agent's replay fills in the rest: every step of every rank, once.
  void aKilledAppLosesNoRecordedSteps() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    const std::string config = dir.file("app-config");
    const std::string path = dir.file("history.db");
    const Env env = {{"QT_QPA_PLATFORM", "offscreen"}, {"LOCKSTEP_HISTORY", path}};
    auto key = runProcess({LOCKSTEP_APP_PATH, "--config-dir", config, "--print-key"}, env, dir);
    QCOMPARE(key.status.exitCode, 0);
    agent.authorize(key.out.substr(0, key.out.find('\n')));
    auto known = KnownAgents::load(config + "/known_agents");
    QVERIFY(known && known->trust(agent.address().text(), agent.publicKey()));

    // A job long enough to kill the app in its middle, started by another client.
    ClientKeys client(dir);
    agent.authorize(client.keys.publicKey);
    auto connection = connectTo(agent, client);
    QVERIFY(connection);
    constexpr std::uint64_t kSteps = 6000;
    auto placed = placeJob({connection.get()}, {2}, smallJob("crash", 2, kSteps), std::chrono::seconds(10));
    QVERIFY(placed);
    QVERIFY(launchJob({connection.get()}, *placed, std::chrono::seconds(10)));

    const auto startApp = [&] {
      return startProcess({LOCKSTEP_APP_PATH, "--config-dir", config}, env, dir.file("app.out"), dir.file("app.err"));
    };
    const auto steps = [&] { return sqlCount(path, "SELECT count(*) FROM steps WHERE job_id = 'crash'"); };
    pid_t app = startApp();
    QTRY_VERIFY_WITH_TIMEOUT(steps() >= 200, kJobMs);
    ::kill(app, SIGKILL);
    int status = 0;
    ::waitpid(app, &status, 0);
    const std::int64_t before = steps();
    QVERIFY2(before < 2 * static_cast<std::int64_t>(kSteps), "the job should still be running at the kill");
    QCOMPARE(sqlCount(path, "SELECT count(*) FROM pragma_integrity_check WHERE integrity_check = 'ok'"), 1);

    app = startApp();
    // Within QtTest's 300 s for the whole function, so that a failure says what it saw.
    const auto seen = [&] {
      const auto job = recordedJob(path, "crash");
      return QStringLiteral("%1 steps recorded, job %2; app stderr: %3")
          .arg(steps())
          .arg(job ? QString::fromStdString(std::string(jobStateName(job->state))) : QStringLiteral("not recorded"))
          .arg(QString::fromStdString(readText(dir.file("app.err"))).right(2000));
    };
    QTRY_VERIFY2_WITH_TIMEOUT(recordedJob(path, "crash") && recordedJob(path, "crash")->finalKpis, qPrintable(seen()),
                              2 * kJobMs);
    ::kill(app, SIGTERM);
    ::waitpid(app, &status, 0);
    const auto job = *recordedJob(path, "crash");
    QCOMPARE(job.state, JobState::kFinished);
    QCOMPARE(job.stepReports, 2 * kSteps);
    QCOMPARE(steps(), static_cast<std::int64_t>(2 * kSteps));
    QCOMPARE(sqlCount(path, "SELECT count(DISTINCT rank || '/' || step) FROM steps WHERE job_id = 'crash'"),
             static_cast<std::int64_t>(2 * kSteps));
    QCOMPARE(job.finalKpis->step, kSteps);
  }

  // Issue 7: a job the app launched with max_restarts loses a rank; the app restarts it from its
  // last checkpoint with the ranks left, and it finishes.
  void theAppRestartsAJobThatLostARank() {
    TempDir dir;
    AgentProcess a(dir, "node-a");
    AgentProcess b(dir, "node-b");
    App app(dir);
    for (const auto* agent : {&a, &b}) {
      const QString problem = connectAuthorized(app, *agent);
      QVERIFY2(problem.isEmpty(), qPrintable(problem));
    }
    JobSpec spec = smallJob("app-elastic", 3, 20000);
    spec.checkpointDir = dir.file("ckpt");
    spec.checkpointEvery = 50;
    spec.maxRestarts = 1;
    QSignalSpy restarted(&app.window.control(), &JobControl::jobRestarted);
    QSignalSpy refused(&app.window.control(), &JobControl::restartRefused);
    QSignalSpy launched(&app.window.control(), &JobControl::launchFinished);
    auto placed = app.store.place(spec, {{idOf(a), 2}, {idOf(b), 1}});
    QVERIFY2(placed, placed ? "" : placed.error().message.c_str());
    app.window.control().launch(*placed);
    QTRY_COMPARE_WITH_TIMEOUT(launched.count(), 1, kJobMs);
    QVERIFY2(launched.at(0).at(1).toBool(), qPrintable(launched.at(0).at(2).toString()));
    QTRY_VERIFY_WITH_TIMEOUT(hasCheckpointFrom(dir.file("ckpt"), 100), kJobMs);
    pid_t victim = -1;
    for (pid_t pid : processesOfJob("app-elastic")) {
      if (environOf(pid, "RANK") == "1") victim = pid;
    }
    QVERIFY(victim > 0);
    ::kill(victim, SIGKILL);
    QTRY_COMPARE_WITH_TIMEOUT(restarted.count() + refused.count(), 1, kJobMs);
    QVERIFY2(refused.isEmpty(), qPrintable(refused.isEmpty() ? QString() : refused.at(0).at(1).toString()));
    const QString message = restarted.at(0).at(1).toString();
    QVERIFY2(message.contains(QStringLiteral("killed by signal 9")) &&
                 message.contains(QStringLiteral("restart 1 of 1 with 2 ranks")),
             qPrintable(message));
    QTRY_VERIFY_WITH_TIMEOUT(app.store.job("app-elastic") && app.store.job("app-elastic")->state == JobState::kFinished,
                             3 * kJobMs);
    const app::JobEntry* job = app.store.job("app-elastic");
    QCOMPARE(job->spec.attempt, 1u);
    QCOMPARE(job->spec.worldSize, 2u);
    QTRY_COMPARE_WITH_TIMEOUT(job->live->published()->kpis.attempts, 2u, kJobMs);
    app.window.selectJob(QStringLiteral("app-elastic"));
    QVERIFY2(app.dashboardLabel("jobBanner").contains(QStringLiteral("1 restart")), qPrintable(app.dashboardLabel("jobBanner")));
  }

  // Issue 32: a stalled job says so in its row and its dashboard, naming the rank.
  void aStalledJobSaysWhichRankInItsRowAndBanner() {
    TempDir dir;
    AgentProcess agent(dir, "node-a");
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    JobSpec spec = smallJob("app-stall", 2, 10'000'000);
    spec.stallAfterS = 2;
    QSignalSpy launched(&app.window.control(), &JobControl::launchFinished);
    auto placed = app.store.place(spec, {{idOf(agent), 2}});
    QVERIFY2(placed, placed ? "" : placed.error().message.c_str());
    app.window.control().launch(*placed);
    QTRY_COMPARE_WITH_TIMEOUT(launched.count(), 1, kJobMs);
    QTRY_VERIFY_WITH_TIMEOUT(app.points(QStringLiteral("loss")) > 5, kJobMs);
    pid_t victim = -1;
    for (pid_t pid : processesOfJob("app-stall")) {
      if (environOf(pid, "RANK") == "1") victim = pid;
    }
    QVERIFY(victim > 0);
    ::kill(victim, SIGSTOP);
    const auto stateText = [&] {
      app.window.refreshNow();
      return app.window.jobsModel()->index(0, app::JobsModel::kState).data().toString();
    };
    QTRY_VERIFY_WITH_TIMEOUT(stateText().startsWith(QStringLiteral("stalled")), 30'000);
    app.window.selectJob(QStringLiteral("app-stall"));
    QTRY_VERIFY_WITH_TIMEOUT(app.dashboardLabel("jobBanner").startsWith(QStringLiteral("Stalled")), 5'000);
    const QString banner = app.dashboardLabel("jobBanner");
    // Each rank's stacks, one click away.
    app.window.dashboard()->showStacks();
    auto* stacks = app.window.findChild<app::StacksDialog*>(QStringLiteral("stacksDialog"));
    QVERIFY(stacks);
    QTRY_VERIFY_WITH_TIMEOUT(stacks->done(), 60'000);
    const QString shown = stacks->text();
    if (qEnvironmentVariableIsSet("LOCKSTEP_GRAB")) {
      app.window.grab().save(QStringLiteral("/tmp/stall-window.png"));
      stacks->grab().save(QStringLiteral("/tmp/stall-stacks.png"));
    }
    stacks->close();
    ::kill(victim, SIGCONT);
    QVERIFY2(shown.contains(QStringLiteral("rank 0 (pid")) && shown.contains(QStringLiteral("rank 1 (pid")), qPrintable(shown));
    QVERIFY2(shown.contains(QStringLiteral("T (stopped by a signal)")), qPrintable(shown));
    QVERIFY2(banner.contains(QStringLiteral("rank 1")) && banner.contains(QStringLiteral("stopped by a signal")),
             qPrintable(banner));
    QTRY_VERIFY_WITH_TIMEOUT(stateText() == QStringLiteral("running"), 30'000);
    QSignalSpy stopped(&app.window.control(), &JobControl::stopFinished);
    app.window.control().stopJob("app-stall");
    QTRY_COMPARE_WITH_TIMEOUT(stopped.count(), 1, kJobMs);
  }

  // Issue 16: a job of 320 ranks on 40 nodes (fed as the bench feeds the store: no agents) made
  // the title list every node, and the window grew to fit it.
  void aJobOnManyNodesKeepsTheWindowAtItsSize() {
    TempDir dir;
    App app(dir);
    auto keys = loadOrCreateKeyPair(dir.file("sim"), "agent");
    QVERIFY(keys.ok());
    constexpr int kNodes = 40, kRanksPerNode = 8;
    JobSpec spec = smallJob("wide", kNodes * kRanksPerNode, 1000);
    for (std::uint32_t r = 0; r < spec.worldSize; ++r) {
      spec.ranks.push_back({r, "gpu-node-" + std::to_string(r / kRanksPerNode) + ".cluster.example.org", r % kRanksPerNode,
                            std::nullopt});
    }
    for (int a = 0; a < kNodes; ++a) {
      const QString id = QStringLiteral("127.0.0.1:%1").arg(1 + a);
      app.store.addAgent({"127.0.0.1", static_cast<std::uint16_t>(1 + a)}, keys->publicKey);
      auto hello = std::make_shared<NodeHello>();
      hello->nodeName = "gpu-node-" + std::to_string(a) + ".cluster.example.org";
      app.store.onHello(id, hello);
      JobStatus status;
      status.spec = spec;
      status.state = JobState::kRunning;
      for (int g = 0; g < kRanksPerNode; ++g) {
        RankStatus rank;
        rank.rank = static_cast<std::uint32_t>(a * kRanksPerNode + g);
        status.ranks.push_back(rank);
      }
      app.store.onJobs(id, std::make_shared<const std::vector<JobStatus>>(std::vector<JobStatus>{status}));
    }
    app.window.resize(1200, 800);
    app.window.show();
    app.window.selectJob(QStringLiteral("wide"));
    app.window.refreshNow();
    QCoreApplication::processEvents();
    const QString title = app.dashboardLabel("jobTitle");
    QVERIFY2(title.contains(QStringLiteral("320 ranks on 40 nodes")), qPrintable(title));
    QVERIFY2(title.size() < 200, qPrintable(title));
    QVERIFY2(app.window.width() <= 1200, qPrintable(QStringLiteral("the window grew to %1 px").arg(app.window.width())));

    // Then it streams: 20 steps of every rank (rank 77 computes 30% longer) and a GPU sample each.
    const std::int64_t now = unixMicrosNow();
    for (int a = 0; a < kNodes; ++a) {
      std::vector<StreamMessage> batch;
      const std::string node = "gpu-node-" + std::to_string(a) + ".cluster.example.org";
      for (std::uint64_t step = 1; step <= 20; ++step) {
        for (int g = 0; g < kRanksPerNode; ++g) {
          StepReport r;
          r.jobId = "wide";
          r.rank = static_cast<std::uint32_t>(a * kRanksPerNode + g);
          r.worldSize = spec.worldSize;
          r.step = step;
          r.samples = 64;
          r.loss = 2.0f;
          r.dataTimeUs = 1000;
          r.computeTimeUs = r.rank == 77 ? 13000 : 10000 + 10 * g;
          r.exposedCommTimeUs = 500 + r.rank;  // the higher ranks wait longer
          r.stepTimeUs = *r.dataTimeUs + *r.computeTimeUs + *r.exposedCommTimeUs;
          r.timeUnixUs = now - static_cast<std::int64_t>(20 - step) * 100'000;
          batch.push_back({batch.size() + 1, node, r});
        }
      }
      for (int g = 0; g < kRanksPerNode; ++g) {
        GpuSample gs;
        gs.node = node;
        gs.gpuIndex = static_cast<std::uint32_t>(g);
        gs.timeUnixUs = now;
        gs.jobId = "wide";
        gs.utilizationPct = 80;
        batch.push_back({batch.size() + 1, node, gs});
      }
      app.store.onMessages(QStringLiteral("127.0.0.1:%1").arg(1 + a),
                           std::make_shared<const std::vector<StreamMessage>>(std::move(batch)));
    }
    // The ingest thread folds the messages in and works the KPIs out while this, the GUI thread,
    // handles no events at all.
    QDeadlineTimer deadline(kConnectMs);
    // Every node's batch, not only the first's: that one alone reaches step 20.
    const auto allIn = [&] {
      const auto& live = *app.store.job("wide")->live;
      return live.published()->kpis.ranks.size() == 320 && live.published()->kpis.step == 20 &&
             live.read([](const kpi::JobTracker& t) { return t.gpuUtilizationSeries().size(); }) == 320;
    };
    while (!allIn() && !deadline.hasExpired()) QThread::msleep(10);
    QVERIFY(allIn());
    app.window.refreshNow();
    QTRY_VERIFY2_WITH_TIMEOUT(app.tile(QStringLiteral("Slowest rank")).contains(QStringLiteral("rank 77")),
                              qPrintable(app.tile(QStringLiteral("Slowest rank"))), kConnectMs);
    const QString slowest = app.window.dashboard()->tile(QStringLiteral("Slowest rank"))->toolTip();
    QVERIFY2(slowest.contains(QStringLiteral("rank 77 on gpu-node-9.cluster.example.org: +")) &&
                 slowest.contains(QStringLiteral("compute")),
             qPrintable(slowest));
    // The heatmap keeps rows readable and scrolls through them; only what is in view is drawn.
    auto* heatmap = app.window.dashboard()->findChild<app::HeatmapWidget*>();
    QVERIFY(heatmap);
    QCOMPARE(heatmap->rowCount(), 320);
    QVERIFY2(heatmap->visibleRowCount() > 0 && heatmap->visibleRowCount() < 320,
             qPrintable(QString::number(heatmap->visibleRowCount())));
    heatmap->scrollToRow(100);
    QCOMPARE(heatmap->firstVisibleRow(), 100);
    // One node's GPUs, by the filter over the GPU table and the heatmap.
    auto* filter = app.window.findChild<QLineEdit*>(QStringLiteral("nodeFilter"));
    QVERIFY(filter);
    filter->setText(QStringLiteral("GPU-NODE-9."));
    app.window.refreshNow();
    QCOMPARE(heatmap->rowCount(), kRanksPerNode);
    QCOMPARE(heatmap->firstVisibleRow(), 0);
    filter->clear();
    app.window.refreshNow();
    QCOMPARE(heatmap->rowCount(), 320);
    // The communication chart shows the 32 ranks that wait longest, not 320 bars.
    QChart* comm = nullptr;
    for (auto* view : app.window.dashboard()->findChildren<QChartView*>()) {
      if (view->chart()->title().startsWith(QStringLiteral("Exposed comm"))) comm = view->chart();
    }
    QVERIFY(comm);
    QVERIFY2(comm->title().contains(QStringLiteral("32 highest of 320")), qPrintable(comm->title()));
    auto* bars = qobject_cast<QAbstractBarSeries*>(comm->series().value(0));
    QVERIFY(bars && bars->barSets().size() == 1);
    QCOMPARE(bars->barSets()[0]->count(), 32);
    QVERIFY(app.window.width() <= 1200);
  }

  // Issue 16: the recorder writes a transaction per 50 ms, not one per agent's batch (128 agents'
  // were more than it could write); what it holds when it closes is written, not lost.
  void theRecorderWritesEveryMessageOfManyAgents() {
    TempDir dir;
    const std::string path = dir.file("history.db");
    constexpr int kAgents = 128, kSteps = 5;
    JobSpec spec = smallJob("many", kAgents, 100);
    for (std::uint32_t r = 0; r < spec.worldSize; ++r) spec.ranks.push_back({r, "node-" + std::to_string(r), 0, std::nullopt});
    {
      app::HistoryRecorder recorder(QString::fromStdString(path));
      QSignalSpy opened(&recorder, &app::HistoryRecorder::opened);
      recorder.start();
      QTRY_COMPARE_WITH_TIMEOUT(opened.count(), 1, kConnectMs);
      QVERIFY(opened.at(0).at(0).toBool());
      for (int a = 0; a < kAgents; ++a) {
        const QString id = QStringLiteral("127.0.0.1:%1").arg(1 + a);
        auto hello = std::make_shared<NodeHello>();
        hello->nodeName = "node-" + std::to_string(a);
        JobStatus status;
        status.spec = spec;
        status.state = JobState::kRunning;
        auto jobs = std::make_shared<const std::vector<JobStatus>>(std::vector<JobStatus>{status});
        std::vector<StreamMessage> batch;
        for (std::uint64_t step = 1; step <= kSteps; ++step) {
          StepReport r;
          r.jobId = "many";
          r.rank = static_cast<std::uint32_t>(a);
          r.worldSize = spec.worldSize;
          r.step = step;
          r.samples = 64;
          r.timeUnixUs = unixMicrosNow();
          batch.push_back({step, hello->nodeName, r});
        }
        auto messages = std::make_shared<const std::vector<StreamMessage>>(std::move(batch));
        QMetaObject::invokeMethod(&recorder, [&recorder, id, hello, jobs, messages] {
          recorder.onHello(id, hello);
          recorder.onJobs(id, jobs);
          recorder.onMessages(id, messages);
        });
      }
    }  // closed at once, with messages pending
    QCOMPARE(sqlCount(path, "SELECT count(*) FROM steps WHERE job_id = 'many'"), static_cast<std::int64_t>(kAgents * kSteps));
  }
};

QTEST_MAIN(AppTest)
#include "app_test.moc"
