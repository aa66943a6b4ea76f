// Issue 33: jobs run as their user, on a node shared by a team. A real agent running as root (as
// CI does), two Unix users the fixture makes and removes, and jobs that try what a user of a shared
// node, or an attacker, would: read another job's environment, files and processes, /etc/shadow,
// stop another user's job. Without root there are no users to make: the tests skip, saying so.

#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "lockstep/client/agent_client.h"
#include "lockstep/common/files.h"
#include "lockstep/common/identity.h"
#include "jobs/job_cgroup.h"
#include "jobs/preflight.h"
#include "support/agent_support.h"
#include "support/unix_user.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A directory of `user`'s own (mode 0700), as a home or project directory is.
std::string ownDirectory(const TempDir& dir, const UnixUser& user) {
  const std::string path = dir.file(user.name);
  fs::create_directories(path);
  EXPECT_EQ(::chown(path.c_str(), user.identity.uid, user.identity.gid), 0);
  EXPECT_EQ(::chmod(path.c_str(), 0700), 0);
  return path;
}

uid_t ownerOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
}

class Isolation : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "making Unix users and running jobs as them needs root (CI runs as root)";
    if (findOnPath("useradd").empty()) GTEST_SKIP() << "no useradd on PATH (Debian's passwd package) to make users with";
    alice = std::make_unique<UnixUser>("a");
    bob = std::make_unique<UnixUser>("b");
    // Not under /tmp, which each job has a private one of; passable by the jobs' users.
    dir = std::make_unique<TempDir>("/var/tmp");
    ASSERT_EQ(::chmod(dir->path().c_str(), 0755), 0);
    agent = std::make_unique<AgentProcess>(*dir, "node-a", std::vector<std::string>{"--job-private-tmp", "yes"});
    for (auto* keys : {&aliceKeys, &bobKeys, &adminKeys, &nobodyKeys, &rootKeys}) {
      *keys = std::make_unique<ClientKeys>(*dir, "client-" + std::to_string(keys - &aliceKeys));
    }
    authorizeAll(*agent);
  }

  void authorizeAll(const AgentProcess& on) {
    std::ofstream(on.stateDir() + "/authorized_keys")
        << "user=" << alice->name << " " << aliceKeys->keys.publicKey << " alice@laptop\n"
        << "user=" << bob->name << " " << bobKeys->keys.publicKey << " bob@laptop\n"
        << "user=" << bob->name << " admin " << adminKeys->keys.publicKey << " the admin\n"
        << nobodyKeys->keys.publicKey << " a key that names no user\n"
        << "user=root " << rootKeys->keys.publicKey << " root without allow-root\n";
    ::chmod((on.stateDir() + "/authorized_keys").c_str(), 0644);
  }

  std::unique_ptr<AgentClient> as(const std::unique_ptr<ClientKeys>& keys) { return connectTo(*agent, *keys); }

  // A command job of one rank running `script` with /bin/sh in `workdir`.
  JobSpec shellJob(const std::string& id, const std::string& script, const std::string& workdir,
                   std::vector<std::pair<std::string, std::string>> env = {}) {
    JobSpec spec = commandJob(id, 1, {"/bin/sh", "-c", script}, workdir);
    spec.command->env = std::move(env);
    spec.timeoutS = 60;
    return spec;
  }

  bool ended(AgentClient& client, const std::string& id) {
    return waitUntil([&] {
      auto jobs = client.listJobs(5s);
      if (!jobs) return false;
      for (const auto& j : jobs->jobs) {
        if (j.spec.jobId == id) return j.state != JobState::kRunning && j.state != JobState::kStarting;
      }
      return false;
    }, 60s);
  }

  std::unique_ptr<UnixUser> alice, bob;
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<AgentProcess> agent;
  std::unique_ptr<ClientKeys> aliceKeys, bobKeys, adminKeys, nobodyKeys, rootKeys;
};

TEST_F(Isolation, AJobRunsAsItsKeysUserAndSeesNothingOfAnothersJob) {
  const std::string bobWork = ownDirectory(*dir, *bob), aliceWork = ownDirectory(*dir, *alice);
  auto b = as(bobKeys);
  // Bob's job: a secret in its environment and in a file of his; it writes to its /tmp and waits.
  ASSERT_TRUE(b->startJob(shellJob("bobs", "echo bob-file-secret > secret.txt; touch /tmp/bob-was-here; "
                                           "exec sleep 120 # bob-sleeper-marker",
                                   bobWork, {{"BOB_SECRET", "bob-env-secret"}}),
                          "", 10s)
                  .ok());
  ASSERT_TRUE(waitUntil([&] { return fs::exists(bobWork + "/secret.txt"); }, 20s));
  const std::string bobLog = agent->stateDir() + "/jobs/bobs/rank-0.log";

  // Alice's job tries what it can and writes what it found.
  const std::string script =
      "id -u > uid.txt; id -G > groups.txt; echo \"$HOME $USER\" > who.txt; umask > umask.txt;"
      "cat /etc/shadow > shadow.txt 2>&1; echo $? >> shadow.txt;"
      "cat " + bobWork + "/secret.txt > bobfile.txt 2>&1; echo $? >> bobfile.txt;"
      "cat " + bobLog + " > boblog.txt 2>&1; echo $? >> boblog.txt;"
      "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' > cmdlines.txt 2>/dev/null;"
      "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' > environs.txt;"
      "ls /proc | grep -c '^[0-9]' > processes.txt;"
      "ls /tmp > tmp.txt; echo mine > output.txt";
  auto a = as(aliceKeys);
  ASSERT_TRUE(a->startJob(shellJob("alices", script, aliceWork), "", 10s).ok());
  ASSERT_TRUE(ended(*a, "alices"));
  const auto found = [&](const std::string& name) { return readText(aliceWork + "/" + name); };

  EXPECT_EQ(found("uid.txt"), std::to_string(alice->identity.uid) + "\n");
  EXPECT_EQ(found("who.txt"), alice->identity.home + " " + alice->name + "\n");
  EXPECT_EQ(found("umask.txt"), "0077\n");
  EXPECT_NE(found("shadow.txt").find("Permission denied"), std::string::npos) << found("shadow.txt");
  EXPECT_EQ(found("bobfile.txt").find("bob-file-secret"), std::string::npos) << found("bobfile.txt");
  EXPECT_NE(found("boblog.txt").find("No such file"), std::string::npos) << "bob's log is not hidden: " << found("boblog.txt");
  // Its PID namespace holds its own processes only: its init, the shell, and what it ran.
  EXPECT_EQ(found("cmdlines.txt").find("bob-sleeper-marker"), std::string::npos) << found("cmdlines.txt");
  EXPECT_EQ(found("environs.txt").find("bob-env-secret"), std::string::npos);
  EXPECT_LE(std::stoi(found("processes.txt")), 6) << found("cmdlines.txt");
  EXPECT_EQ(found("tmp.txt"), "") << "alice's /tmp is not her job's own";
  EXPECT_FALSE(fs::exists("/tmp/bob-was-here")) << "bob's /tmp is the node's";
  // What it made is alice's: its output, its job's directory and log.
  EXPECT_EQ(ownerOf(aliceWork + "/output.txt"), alice->identity.uid);
  EXPECT_EQ(ownerOf(agent->stateDir() + "/jobs/alices"), alice->identity.uid);
  EXPECT_EQ(ownerOf(agent->stateDir() + "/jobs/alices/rank-0.log"), alice->identity.uid);
  EXPECT_EQ(ownerOf(bobWork + "/secret.txt"), bob->identity.uid);
  ASSERT_TRUE(b->stopJob("bobs", 1000, 10s).ok());
  EXPECT_TRUE(ended(*b, "bobs"));
  // The job's init ended with it: nothing of bob's runs any more.
  EXPECT_TRUE(waitUntil([&] { return runCommand({"pgrep", "-u", bob->name}, 5s)->status.exitCode == 1; }, 10s));
}

// How many Fetch round trips `client` makes in `span`, each waiting up to a second for something
// newer than what it saw, as the app and lockstepctl do.
int fetchesIn(AgentClient& client, std::chrono::milliseconds span) {
  std::uint64_t seq = 0;
  int calls = 0;
  for (const auto end = std::chrono::steady_clock::now() + span; std::chrono::steady_clock::now() < end; ++calls) {
    auto batch = client.fetch(seq, 100, 1000, 5s);
    if (!batch) return -1;
    if (!batch->messages.empty()) seq = batch->messages.back().seq;
  }
  return calls;
}

TEST_F(Isolation, AKeySeesAndStopsOnlyItsUsersJobsButAnAdminsSeesAll) {
  const std::string aliceWork = ownDirectory(*dir, *alice), bobWork = ownDirectory(*dir, *bob);
  auto a = as(aliceKeys);
  auto b = as(bobKeys);
  ASSERT_TRUE(a->startJob(shellJob("alices", "exec sleep 120", aliceWork), "", 10s).ok());
  // Alice's job's samples stream on; bob's long polls wait for what is his, not spin on hers.
  const int calls = fetchesIn(*b, 3s);
  EXPECT_GT(calls, 0);
  EXPECT_LT(calls, 40) << "bob's client spun on messages it may not see";
  ASSERT_TRUE(b->startJob(shellJob("bobs", "exec sleep 120", bobWork), "", 10s).ok());

  auto bobSees = b->listJobs(5s);
  ASSERT_TRUE(bobSees.ok());
  ASSERT_EQ(bobSees->jobs.size(), 1u);
  EXPECT_EQ(bobSees->jobs[0].spec.jobId, "bobs");
  EXPECT_EQ(bobSees->jobs[0].owner, bob->name);
  auto stop = b->stopJob("alices", 1000, 5s);
  ASSERT_FALSE(stop.ok()) << "bob's key stopped alice's job";
  EXPECT_EQ(stop.error().code, ErrorCode::kPermissionDenied);
  EXPECT_NE(stop.error().message.find("belongs to " + alice->name), std::string::npos) << stop.error().message;
  EXPECT_FALSE(b->logs("alices", 0, 4096, 5s).ok());
  EXPECT_FALSE(b->stacks("alices", std::nullopt, 10s).ok());
  // The stream shows bob his job's records and the node's, nothing of alice's job, which has some.
  const auto recordsOf = [](AgentClient& client, const std::string& job) {
    auto stream = client.fetch(0, 20000, 0, 5s);
    EXPECT_TRUE(stream.ok());
    return stream ? std::count_if(stream->messages.begin(), stream->messages.end(),
                                  [&](const StreamMessage& m) { return jobOf(m.payload) == job; })
                  : 0;
  };
  auto admin = as(adminKeys);
  ASSERT_TRUE(waitUntil([&] { return recordsOf(*admin, "alices") > 0 && recordsOf(*b, "bobs") > 0; }, 10s));
  EXPECT_EQ(recordsOf(*b, "alices"), 0);

  auto all = admin->listJobs(5s);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->jobs.size(), 2u);
  ASSERT_TRUE(admin->stopJob("alices", 1000, 5s).ok());
  EXPECT_TRUE(ended(*a, "alices"));
  // An ended job's id is still its user's: a "restart" of it by bob would take its directory.
  JobSpec takeover = shellJob("alices", "exec sleep 120", bobWork);
  takeover.attempt = 1;
  auto taken = b->startJob(takeover, "", 10s);
  ASSERT_FALSE(taken.ok()) << "bob's key took alice's job";
  EXPECT_NE(taken.error().message.find("belongs to " + alice->name), std::string::npos) << taken.error().message;
  ASSERT_TRUE(b->stopJob("bobs", 1000, 5s).ok());
  EXPECT_TRUE(ended(*b, "bobs"));
  EXPECT_NE(readText(agent->stateDir() + "/agent.log").find("stop asked by key 'the admin' (" +
                                                              fingerprint(adminKeys->keys.publicKey) + ") of user " +
                                                              bob->name + " (admin)"),
            std::string::npos);
}

TEST_F(Isolation, ARootAgentRefusesAKeyWithoutAUserAndRootWithoutAllowRoot) {
  auto nobody = AgentClient::connect(agent->address(), nobodyKeys->keys, agent->publicKey(), 5s);
  ASSERT_FALSE(nobody.ok());
  EXPECT_NE(nobody.error().message.find("adds user=NAME before this key"), std::string::npos) << nobody.error().message;
  auto root = AgentClient::connect(agent->address(), rootKeys->keys, agent->publicKey(), 5s);
  ASSERT_FALSE(root.ok());
  EXPECT_NE(root.error().message.find("allow-root"), std::string::npos) << root.error().message;
}

TEST_F(Isolation, ASpecNamingWhatOnlyRootMayReadIsRefusedBeforeAnyRankStarts) {
  const std::string rootOnly = dir->file("root-only"), aliceWork = ownDirectory(*dir, *alice);
  fs::create_directories(rootOnly);
  ASSERT_EQ(::chmod(rootOnly.c_str(), 0700), 0);
  auto a = as(aliceKeys);
  auto refused = a->startJob(shellJob("nosy", "id > " + aliceWork + "/ran.txt", rootOnly), "", 10s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find(alice->name + " cannot enter " + rootOnly), std::string::npos)
      << refused.error().message;
  std::this_thread::sleep_for(1s);
  EXPECT_FALSE(fs::exists(aliceWork + "/ran.txt"));
  EXPECT_TRUE(a->listJobs(5s)->jobs.empty());

  // The built-in trainer's files, checked the same way (here on the calling thread, as alice).
  const std::string features = rootOnly + "/x.npy", checkpoints = dir->file("root-checkpoints");
  std::ofstream(features) << "not read";
  fs::create_directories(checkpoints);
  ASSERT_EQ(::chmod(checkpoints.c_str(), 0755), 0);
  JobSpec spec = smallJob("trainer", 1, 10);
  spec.dataset = NpyDataset{features, features};
  agent::PathFacts facts{"node-a", "/bin/true", "/usr/bin:/bin", alice->identity, false};
  auto data = agent::checkJobPaths(spec, facts);
  ASSERT_FALSE(data.ok());
  EXPECT_NE(data.error().message.find(alice->name + " cannot read " + features), std::string::npos) << data.error().message;
  spec.dataset = smallJob("trainer", 1, 10).dataset;
  spec.checkpointDir = checkpoints + "/run-1";
  auto ckpt = agent::checkJobPaths(spec, facts);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.error().message.find(alice->name + " cannot write " + checkpoints), std::string::npos) << ckpt.error().message;
  EXPECT_TRUE(agent::checkJobPaths(spec, agent::PathFacts{"node-a", "/bin/true", "/usr/bin:/bin", currentIdentity(), false}).ok())
      << "root may write there: the check is alice's, not the agent's";
}

// The built-in trainer as alice: its step reports reach the agent (its report socket is open to
// every job's user) and its checkpoints are hers. On an agent that leaves jobs the node's /tmp
// where the build, and with it the trainer, lies there (CI's clone).
TEST_F(Isolation, TheTrainerRunsAsItsUserReportsAndWritesItsCheckpoints) {
  AgentProcess node(*dir, "node-b", privateTmpArgs(dir->path().string()));
  authorizeAll(node);
  const std::string work = ownDirectory(*dir, *alice);
  auto a = connectTo(node, *aliceKeys);
  JobSpec spec = smallJob("trained", 2, 30);
  spec.checkpointDir = work + "/checkpoints";
  spec.checkpointEvery = 10;
  ASSERT_TRUE(a->startJob(spec, "", 10s).ok());
  ASSERT_TRUE(ended(*a, "trained"));
  auto jobs = a->listJobs(5s);
  ASSERT_TRUE(jobs.ok() && jobs->jobs.size() == 1u);
  EXPECT_EQ(jobs->jobs[0].state, JobState::kFinished) << jobs->jobs[0].message;
  EXPECT_EQ(jobs->jobs[0].owner, alice->name);
  auto stream = a->fetch(0, 20000, 0, 5s);
  ASSERT_TRUE(stream.ok());
  const auto reports = std::count_if(stream->messages.begin(), stream->messages.end(), [](const StreamMessage& m) {
    return std::holds_alternative<StepReport>(m.payload) && jobOf(m.payload) == "trained";
  });
  EXPECT_GT(reports, 0) << "the ranks' step reports did not reach the agent";
  ASSERT_TRUE(hasCheckpointFrom(spec.checkpointDir, 10));
  for (const auto& file : fs::directory_iterator(spec.checkpointDir)) {
    EXPECT_EQ(ownerOf(file.path().string()), alice->identity.uid) << file.path();
  }
}

// Where cgroup v2 is delegated to the agent, each job's part is a cgroup of its own: what its
// ranks fork, even out of their process group, is the job's, and goes with it.
TEST_F(Isolation, AJobsProcessesAreItsCgroupsAndGoWithIt) {
  std::string why;
  const auto base = agent::jobCgroupBase(&why);
  if (!base) GTEST_SKIP() << "no cgroup for jobs here: " << why;
  const std::string work = ownDirectory(*dir, *alice);
  auto a = as(aliceKeys);
  // A rank that leaves a process of its own session behind, and waits.
  ASSERT_TRUE(a->startJob(shellJob("grouped", "setsid sleep 300 & echo started > started.txt; exec sleep 300", work), "", 10s).ok());
  ASSERT_TRUE(waitUntil([&] { return fs::exists(work + "/started.txt"); }, 20s));
  auto jobs = a->listJobs(5s);
  ASSERT_TRUE(jobs.ok() && jobs->jobs.size() == 1u);
  const std::string rank = std::to_string(jobs->jobs[0].ranks[0].pid);
  // The rank's cgroup, as the kernel says: the job's, under the agent's.
  std::string cgroup = "\n" + readText("/proc/" + rank + "/cgroup");
  ASSERT_NE(cgroup.find("\n0::"), std::string::npos) << cgroup;
  cgroup = cgroup.substr(cgroup.find("\n0::") + 4);
  cgroup = (fs::path(*base) / fs::path(cgroup.substr(0, cgroup.find('\n'))).filename()).string();
  EXPECT_NE(cgroup.find("-grouped-0"), std::string::npos) << cgroup;
  const auto members = [&] { return readText(cgroup + "/cgroup.procs"); };
  const std::string running = members();
  EXPECT_NE(("\n" + running).find("\n" + rank + "\n"), std::string::npos) << running;
  EXPECT_GE(std::count(running.begin(), running.end(), '\n'), 4) << "init, keeper, rank, its escaped child: " << running;
  ASSERT_TRUE(a->stopJob("grouped", 500, 5s).ok());
  ASSERT_TRUE(ended(*a, "grouped"));
  EXPECT_TRUE(waitUntil([&] { return !fs::exists(cgroup); }, 10s)) << "left in the job's cgroup: " << members();
  EXPECT_TRUE(waitUntil([&] { return runCommand({"pgrep", "-u", alice->name}, 5s)->status.exitCode == 1; }, 10s));
}

}  // namespace
}  // namespace lockstep::test
