// lockstep: the desktop app.

#include <QApplication>
#include <QCommandLineParser>
#include <QTimer>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "ClusterStore.h"
#include "HistoryRecorder.h"
#include "MainWindow.h"
#include "lockstep/common/files.h"
#include "lockstep/net/keys.h"

int main(int argc, char** argv) {
  lockstep::raiseOpenFilesLimit();  // a connection per agent, thousands at 16,384 GPUs
  // Key printing needs no display: handle it before Qt wants one.
  QString configDir = QString::fromStdString(lockstep::defaultClientConfigDir());
  for (int i = 1; i + 1 < argc; ++i) {
    if (QString::fromUtf8(argv[i]) == QLatin1String("--config-dir")) configDir = QString::fromUtf8(argv[i + 1]);
  }
  for (int i = 1; i < argc; ++i) {
    if (QString::fromUtf8(argv[i]) == QLatin1String("--print-key")) {
      auto keys = lockstep::loadOrCreateKeyPair(configDir.toStdString(), "app");
      if (!keys) {
        std::fprintf(stderr, "lockstep: error: %s\n", keys.error().message.c_str());
        return 1;
      }
      std::printf("%s\n", keys->publicKey.c_str());
      return 0;
    }
  }

  // --help and --version need no display either: a QCoreApplication answers them, from the same
  // parser that describes the options below.
  bool infoOnly = false;
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    for (const char* option : {"-h", "--help", "-?", "--help-all", "-v", "--version"}) infoOnly |= std::strcmp(argv[i], option) == 0;
  }
  // Without a display Qt would abort; say what to do instead.
  const auto set = [](const char* name) { return std::getenv(name) != nullptr && *std::getenv(name) != '\0'; };
  if (!infoOnly && !set("DISPLAY") && !set("WAYLAND_DISPLAY") && !set("QT_QPA_PLATFORM")) {
    std::fprintf(stderr,
                 "lockstep: no display here (DISPLAY and WAYLAND_DISPLAY are unset): start it in a desktop session, "
                 "or use lockstepctl, which needs none (lockstepctl --help)\n");
    return 1;
  }
  std::unique_ptr<QCoreApplication> app(infoOnly ? new QCoreApplication(argc, argv) : new QApplication(argc, argv));
  QApplication::setOrganizationName(QStringLiteral("Lockstep"));
  QApplication::setApplicationName(QStringLiteral("lockstep"));
  QApplication::setApplicationVersion(QStringLiteral(LOCKSTEP_VERSION));
  QCommandLineParser parser;
  parser.setApplicationDescription(QStringLiteral("Run and watch data-parallel training."));
  parser.addHelpOption();
  parser.addVersionOption();
  QCommandLineOption configOption(QStringLiteral("config-dir"), QStringLiteral("keys and pinned agents (default ~/.config/lockstep)"),
                                  QStringLiteral("DIR"), configDir);
  QCommandLineOption printKey(QStringLiteral("print-key"), QStringLiteral("print this app's public key and exit"));
  QCommandLineOption newJob(QStringLiteral("new-job"), QStringLiteral("open the job launcher at start"));
  QCommandLineOption screenshot(QStringLiteral("screenshot"), QStringLiteral("save the window (or the dialog on top) to FILE after --screenshot-after-ms, then quit"),
                                QStringLiteral("FILE"));
  QCommandLineOption screenshotAfter(QStringLiteral("screenshot-after-ms"), QStringLiteral("when to take the screenshot"),
                                     QStringLiteral("MS"), QStringLiteral("5000"));
  QCommandLineOption historyOption(QStringLiteral("history"),
                                   QStringLiteral("the job history file (default $LOCKSTEP_HISTORY, else ~/.local/share/lockstep/history.db)"),
                                   QStringLiteral("FILE"), QString::fromStdString(lockstep::history::History::defaultPath()));
  QCommandLineOption noHistory(QStringLiteral("no-history"), QStringLiteral("record nothing"));
  QCommandLineOption fanInNodes(
      QStringLiteral("fan-in-nodes"),
      QStringLiteral("watch jobs on more than N nodes through their supervising agent, one connection at 2 frames/s, "
                     "instead of every agent's stream (default %1; 0: every job)")
          .arg(lockstep::app::FanInRule::kDefaultNodesOver),
      QStringLiteral("N"), QString::number(lockstep::app::FanInRule::kDefaultNodesOver));
  parser.addOptions({configOption, printKey, newJob, screenshot, screenshotAfter, historyOption, noHistory, fanInNodes});
  parser.process(*app);
  bool fanInOk = false;
  const qlonglong nodesOver = parser.value(fanInNodes).toLongLong(&fanInOk);
  if (!fanInOk || nodesOver < 0) {
    std::fprintf(stderr, "lockstep: error: --fan-in-nodes takes a number of nodes, 0 or more (e.g. --fan-in-nodes 64), not '%s'\n",
                 qPrintable(parser.value(fanInNodes)));
    return 2;
  }

  auto keys = lockstep::loadOrCreateKeyPair(parser.value(configOption).toStdString(), "app");
  if (!keys) {
    std::fprintf(stderr, "lockstep: error: %s\n", keys.error().message.c_str());
    return 1;
  }
  // Before the store: it outlives the agents' workers, which report to it.
  std::unique_ptr<lockstep::app::HistoryRecorder> history;
  if (!parser.isSet(noHistory)) history = std::make_unique<lockstep::app::HistoryRecorder>(parser.value(historyOption));
  lockstep::app::ClusterStore store(*keys, history.get(), nullptr,
                                    lockstep::app::FanInRule{static_cast<std::size_t>(nodesOver)});
  lockstep::app::MainWindow window(store, parser.value(configOption), history.get());
  if (history) history->start();
  window.show();
  if (parser.isSet(newJob)) QTimer::singleShot(1500, &window, &lockstep::app::MainWindow::newJob);
  if (parser.isSet(screenshot)) {
    const QString file = parser.value(screenshot);
    QTimer::singleShot(parser.value(screenshotAfter).toInt(), &window, [&window, file] {
      window.refreshNow();
      // A dialog open on top (--new-job) is what the user looks at: take that.
      QWidget* top = QApplication::activeModalWidget();
      (top ? top : static_cast<QWidget*>(&window))->grab().save(file);
      QApplication::quit();
    });
  }
  return app->exec();
}
