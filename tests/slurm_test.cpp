// Issue 17: lockstepctl start --slurm against a real Slurm (slurmctld, slurmd and munged, Debian
// 12's, started by tests/cluster/slurm_fixture.sh as root with a one-node configuration).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "lockstep/client/slurm.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kFixture = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/cluster/slurm_fixture.sh";
const std::string kPrometheus = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/cluster/prometheus_fixture.sh";

// One Slurm cluster per test, under the test's directory, stopped (with every job) at the end.
// lockstepctl runs with HOME in the same directory: the job directories live there.
class Slurm : public ::testing::Test {
 protected:
  void SetUp() override {
    // munged wants every directory above its socket searchable by all.
    fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_exec | fs::perms::others_exec);
    auto started = runProcess({"/bin/bash", kFixture, "start", dir.file("slurm")}, {}, dir, 60s);
    if (started.status.exitCode == 77) GTEST_SKIP() << "no Slurm here (needs root and slurm-wlm, munge): " << started.err;
    ASSERT_EQ(started.status.exitCode, 0) << started.out << started.err;
    up = true;
    env = {{"SLURM_CONF", dir.file("slurm") + "/slurm.conf"}, {"HOME", dir.file("home")},
           {"LOCKSTEP_CONFIG_DIR", dir.file("config")}, {"LOCKSTEP_HISTORY", dir.file("history.db")}};
    fs::create_directories(dir.file("home"));
    ASSERT_EQ(ctl({"keygen"}).status.exitCode, 0);
  }
  void TearDown() override {
    if (up) runProcess({"/bin/bash", kFixture, "stop", dir.file("slurm")}, {}, dir, 60s);
  }

  ProcessResult ctl(std::vector<std::string> args, std::chrono::milliseconds timeout = 120s) const {
    args.insert(args.begin(), lockstepctlPath());
    return runProcess(args, env, dir, timeout);
  }
  // Slurm's own tools (Debian's, in /usr/bin: runProcess looks nothing up on PATH).
  ProcessResult tool(std::vector<std::string> args) const {
    args[0] = "/usr/bin/" + args[0];
    return runProcess(args, env, dir, 30s);
  }
  // lockstepctl in the background, its output in dir/NAME.out.
  pid_t ctlInBackground(const std::string& name, std::vector<std::string> args) const {
    args.insert(args.begin(), lockstepctlPath());
    return startProcess(args, env, dir.file(name + ".out"), dir.file(name + ".err"));
  }
  std::string slurmJobOf(const std::string& jobId) const {
    std::string id;
    waitUntil([&] {
      id = readText(dir.file("home") + "/.lockstep/slurm/" + jobId + "/slurm-job");
      return !id.empty();
    }, 30s);
    return id.substr(0, id.find(' '));
  }
  std::string slurmState(const std::string& slurmJob) const {
    auto shown = tool({"scontrol", "show", "job", "-o", slurmJob});
    auto info = slurm::parseJobInfo(shown.out);
    return info ? info->state : "(" + shown.err + ")";
  }
  // One Key=Value field of `scontrol show TYPE -o ID`.
  std::string field(const std::string& type, const std::string& id, const std::string& key) const {
    const std::string shown = tool({"scontrol", "show", type, "-o", id}).out;
    const auto at = shown.find(" " + key + "=");
    return at == std::string::npos ? "" : shown.substr(at + key.size() + 2, shown.find(' ', at + 1) - at - key.size() - 2);
  }
  bool slurmStateBecomes(const std::string& slurmJob, const std::string& state, std::chrono::milliseconds within) const {
    return waitUntil([&] { return slurmState(slurmJob) == state; }, within);
  }
  bool running(const std::string& jobId) const {
    auto status = ctl({"status", jobId, "--json"}, 20s);
    return status.status.exitCode == 0 && nlohmann::json::parse(status.out)["state"] == "running";
  }
  nlohmann::json report(const std::string& jobId) const {
    auto written = ctl({"report", jobId, "--out", dir.file(jobId + ".json")});
    EXPECT_EQ(written.status.exitCode, 0) << written.err;
    return nlohmann::json::parse(readText(dir.file(jobId + ".json")));
  }
  static int waitExit(pid_t pid, std::chrono::seconds within) {
    int status = 0;
    const bool ended = waitUntil([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, within);
    if (!ended) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  TempDir dir;
  Env env;
  bool up = false;
  const std::vector<std::string> longJob = {"--ranks", "2", "--layers", "16,32,4", "--dataset", "synthetic:n=4096",
                                            "--steps", "100000000", "--lr", "0.05", "--slurm-linger-s", "3"};
};

TEST_F(Slurm, ASubmittedJobRunsItsRanksUnderSlurmFinishesAndReleasesTheAllocation) {
  auto done = ctl({"start", "--slurm", "--nodes", "1", "--ranks", "2", "--wait", "--job-id", "sl-done", "--layers",
                   "16,32,4", "--dataset", "synthetic:n=2048", "--steps", "200", "--lr", "0.05", "--slurm-linger-s", "2"});
  ASSERT_EQ(done.status.exitCode, 0) << done.out << done.err;
  EXPECT_NE(done.out.find("submitted Slurm job"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("job sl-done: finished"), std::string::npos) << done.out;
  const std::string slurmJob = slurmJobOf("sl-done");
  EXPECT_NE(done.out.find("in Slurm job " + slurmJob), std::string::npos) << done.out;
  // The ranks run beside the agent, in its task: it asked for the node's CPUs, not Slurm's one.
  EXPECT_EQ(field("job", slurmJob, "NumCPUs"), field("node", field("job", slurmJob, "NodeList"), "CPUTot"));
  EXPECT_NE(field("job", slurmJob, "NumCPUs"), "");
  // The agents leave once the job is over: Slurm's job completes, nothing holds the node.
  EXPECT_TRUE(slurmStateBecomes(slurmJob, "COMPLETED", 30s)) << slurmState(slurmJob);
  EXPECT_TRUE(processesOfJob("sl-done").empty());
  const auto r = report("sl-done");
  EXPECT_EQ(r["job"]["slurm_job_id"], slurmJob);
  EXPECT_EQ(r["job"]["state"], "finished");
  // Found again by its id, the ended job says where it ran.
  auto status = ctl({"status", "sl-done"});
  EXPECT_NE(status.err.find("Slurm job " + slurmJob + ": COMPLETED"), std::string::npos) << status.err;
}

TEST_F(Slurm, StopFromLockstepctlStopsTheRanksAndCancelsTheSlurmJob) {
  auto started = ctl(join({"start", "--slurm", "--job-id", "sl-stop"}, longJob));
  ASSERT_EQ(started.status.exitCode, 0) << started.out << started.err;
  const std::string slurmJob = slurmJobOf("sl-stop");
  ASSERT_TRUE(waitUntil([&] { return running("sl-stop"); }, 30s));
  auto status = ctl({"status", "sl-stop"});
  EXPECT_NE(status.out.find("in Slurm job " + slurmJob), std::string::npos) << status.out;

  auto stopped = ctl({"stop", "sl-stop"});
  ASSERT_EQ(stopped.status.exitCode, 0) << stopped.out << stopped.err;
  EXPECT_NE(stopped.out.find("cancelled Slurm job " + slurmJob), std::string::npos) << stopped.out;
  EXPECT_NE(stopped.out.find("job sl-stop: stopped"), std::string::npos) << stopped.out;
  EXPECT_TRUE(slurmStateBecomes(slurmJob, "CANCELLED", 30s)) << slurmState(slurmJob);
  EXPECT_TRUE(waitUntil([] { return processesOfJob("sl-stop").empty(); }, 10s));
}

TEST_F(Slurm, ScancelEndsTheJobWithSlurmsOwnWordsInItsEventsAndHistory) {
  const pid_t follower = ctlInBackground("follow", join({"start", "--slurm", "--wait", "--job-id", "sl-cancel"}, longJob));
  const std::string slurmJob = slurmJobOf("sl-cancel");
  ASSERT_TRUE(waitUntil([&] { return running("sl-cancel"); }, 30s)) << readText(dir.file("follow.err"));
  ASSERT_EQ(tool({"scancel", slurmJob}).status.exitCode, 0);

  EXPECT_EQ(waitExit(follower, 60s), 6) << readText(dir.file("follow.out")) << readText(dir.file("follow.err"));
  const std::string said = "ended by Slurm job " + slurmJob + ": CANCELLED";
  EXPECT_NE(readText(dir.file("follow.out")).find("job sl-cancel: stopped: " + said), std::string::npos)
      << readText(dir.file("follow.out"));
  const auto r = report("sl-cancel");
  EXPECT_EQ(r["job"]["state"], "stopped");
  EXPECT_EQ(r["job"]["slurm_job_id"], slurmJob);
  bool eventSaysSo = false;
  for (const auto& e : r["events"]) eventSaysSo |= e["kind"] == "stopped" && e["message"] == said;
  EXPECT_TRUE(eventSaysSo) << r["events"].dump(1);
  EXPECT_TRUE(processesOfJob("sl-cancel").empty());
}

TEST_F(Slurm, ATimeLimitEndsTheJobAsTimeout) {
  const pid_t follower =
      ctlInBackground("follow", join({"start", "--slurm", "--time", "1", "--wait", "--job-id", "sl-time"}, longJob));
  const std::string slurmJob = slurmJobOf("sl-time");
  ASSERT_TRUE(waitUntil([&] { return running("sl-time"); }, 30s)) << readText(dir.file("follow.err"));
  auto shown = tool({"scontrol", "show", "job", "-o", slurmJob});
  EXPECT_NE(shown.out.find("TimeLimit=00:01:00"), std::string::npos) << shown.out;  // --time reached sbatch
  // Slurm's own time limit, brought forward: slurmctld ends the job at its next check (every 30 s).
  // slurmctld may refuse for a moment (a job still configuring, an RPC timed out on a busy
  // machine): asked again for up to 20 s, and what it said is shown if it never agrees.
  ProcessResult updated;
  waitUntil([&] {
    updated = tool({"scontrol", "update", "JobId=" + slurmJob, "EndTime=now"});
    if (updated.status.exitCode != 0) std::cerr << "scontrol update refused: " << updated.err << updated.out;
    return updated.status.exitCode == 0;
  }, 20s);
  ASSERT_EQ(updated.status.exitCode, 0) << updated.err << updated.out << "; the job is " << slurmState(slurmJob);

  EXPECT_EQ(waitExit(follower, 90s), 6) << readText(dir.file("follow.out")) << readText(dir.file("follow.err"));
  const std::string said = "ended by Slurm job " + slurmJob + ": TIMEOUT (TimeLimit)";
  EXPECT_NE(readText(dir.file("follow.out")).find(said), std::string::npos) << readText(dir.file("follow.out"));
  EXPECT_TRUE(slurmStateBecomes(slurmJob, "TIMEOUT", 30s)) << slurmState(slurmJob);
  EXPECT_EQ(report("sl-time")["job"]["message"], said);
}

TEST_F(Slurm, InsideAnAllocationTheJobUsesItAndLeavesItToItsOwner) {
  // salloc holds the allocation for the command it runs: lockstepctl, which sees SLURM_JOB_ID.
  auto done = runProcess(join({"/usr/bin/salloc", "--nodes=1", lockstepctlPath(), "start", "--slurm", "--wait", "--job-id",
                               "sl-alloc", "--ranks", "2", "--layers", "16,32,4", "--dataset", "synthetic:n=2048",
                               "--steps", "100", "--lr", "0.05", "--slurm-linger-s", "2"}, {}),
                         env, dir, 120s);
  ASSERT_EQ(done.status.exitCode, 0) << done.out << done.err;
  EXPECT_NE(done.out.find("in allocation, Slurm job"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("job sl-alloc: finished"), std::string::npos) << done.out;
  EXPECT_EQ(done.out.find("cancelled"), std::string::npos) << done.out;

  // The allocation's own limits apply inside it: asking for others is refused, not ignored.
  auto refused = runProcess({"/usr/bin/salloc", "--nodes=1", lockstepctlPath(), "start", "--slurm", "--time", "5",
                             "--job-id", "sl-alloc-2", "--ranks", "2", "--layers", "16,32,4", "--steps", "10"},
                            env, dir, 60s);
  EXPECT_NE(refused.status.exitCode, 0);
  EXPECT_NE(refused.err.find("--time, --partition, --account and --cpus-per-node"), std::string::npos) << refused.err;
}

// Issue 31: the agents lockstepctl starts through Slurm serve their metrics on a port of their own
// and name it for Prometheus' file-based discovery: the real Prometheus of the cluster tests finds
// and scrapes them. When the job ends, its directory in the home goes (its logs kept where
// --slurm-logs asked), as does its targets file; the line naming its Slurm job stays.
TEST_F(Slurm, PrometheusFindsTheAgentsMetricsAndTheJobsDirectoryGoesWhenItEnds) {
  const std::string home = dir.file("home");
  const std::string targets = home + "/.lockstep/metrics";
  auto prometheus = runProcess({"/bin/bash", kPrometheus, "start", dir.file("prom"), "file_sd:" + targets + "/*.json"}, {}, dir, 60s);
  if (prometheus.status.exitCode == 77) GTEST_SKIP() << "no Prometheus here (apt install prometheus curl): " << prometheus.err;
  ASSERT_EQ(prometheus.status.exitCode, 0) << prometheus.out << prometheus.err;
  const auto stopPrometheus = [&] { runProcess({"/bin/bash", kPrometheus, "stop", dir.file("prom")}, {}, dir, 30s); };
  const std::string api = "http://127.0.0.1:" + readText(dir.file("prom") + "/port").substr(0, 5) + "/api/v1/query";
  const auto query = [&](const std::string& promql) {
    auto got = runProcess({"/usr/bin/curl", "-sfG", api, "--data-urlencode", "query=" + promql}, {}, dir, 10s);
    return got.status.exitCode == 0 ? nlohmann::json::parse(got.out, nullptr, false) : nlohmann::json();
  };
  const std::string logs = dir.file("logs");
  auto started = ctl(join({"start", "--slurm", "--job-id", "sl-prom", "--slurm-logs", logs}, longJob));
  if (started.status.exitCode != 0) stopPrometheus();
  ASSERT_EQ(started.status.exitCode, 0) << started.out << started.err;
  const std::string slurmJob = slurmJobOf("sl-prom");
  EXPECT_TRUE(waitUntil([&] { return running("sl-prom"); }, 30s));
  const auto file = nlohmann::json::parse(readText(targets + "/sl-prom-node-0.json"), nullptr, false);
  EXPECT_TRUE(file.is_array() && file.size() == 1) << file.dump();

  nlohmann::json result;
  const bool answered = waitUntil([&] {
    result = query(R"(lockstep_rank_steps_total{job_id="sl-prom",rank="1"})");
    return result.is_object() && !result["data"]["result"].empty();
  }, 60s);
  stopPrometheus();
  EXPECT_TRUE(answered) << result.dump() << readText(dir.file("prom") + "/prometheus.log");
  if (answered) EXPECT_EQ(result["data"]["result"][0]["metric"]["slurm_job"], slurmJob) << result.dump();

  ASSERT_EQ(ctl({"stop", "sl-prom"}).status.exitCode, 0);
  EXPECT_TRUE(slurmStateBecomes(slurmJob, "CANCELLED", 30s)) << slurmState(slurmJob);
  const std::string jobDir = home + "/.lockstep/slurm/sl-prom";
  EXPECT_TRUE(waitUntil([&] { return !fs::exists(jobDir); }, 30s)) << "the job's directory stays in the home";
  EXPECT_FALSE(fs::exists(targets + "/sl-prom-node-0.json"));
  EXPECT_TRUE(fs::exists(logs + "/node-0/rank-0.log")) << "the ranks' logs, where --slurm-logs asked";
  EXPECT_TRUE(fs::exists(logs + "/slurm-" + slurmJob + ".out"));
  auto status = ctl({"status", "sl-prom"});
  EXPECT_NE(status.err.find("Slurm job " + slurmJob + ": CANCELLED"), std::string::npos) << status.err;
  auto again = ctl(join({"start", "--slurm", "--job-id", "sl-prom"}, longJob));
  EXPECT_NE(again.err.find("already ran through Slurm"), std::string::npos) << again.err;
}

}  // namespace
}  // namespace lockstep::test
