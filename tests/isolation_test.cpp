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
#include <functional>
#include <random>
#include <thread>

#include "lockstep/client/agent_client.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"
#include "lockstep/common/identity.h"
#include "lockstep/protocol/codec.h"
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
    const auto end = jobEnd(client, id);
    return end && jobStateEnded(end->state);
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
  auto frame = b->frame({"alices", 0, 0, 0}, 5s);  // issue 46: a job's KPIs fanned in are its user's too
  ASSERT_FALSE(frame.ok()) << "bob's key read alice's job's KPIs";
  EXPECT_NE(frame.error().message.find("belongs to " + alice->name), std::string::npos) << frame.error().message;
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


// Issue 44: the report socket is every job's, but a job's processes send records for their own job
// only. The forger's job names the victim's job and rank 0 in step reports (loss 12345), a phase and
// a note it pushes through its socket; none reaches the victim's job, whose own reports (a shell
// running Python with the lockstep package) still do, and the agent's log says once that records
// claiming it were refused. `victimId`: who owns the victim's files.
void forgedRecordsAreRefused(const AgentProcess& node, AgentClient& victim, AgentClient& forger,
                             const std::string& victimWork, const std::string& forgerWork, const Identity& victimId,
                             const std::function<JobSpec(const std::string&, const std::string&, const std::string&)>& job) {
  const std::string aliceJob = "alices-steps";
  std::ofstream(victimWork + "/steps.py") << "import time, lockstep\n"
                                             "for i in range(80):\n"
                                             "    time.sleep(0.1)\n"
                                             "    lockstep.step(samples=1, loss=1.5)\n"
                                             "lockstep.close()\n";
  ASSERT_EQ(::chown((victimWork + "/steps.py").c_str(), victimId.uid, victimId.gid), 0);
  ASSERT_TRUE(victim.startJob(job(aliceJob, "/usr/bin/python3 steps.py; echo $? > done.txt", victimWork), "", 10s).ok());
  const auto aliceRecords = [&] {
    auto stream = victim.fetch(0, 20000, 0, 5s);
    std::vector<StreamMessage> mine;
    if (!stream.ok()) return mine;
    for (auto& m : stream->messages) {
      if (jobOf(m.payload) == aliceJob) mine.push_back(std::move(m));
    }
    return mine;
  };
  const auto steps = [&](const std::vector<StreamMessage>& records) {
    return std::count_if(records.begin(), records.end(),
                         [](const StreamMessage& m) { return std::holds_alternative<StepReport>(m.payload); });
  };
  ASSERT_TRUE(waitUntil([&] { return steps(aliceRecords()) > 0; }, 30s)) << "the victim's job reports no steps";

  // The forger's records, made as any program could: a step report, a phase and a note of rank 0.
  StepReport step;
  step.jobId = aliceJob;
  step.step = 7;
  step.samples = 1;
  step.loss = 12345.0f;
  step.stepTimeUs = 100000;
  step.timeUnixUs = unixMicrosNow();
  PhaseReport phase;
  phase.jobId = aliceJob;
  phase.name = "bobs-phase";
  phase.timeUnixUs = unixMicrosNow();
  phase.durationUs = 1000;
  phase.step = 7;
  JobEvent note;
  note.jobId = aliceJob;
  note.kind = JobEventKind::kNote;
  note.rank = 0;
  note.timeUnixUs = unixMicrosNow();
  note.message = "bobs-note";
  std::ofstream(forgerWork + "/step.bin", std::ios::binary) << encode(StreamMessage{1, "", step});
  std::ofstream(forgerWork + "/phase.bin", std::ios::binary) << encode(StreamMessage{2, "", phase});
  std::ofstream(forgerWork + "/note.bin", std::ios::binary) << encode(StreamMessage{3, "", note});
  // Pushed through the socket the forger's job is given (LOCKSTEP_REPORT), through libzmq itself.
  std::ofstream(forgerWork + "/forge.py") << R"(import ctypes, os, time
z = ctypes.CDLL("libzmq.so.5")
z.zmq_ctx_new.restype = z.zmq_socket.restype = ctypes.c_void_p
z.zmq_socket.argtypes = [ctypes.c_void_p, ctypes.c_int]
z.zmq_connect.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
z.zmq_send.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
z.zmq_close.argtypes = z.zmq_ctx_term.argtypes = [ctypes.c_void_p]
context = z.zmq_ctx_new()
push = z.zmq_socket(context, 8)  # ZMQ_PUSH
assert os.environ["LOCKSTEP_JOB_ID"] == "alices-steps" and os.environ["RANK"] == "0"
assert z.zmq_connect(push, os.environ["LOCKSTEP_REPORT"].encode()) == 0
records = [open(name, "rb").read() for name in ("step.bin", "phase.bin", "note.bin")]
for i in range(20):
    for record in records:
        z.zmq_send(push, record, len(record), 0)
    time.sleep(0.1)
z.zmq_close(push)
z.zmq_ctx_term(context)
print("sent", flush=True)
)";
  ASSERT_TRUE(forger.startJob(job("bobs-forger", "LOCKSTEP_JOB_ID=" + aliceJob + " RANK=0 /usr/bin/python3 forge.py",
                                  forgerWork),
                              "", 10s)
                  .ok());
  const auto ended = [](AgentClient& client, const std::string& id) {
    const auto end = jobEnd(client, id);
    return end && jobStateEnded(end->state);
  };
  ASSERT_TRUE(ended(forger, "bobs-forger"));
  auto forgerLog = forger.logs("bobs-forger", 0, 4096, 5s);
  ASSERT_TRUE(forgerLog.ok());
  ASSERT_NE(forgerLog->text.find("sent"), std::string::npos) << "the forger did not send: " << forgerLog->text;
  ASSERT_TRUE(ended(victim, aliceJob));
  EXPECT_EQ(readText(victimWork + "/done.txt"), "0\n");

  const auto records = aliceRecords();
  std::uint64_t lastStep = 0;
  for (const auto& m : records) {
    if (const auto* r = std::get_if<StepReport>(&m.payload)) {
      EXPECT_NE(r->loss, 12345.0f) << "the forger's step report reached the victim's job";
      EXPECT_EQ(r->loss, 1.5f);
      lastStep = std::max(lastStep, r->step);
    }
    if (const auto* p = std::get_if<PhaseReport>(&m.payload)) EXPECT_NE(p->name, "bobs-phase");
    if (const auto* e = std::get_if<JobEvent>(&m.payload)) EXPECT_EQ(e->message.find("bobs-note"), std::string::npos);
  }
  EXPECT_GE(steps(records), 40) << "the victim's own reports stopped arriving";
  EXPECT_GE(lastStep, 70u) << "the victim's last reports did not arrive";
  const std::string log = readText(node.stateDir() + "/agent.log");
  const std::string said = "refused a record claiming job " + aliceJob;
  const auto first = log.find(said);
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(said, first + 1), std::string::npos) << "said once: " << log;
}

// Bob's job sends step reports, a phase and a note in the name of alice's job: its PID namespace and
// cgroup are not hers, nor is its user.
TEST_F(Isolation, AJobCannotSendRecordsInAnotherJobsName) {
  // An agent of its own, whose jobs see /tmp where the build's `lockstep` package may lie (CI's).
  AgentProcess node(*dir, "node-p");
  authorizeAll(node);
  const std::string aliceWork = ownDirectory(*dir, *alice), bobWork = ownDirectory(*dir, *bob);
  auto a = connectTo(node, *aliceKeys);
  auto b = connectTo(node, *bobKeys);
  forgedRecordsAreRefused(node, *a, *b, aliceWork, bobWork, alice->identity,
                          [&](const std::string& id, const std::string& script, const std::string& work) {
                            return shellJob(id, script, work);
                          });
}

// Without the sandbox there is no PID namespace of the job's: a root agent's jobs are told apart by
// their user and, where cgroup v2 is delegated to the agent, their cgroup. Two jobs of one user
// (root's, with allow-root: jobs of other users cannot reach the socket in the agent's state
// directory without the sandbox), the forger's refused by its cgroup.
TEST_F(Isolation, WithoutTheSandboxAJobsCgroupStillTellsItsRecordsApart) {
  std::string why;
  if (!agent::jobCgroupBase(&why)) GTEST_SKIP() << "no cgroup for jobs here: " << why;
  AgentProcess node(*dir, "node-c", {"--job-sandbox", "no"});
  std::ofstream(node.stateDir() + "/authorized_keys") << authorizedKeyLine(rootKeys->keys.publicKey, "root");
  const std::string victimWork = dir->file("victim"), forgerWork = dir->file("forger");
  fs::create_directories(victimWork);
  fs::create_directories(forgerWork);
  auto victim = connectTo(node, *rootKeys);
  auto forger = connectTo(node, *rootKeys);
  forgedRecordsAreRefused(node, *victim, *forger, victimWork, forgerWork, currentIdentity(),
                          [&](const std::string& id, const std::string& script, const std::string& work) {
                            return shellJob(id, script, work);
                          });
}
}  // namespace
}  // namespace lockstep::test
