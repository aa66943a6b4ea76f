#pragma once
// The desktop app in a test (Qt Test, offscreen): one app (store + window) and the steps a user
// takes with it: adding and connecting agents, launching from the store or the launcher.

#include <QApplication>
#include <QLabel>
#include <QPushButton>
#include <QSignalSpy>
#include <QTimer>
#include <QtTest>
#include <functional>
#include <memory>
#include <optional>
#include <sqlite3.h>

#include "ClusterStore.h"
#include "DashboardWidget.h"
#include "HistoryRecorder.h"
#include "JobControl.h"
#include "LauncherDialog.h"
#include "MainWindow.h"
#include "Models.h"
#include "lockstep/history/history.h"
#include "support/agent_support.h"
#include "support/sql_support.h"

namespace lockstep::test {

using lockstep::app::AgentsModel;
using lockstep::app::ClusterStore;
using lockstep::app::JobControl;
using lockstep::app::LauncherDialog;
using lockstep::app::MainWindow;

constexpr int kConnectMs = 20000;
constexpr int kJobMs = 60000;

// One app (store + window, config in a temp dir) and what it talks to; with `historyPath`, it
// records into that file. `fanIn`: which jobs it watches through their supervising agent.
struct App {
  explicit App(const TempDir& dir, const std::string& historyPath = {}, app::FanInRule fanIn = {})
      : keys(dir, "app"),
        recorder(historyPath.empty() ? nullptr : std::make_unique<app::HistoryRecorder>(QString::fromStdString(historyPath))),
        store(keys.keys, recorder.get(), nullptr, fanIn),
        window(store, QString::fromStdString(keys.configDir), recorder.get()) {
    window.dashboard()->setConfirmStops(false);
    if (recorder) recorder->start();
  }
  QString stateOf(const QString& agentId) {
    window.refreshNow();
    AgentsModel* model = window.agentsModel();
    for (int row = 0; row < model->rowCount(); ++row) {
      if (model->agentId(row) == agentId) return model->index(row, AgentsModel::kState).data().toString();
    }
    return QStringLiteral("(no such agent)");
  }
  QString tile(const QString& name) {
    window.refreshNow();
    return window.dashboard()->tile(name)->value();
  }
  int points(const QString& chart) {
    window.refreshNow();
    return window.dashboard()->chartPointCount(chart);
  }
  QString dashboardLabel(const char* objectName) {
    window.refreshNow();
    auto* label = window.dashboard()->findChild<QLabel*>(QString::fromLatin1(objectName));
    return label && label->isVisibleTo(window.dashboard()) ? label->text() : QString();
  }

  ClientKeys keys;
  std::unique_ptr<app::HistoryRecorder> recorder;  // before the store: its workers report to it
  ClusterStore store;
  MainWindow window;
};

// A job in the history file once its final KPIs are in (read through a connection of its own).
inline std::optional<history::JobRecord> recordedJob(const std::string& path, const std::string& jobId) {
  auto h = history::History::open(path);
  if (!h) return std::nullopt;
  auto job = h->job(jobId);
  if (!job) return std::nullopt;
  return std::move(*job);
}

// Launches a job through the store and waits for the launch to be acknowledged.
inline QString launch(App& app, const AgentProcess& agent, const JobSpec& spec, std::uint32_t ranks) {
  QSignalSpy launched(&app.window.control(), &JobControl::launchFinished);
  auto placed = app.store.place(spec, {{QString::fromStdString(agent.address().text()), ranks}});
  if (!placed) return QString::fromStdString(placed.error().message);
  app.window.control().launch(*placed);
  if (!QTest::qWaitFor([&] { return launched.count() == 1; }, kJobMs)) return QStringLiteral("no launch answer");
  return launched.at(0).at(1).toBool() ? QString() : launched.at(0).at(2).toString();
}

inline QString idOf(const AgentProcess& agent) { return QString::fromStdString(agent.address().text()); }

// Opens the launcher as Ctrl+N does and, while it runs modally, fills it with `fill` (which says
// what was wrong, or nothing) and presses Start. Returns what went wrong, or nothing.
inline QString startFromLauncher(App& app, const std::function<QString(LauncherDialog&)>& fill) {
  QString problem = QStringLiteral("the launcher did not open");
  QTimer::singleShot(200, &app.window, [&] {
    auto* dialog = qobject_cast<LauncherDialog*>(QApplication::activeModalWidget());
    if (!dialog) return;
    problem = fill(*dialog);
    if (problem.isEmpty() && !dialog->job()) problem = QStringLiteral("launcher refused a valid job: ") + dialog->error();
    if (!problem.isEmpty()) {
      dialog->reject();
      return;
    }
    dialog->findChild<QPushButton*>(QStringLiteral("start"))->click();
  });
  app.window.newJob();
  return problem;
}

// Pins the agent's key in the app and connects to it. Returns what went wrong, or nothing.
inline QString addAgent(App& app, const AgentProcess& agent) {
  auto added = app.window.addAgent(idOf(agent), QString::fromStdString(agent.publicKey()));
  return added ? QString() : QString::fromStdString(added.error().message);
}

// Authorizes the app's key on the agent, adds the agent and waits until the app shows it connected.
inline QString connectAuthorized(App& app, const AgentProcess& agent) {
  agent.authorize(app.keys.keys.publicKey);
  if (QString problem = addAgent(app, agent); !problem.isEmpty()) return problem;
  if (QTest::qWaitFor([&] { return app.stateOf(idOf(agent)) == QLatin1String("connected"); }, kConnectMs)) return {};
  return QStringLiteral("the app shows the agent as '%1', not connected").arg(app.stateOf(idOf(agent)));
}

}  // namespace lockstep::test
