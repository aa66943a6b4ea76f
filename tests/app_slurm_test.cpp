// Issue 17 in the app: a Slurm cluster in the cluster view, the launcher aimed at it, and a job
// that runs there and is stopped from the app, against a real Slurm (tests/cluster/slurm_fixture.sh,
// as root) and real agents and trainers (Qt Test, offscreen).

#include <QComboBox>
#include <QtTest>
#include <filesystem>

#include "ClusterStore.h"
#include "JobControl.h"
#include "LauncherDialog.h"
#include "Models.h"
#include "SlurmLauncher.h"
#include "lockstep/client/slurm.h"
#include "support/agent_support.h"

using namespace lockstep;
using namespace lockstep::test;
using namespace lockstep::app;

namespace {

const std::string kFixture = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/cluster/slurm_fixture.sh";

}  // namespace

class AppSlurmTest : public QObject {
  Q_OBJECT

 private:
  std::unique_ptr<TempDir> dir_;
  bool up_ = false;

  std::string slurmState(const std::string& jobId) {
    auto started = slurm::startedFor(jobId);
    if (!started) return "(not started: " + started.error().message + ")";
    auto info = slurm::query(started->slurmJobId, std::chrono::seconds(10));
    return info ? info->state : "(" + info.error().message + ")";
  }
  // The launcher dialog aimed at the Slurm cluster, for a CPU job of `ranks` ranks.
  JobSpec slurmJob(const ClusterStore& store, const QString& jobId, int steps, SlurmRequest* request) {
    LauncherDialog dialog(store);
    dialog.setField(QStringLiteral("where"), 1);
    dialog.setField(QStringLiteral("jobId"), jobId);
    dialog.setField(QStringLiteral("layers"), QStringLiteral("16,32,4"));
    dialog.setField(QStringLiteral("samples"), QStringLiteral("2048"));
    dialog.setField(QStringLiteral("slurmRanks"), 2);
    dialog.setField(QStringLiteral("duration"), steps);
    dialog.setField(QStringLiteral("lr"), QStringLiteral("0.05"));
    if (!dialog.job() || !dialog.slurmRequest()) qWarning("launcher: %s", qPrintable(dialog.error()));
    *request = dialog.slurmRequest().value_or(SlurmRequest{});
    request->lingerS = 2;
    return dialog.job().value_or(JobSpec{});
  }

 private Q_SLOTS:
  void init() {
    dir_ = std::make_unique<TempDir>();
    std::filesystem::permissions(dir_->path(), std::filesystem::perms::owner_all | std::filesystem::perms::group_exec |
                                                   std::filesystem::perms::others_exec);
    auto started = runProcess({"/bin/bash", kFixture, "start", dir_->file("slurm")}, {}, *dir_, std::chrono::seconds(60));
    if (started.status.exitCode == 77) QSKIP("no Slurm here (needs root and slurm-wlm, munge)");
    QCOMPARE(started.status.exitCode, 0);
    up_ = true;
    qputenv("SLURM_CONF", QByteArray::fromStdString(dir_->file("slurm") + "/slurm.conf"));
    qputenv("HOME", QByteArray::fromStdString(dir_->file("home")));
    std::filesystem::create_directories(dir_->file("home"));
  }
  void cleanup() {
    if (up_) runProcess({"/bin/bash", kFixture, "stop", dir_->file("slurm")}, {}, *dir_, std::chrono::seconds(60));
    up_ = false;
    dir_.reset();
  }

  void aSlurmClusterIsInTheClusterViewAndTheLauncherChecksWhatItAsksFor() {
    ClientKeys keys(*dir_, "app");
    ClusterStore store(keys.keys);
    store.addSlurmCluster({QStringLiteral("login-1"), QStringLiteral("debug"), {}});
    AgentsModel model(store);
    model.refresh();
    QCOMPARE(model.rowCount(), 1);
    QCOMPARE(model.index(0, AgentsModel::kAgent).data().toString(), QStringLiteral("Slurm via login-1"));
    QCOMPARE(model.index(0, AgentsModel::kNode).data().toString(), QStringLiteral("partition debug"));

    LauncherDialog dialog(store);
    QVERIFY(dialog.findChild<QComboBox*>(QStringLiteral("where"))->isVisibleTo(&dialog));
    dialog.setField(QStringLiteral("where"), 1);
    dialog.setField(QStringLiteral("slurmNodes"), 2);
    dialog.setField(QStringLiteral("slurmRanks"), 6);
    QVERIFY2(dialog.job() && dialog.slurmRequest(), qPrintable(dialog.error()));
    QCOMPARE(dialog.job()->worldSize, 6u);
    QCOMPARE(dialog.slurmRequest()->allocation.nodes, 2u);
    QCOMPARE(QString::fromStdString(dialog.slurmRequest()->allocation.partition), QStringLiteral("debug"));
    dialog.setField(QStringLiteral("slurmGpusPerNode"), 4);  // GPUs per node, but CPU ranks
    QVERIFY(!dialog.job());
    QVERIFY2(dialog.error().contains(QStringLiteral("choose GPU ranks")), qPrintable(dialog.error()));
  }

  void aJobLaunchedOnSlurmRunsFinishesAndReleasesItsAllocation() {
    ClientKeys keys(*dir_, "app");
    ClusterStore store(keys.keys);
    JobControl control(store);
    SlurmLauncher launcher(store, control);
    store.addSlurmCluster({QStringLiteral("this host"), {}, {}});
    SlurmRequest request;
    const JobSpec spec = slurmJob(store, QStringLiteral("app-sl-1"), 200, &request);
    QVERIFY(!spec.jobId.empty());
    QSignalSpy failed(&launcher, &SlurmLauncher::failed);
    QSignalSpy launched(&launcher, &SlurmLauncher::launched);
    launcher.launch(spec, request);
    QTRY_VERIFY_WITH_TIMEOUT(launched.count() == 1 || failed.count() == 1, 60000);
    QVERIFY2(failed.isEmpty(), failed.isEmpty() ? "" : qPrintable(failed.first().at(1).toString()));
    // Its agents joined the cluster view; the job runs there and finishes, in the Slurm job.
    QTRY_VERIFY_WITH_TIMEOUT(store.job("app-sl-1") && store.job("app-sl-1")->state == JobState::kFinished, 60000);
    QCOMPARE(QString::fromStdString(store.job("app-sl-1")->spec.slurmJobId), launched.first().at(1).toString());
    QCOMPARE(store.agents().size(), 1u);
    QTRY_VERIFY_WITH_TIMEOUT(slurmState("app-sl-1") == "COMPLETED", 30000);
    // Its agents exited after their linger: they leave the cluster view, the job stays.
    QTRY_VERIFY_WITH_TIMEOUT(store.agents().empty(), 30000);
    QVERIFY(store.job("app-sl-1"));
  }

  void stoppingFromTheAppCancelsTheSlurmJob() {
    ClientKeys keys(*dir_, "app");
    ClusterStore store(keys.keys);
    JobControl control(store);
    const Ctl ctl{*dir_, dir_->file("config-ctl")};
    QCOMPARE(ctl({"keygen"}).status.exitCode, 0);
    SlurmLauncher launcher(store, control, ctl.configDir);
    store.addSlurmCluster({QStringLiteral("this host"), {}, {}});
    SlurmRequest request;
    const JobSpec spec = slurmJob(store, QStringLiteral("app-sl-2"), 100'000'000, &request);
    launcher.launch(spec, request);
    QTRY_VERIFY_WITH_TIMEOUT(store.job("app-sl-2") && store.job("app-sl-2")->state == JobState::kRunning, 60000);
    // lockstepctl's key was let in beside the app's: the job can be followed from a terminal too.
    const auto status = ctl({"status", "app-sl-2"});
    QVERIFY2(status.status.exitCode == 0 && status.out.find("in Slurm job") != std::string::npos,
             qPrintable(QString::fromStdString(status.out + status.err)));
    control.stopJob("app-sl-2");
    QTRY_VERIFY_WITH_TIMEOUT(slurmState("app-sl-2") == "CANCELLED", 30000);
    QTRY_VERIFY_WITH_TIMEOUT(processesOfJob("app-sl-2").empty(), 15000);
  }
};

QTEST_MAIN(AppSlurmTest)
#include "app_slurm_test.moc"
