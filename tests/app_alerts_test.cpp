// Alerts in the app (Qt Test, offscreen; docs/alerts.md, docs/app.md): a real agent's job whose
// rule fires at once shows its banner, fills the Alerts panel, is silenced from the banner and
// resolves when the job stops; several alerts at once, closing, instant alerts and replays through
// the AlertLog; and the desktop notification over a private session D-Bus.

#include <QDockWidget>
#include <QProcess>
#include <QPushButton>
#include <QSignalSpy>
#include <QStandardPaths>
#include <QTableView>
#include <QtTest>

#ifdef LOCKSTEP_HAVE_QTDBUS
#include <QDBusConnection>
#endif

#include "AlertBanner.h"
#include "AlertLog.h"
#include "AlertsModel.h"
#include "AlertsPanel.h"
#include "DesktopNotifier.h"
#include "lockstep/alerts/alert.h"
#include "lockstep/common/clock.h"
#include "support/app_support.h"
#include "support/http_server.h"

using namespace lockstep;
using namespace lockstep::test;
using lockstep::app::AlertsModel;

namespace {

alerts::Alert alertOf(const std::string& job, const std::string& rule, const std::string& kpi, alerts::State state,
                      std::int64_t timeUs) {
  alerts::Alert a;
  a.jobId = job;
  a.rule = rule;
  a.kpi = kpi;
  a.state = state;
  a.value = 42.5;
  a.unit = "%";
  a.startedAtUs = timeUs - 1'000'000;
  a.timeUs = timeUs;
  a.ranks = {1};
  a.nodes = {"node-a"};
  a.cause = "data wait";
  a.text = "job " + job + ": " + rule + (state == alerts::State::kFiring ? " is firing: 42.5%" : " resolved: 3.0%");
  return a;
}

// The panel's rows as "state|rule" (every job).
QStringList rows(app::AlertsPanel* panel) {
  panel->refresh();
  QStringList out;
  auto* model = panel->model();
  for (int r = 0; r < model->rowCount(); ++r) {
    out << model->index(r, AlertsModel::kState).data().toString() + QLatin1Char('|') +
               model->index(r, AlertsModel::kRule).data().toString();
  }
  return out;
}

}  // namespace

#ifdef LOCKSTEP_HAVE_QTDBUS
// A notification server on a private bus: records what Notify was given.
class FakeNotifications : public QObject {
  Q_OBJECT
  Q_CLASSINFO("D-Bus Interface", "org.freedesktop.Notifications")
 public:
  QStringList summaries, bodies;
 public Q_SLOTS:
  uint Notify(const QString&, uint, const QString&, const QString& summary, const QString& body, const QStringList&,
              const QVariantMap&, int) {
    summaries << summary;
    bodies << body;
    return static_cast<uint>(summaries.size());
  }
};
#endif

class AppAlertsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    app::registerMetaTypes();
    qunsetenv("DBUS_SESSION_BUS_ADDRESS");  // no desktop's bus: notificationsNeedNoBus runs without one
  }

  // The real path: an agent runs a job whose rule holds at once (the loss is below a million);
  // its supervising agent fires the alert into the stream, and the app shows it.
  void aRealAlertShowsItsBannerIsSilencedAndResolvesWhenTheJobStops() {
    TempDir dir;
    HttpServer hook(HttpServer::Behaviour::kFail500);
    AgentProcess agent(dir, "node-a", {"--webhook-attempts", "1"});
    App app(dir);
    const QString problem = connectAuthorized(app, agent);
    QVERIFY2(problem.isEmpty(), qPrintable(problem));
    JobSpec spec = smallJob("alerting", 1, 100'000'000);
    spec.alertRules = {"loss < 1000000 -> notify"};
    spec.notify = {hook.url("/hooks/S3CRET")};
    const QString launched = launch(app, agent, spec, 1);
    QVERIFY2(launched.isEmpty(), qPrintable(launched));

    auto* banner = app.window.alertBanner();
    QTRY_VERIFY_WITH_TIMEOUT(banner->isVisibleTo(&app.window), kJobMs);
    QVERIFY2(banner->text().startsWith(QStringLiteral("job alerting: loss < 1000000 -> notify is firing: ")), qPrintable(banner->text()));
    auto* panel = app.window.alertsPanel();
    QCOMPARE(rows(panel).value(0), QStringLiteral("firing|loss < 1000000 -> notify"));
    QCOMPARE(panel->model()->index(0, AlertsModel::kJob).data().toString(), QStringLiteral("alerting"));
    QVERIFY(panel->model()->index(0, AlertsModel::kValue).data().toString() != QStringLiteral("–"));
    // The window is not the active one (offscreen, not shown): the desktop is told.
    QCOMPARE(app.window.notifier()->requested(), 1);
    QCOMPARE(app.window.notifier()->lastSummary(), QStringLiteral("Lockstep: job alerting"));

    // Show opens the panel at it.
    QVERIFY(!app.window.alertsDock()->isVisibleTo(&app.window));
    banner->findChild<QPushButton*>(QStringLiteral("alertBannerShow"))->click();
    QVERIFY(app.window.alertsDock()->isVisibleTo(&app.window));
    QCOMPARE(panel->model()->serial(panel->view()->currentIndex().row()), banner->shown());

    // Silence 1 h: no banner, and the panel says so; Unsilence brings it back.
    banner->findChild<QPushButton*>(QStringLiteral("alertBannerSilence"))->click();
    QVERIFY(!banner->isVisibleTo(&app.window));
    QVERIFY2(rows(panel).value(0).startsWith(QStringLiteral("firing, silenced until ")), qPrintable(rows(panel).join(QLatin1Char('\n'))));
    QVERIFY(app.store.alerts().silencedUntil("alerting", "loss < 1000000 -> notify").value_or(0) > unixMicrosNow() + 3500'000'000LL);
    panel->view()->setCurrentIndex(panel->model()->index(0, 0));
    auto* unsilence = panel->findChild<QPushButton*>(QStringLiteral("unsilenceRule"));
    QVERIFY(unsilence->isEnabled());
    unsilence->click();
    QVERIFY(banner->isVisibleTo(&app.window));
    QCOMPARE(rows(panel).value(0), QStringLiteral("firing|loss < 1000000 -> notify"));

    // The webhook answered 500: the panel lists it undelivered, its secret path redacted.
    QTRY_VERIFY_WITH_TIMEOUT(rows(panel).contains(QStringLiteral("undelivered|loss < 1000000 -> notify")), kJobMs);
    const auto undelivered = app.store.alerts().entries("alerting");
    const auto it = std::find_if(undelivered.begin(), undelivered.end(), [](const app::AlertEntry* e) {
      return e->status == app::AlertEntry::Status::kUndelivered;
    });
    QVERIFY(it != undelivered.end());
    QVERIFY2((*it)->message.find("HTTP 500") != std::string::npos, (*it)->message.c_str());
    QVERIFY2((*it)->message.find("S3CRET") == std::string::npos, (*it)->message.c_str());

    if (const QByteArray shots = qgetenv("LOCKSTEP_TEST_SCREENSHOTS"); !shots.isEmpty()) {
      app.window.applyDefaultLayout(QSize(1500, 950));
      app.window.show();
      app.window.resizeDocks({app.window.alertsDock()}, {230}, Qt::Vertical);
      app.window.refreshNow();
      QTest::qWait(1500);
      app.window.refreshNow();
      app.window.grab().save(QString::fromLocal8Bit(shots) + QStringLiteral("/alerts.png"));
    }

    // The job stops: the book resolves its alerts ("the job ended"), the banner goes.
    app.window.control().stopJob("alerting");
    // (The webhook refuses the resolved alert too: an undelivered row may come after it.)
    QTRY_VERIFY_WITH_TIMEOUT(rows(panel).contains(QStringLiteral("resolved|loss < 1000000 -> notify")), kJobMs);
    QVERIFY(!rows(panel).join(QLatin1Char('\n')).contains(QStringLiteral("firing")));
    QTRY_VERIFY_WITH_TIMEOUT(!banner->isVisibleTo(&app.window), kConnectMs);
    const auto entries = app.store.alerts().entries("alerting");
    const auto* resolved = *std::find_if(entries.begin(), entries.end(), [](const app::AlertEntry* e) {
      return e->status == app::AlertEntry::Status::kResolved;
    });
    QVERIFY2(resolved->message.find("resolved: the job ended") != std::string::npos, resolved->message.c_str());
    QTRY_VERIFY_WITH_TIMEOUT(processesOfJob("alerting").empty(), kJobMs);
  }

  // The banner shows the newest of several, "(+N more)"; × closes one; a resolved alert leaves;
  // an instant one shows "fired"; a replayed event is not counted twice; silences end.
  void severalAlertsAtOnce() {
    TempDir dir;
    App app(dir);
    auto& log = app.store.alerts();
    auto* banner = app.window.alertBanner();
    QVERIFY(!banner->isVisibleTo(&app.window));
    const std::int64_t now = unixMicrosNow();
    log.addEvent(alerts::alertEvent(alertOf("j1", "straggler_wait > 20%", "straggler_wait", alerts::State::kFiring, now - 3'000'000)));
    log.addEvent(alerts::alertEvent(alertOf("j1", "gpu_util < 30%", "gpu_util", alerts::State::kFiring, now - 2'000'000)));
    log.addEvent(alerts::alertEvent(alertOf("j2", "exposed_comm > 40%", "exposed_comm", alerts::State::kFiring, now - 1'000'000)));
    QVERIFY(banner->isVisibleTo(&app.window));
    QCOMPARE(banner->text(), QStringLiteral("job j2: exposed_comm > 40% is firing: 42.5% (+2 more)"));
    // A replay of the same event changes nothing.
    log.addEvent(alerts::alertEvent(alertOf("j2", "exposed_comm > 40%", "exposed_comm", alerts::State::kFiring, now - 1'000'000)));
    QCOMPARE(log.entries().size(), std::size_t{3});
    QCOMPARE(banner->text(), QStringLiteral("job j2: exposed_comm > 40% is firing: 42.5% (+2 more)"));

    banner->findChild<QPushButton*>(QStringLiteral("alertBannerClose"))->click();
    QCOMPARE(banner->text(), QStringLiteral("job j1: gpu_util < 30% is firing: 42.5% (+1 more)"));
    log.addEvent(alerts::alertEvent(alertOf("j1", "gpu_util < 30%", "gpu_util", alerts::State::kResolved, now)));
    QCOMPARE(banner->text(), QStringLiteral("job j1: straggler_wait > 20% is firing: 42.5%"));

    auto* panel = app.window.alertsPanel();
    // Firing first (newest first), then the others newest first; the closed one still fires.
    QCOMPARE(rows(panel), (QStringList{QStringLiteral("firing|exposed_comm > 40%"), QStringLiteral("firing|straggler_wait > 20%"),
                                       QStringLiteral("resolved|gpu_util < 30%")}));
    const int straggler = 1;
    QCOMPARE(panel->model()->index(straggler, AlertsModel::kAbout).data().toString(), QStringLiteral("rank 1 on node-a (data wait)"));
    QCOMPARE(panel->model()->index(straggler, AlertsModel::kValue).data().toString(), QStringLiteral("42.5%"));
    panel->setJobFilter(QStringLiteral("j2"));
    QCOMPARE(panel->model()->rowCount(), 1);
    panel->setJobFilter({});

    // An instant alert fires and never resolves: "fired", in the banner until closed.
    alerts::Alert failed = alertOf("j3", "failed -> notify", "failed", alerts::State::kFiring, now + 1'000'000);
    failed.value.reset();
    failed.text = "job j3: failed: rank 0 exited with 1";
    log.addEvent(alerts::alertEvent(failed));
    QCOMPARE(banner->text(), QStringLiteral("job j3: failed: rank 0 exited with 1 (+1 more)"));
    QVERIFY(rows(panel).contains(QStringLiteral("fired|failed -> notify")));

    // The panel's silence, for a second: it ends by itself.
    log.silence("j3", "failed -> notify", 1);
    QCOMPARE(banner->text(), QStringLiteral("job j1: straggler_wait > 20% is firing: 42.5%"));
    QTRY_COMPARE_WITH_TIMEOUT(banner->text(), QStringLiteral("job j3: failed: rank 0 exited with 1 (+1 more)"), 5000);
  }

  // A new alert tells the desktop unless it is silenced, or old (replayed to a late app).
  void notificationsNeedNoBus() {
    TempDir dir;
    App app(dir);
    auto& log = app.store.alerts();
    const std::int64_t now = unixMicrosNow();
    log.silence("j1", "loss > 5", 3600);
    log.addEvent(alerts::alertEvent(alertOf("j1", "loss > 5", "loss", alerts::State::kFiring, now)));
    log.addEvent(alerts::alertEvent(alertOf("j1", "eta > 1h", "eta", alerts::State::kFiring, now - 3600'000'000LL)));
    QCOMPARE(app.window.notifier()->requested(), 0);
    log.addEvent(alerts::alertEvent(alertOf("j1", "cost >= 40", "cost", alerts::State::kFiring, now)));
    QCOMPARE(app.window.notifier()->requested(), 1);
    QVERIFY(!app.window.notifier()->busAvailable());  // and nothing else happened: no bus, no dialog
    QCOMPARE(app.window.notifier()->sent(), 0);
  }

  // Over a real (private) session bus, to a notification server: Notify is called, and the GUI
  // thread did not wait for it.
  void aDesktopNotificationOverDBus() {
#ifndef LOCKSTEP_HAVE_QTDBUS
    QSKIP("built without Qt DBus");
#else
    const QString daemon = QStandardPaths::findExecutable(QStringLiteral("dbus-daemon"));
    if (daemon.isEmpty()) QSKIP("no dbus-daemon here (apt: dbus-daemon)");
    QProcess bus;
    bus.start(daemon, {QStringLiteral("--session"), QStringLiteral("--nofork"), QStringLiteral("--print-address")});
    QVERIFY(bus.waitForStarted());
    QTRY_VERIFY_WITH_TIMEOUT(bus.canReadLine(), 10000);
    const QString address = QString::fromUtf8(bus.readLine()).trimmed();
    QVERIFY2(!address.isEmpty(), "dbus-daemon printed no address");
    qputenv("DBUS_SESSION_BUS_ADDRESS", address.toUtf8());
    {
      QDBusConnection server = QDBusConnection::connectToBus(address, QStringLiteral("fake-notifications"));
      QVERIFY(server.isConnected());
      FakeNotifications fake;
      QVERIFY(server.registerObject(QStringLiteral("/org/freedesktop/Notifications"), &fake, QDBusConnection::ExportAllSlots));
      QVERIFY(server.registerService(QStringLiteral("org.freedesktop.Notifications")));
      TempDir dir;
      App app(dir);
      app.store.alerts().addEvent(
          alerts::alertEvent(alertOf("j9", "gpu_util < 30%", "gpu_util", alerts::State::kFiring, unixMicrosNow())));
      QCOMPARE(app.window.notifier()->sent(), 1);
      QVERIFY(fake.summaries.isEmpty());  // asynchronous: the server answers once the event loop runs
      QTRY_COMPARE_WITH_TIMEOUT(fake.summaries.size(), 1, 10000);
      QCOMPARE(fake.summaries[0], QStringLiteral("Lockstep: job j9"));
      QCOMPARE(fake.bodies[0], QStringLiteral("job j9: gpu_util &lt; 30% is firing: 42.5%"));
      server.unregisterService(QStringLiteral("org.freedesktop.Notifications"));
    }
    QDBusConnection::disconnectFromBus(QStringLiteral("fake-notifications"));
    qunsetenv("DBUS_SESSION_BUS_ADDRESS");
    bus.terminate();
    bus.waitForFinished(5000);
#endif
  }
};

QTEST_MAIN(AppAlertsTest)
#include "app_alerts_test.moc"
