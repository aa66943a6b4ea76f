// Issue 44: jobs fenced on a shared node as Slurm fences them (docs/fences.md). A real agent as
// root (as CI runs), two Unix users the fixture makes and removes, real cgroups: a job over its
// memory limit is killed by the kernel and fails saying so while another user's job goes on; a
// fork bomb stops at its process limit; two jobs get cores of their own; a rank cannot open a GPU
// device node that is not its own. Without root or without the cgroups, the tests skip, saying why.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "jobs/job_cgroup.h"
#include "lockstep/client/agent_client.h"
#include "lockstep/common/files.h"
#include "support/agent_support.h"
#include "support/unix_user.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class Fences : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "making Unix users and cgroups needs root (CI runs as root)";
    if (findOnPath("useradd").empty()) GTEST_SKIP() << "no useradd on PATH (Debian's passwd package)";
    node = agent::probeCgroups(false);  // what the agent will find; changes nothing here
    alice = std::make_unique<UnixUser>("a");
    bob = std::make_unique<UnixUser>("b");
    dir = std::make_unique<TempDir>("/var/tmp");  // not under /tmp, which each job has a private one of
    ASSERT_EQ(::chmod(dir->path().c_str(), 0755), 0);
    aliceKeys = std::make_unique<ClientKeys>(*dir, "alice");
    bobKeys = std::make_unique<ClientKeys>(*dir, "bob");
  }

  // Its jobs see /tmp as the tests' fixtures need (the build's `lockstep` package may lie there).
  void startAgent(std::vector<std::string> args = {}) {
    agent = std::make_unique<AgentProcess>(*dir, "node-a", args);
    std::ofstream(agent->stateDir() + "/authorized_keys")
        << "user=" << alice->name << " " << aliceKeys->keys.publicKey << " alice@laptop\n"
        << "user=" << bob->name << " " << bobKeys->keys.publicKey << " bob@laptop\n";
    ::chmod((agent->stateDir() + "/authorized_keys").c_str(), 0644);
  }

  // A directory of `user`'s own, where their job runs.
  std::string workOf(const UnixUser& user) const {
    const std::string path = dir->file(user.name);
    fs::create_directories(path);
    EXPECT_EQ(::chown(path.c_str(), user.identity.uid, user.identity.gid), 0);
    return path;
  }

  // A one-rank command job running Debian's python on `program`.
  static JobSpec pythonJob(const std::string& id, const std::string& program, const std::string& workdir) {
    JobSpec spec = commandJob(id, 1, {"/usr/bin/python3", "-c", program}, workdir);
    spec.timeoutS = 60;
    return spec;
  }

  // The newest step `client` sees reported for job `id`.
  static std::uint64_t lastStep(AgentClient& client, const std::string& id) {
    auto stream = client.fetch(0, 100000, 0, 5s);
    std::uint64_t last = 0;
    if (!stream) return 0;
    for (const auto& m : stream->messages) {
      if (const auto* r = std::get_if<StepReport>(&m.payload); r && r->jobId == id) last = std::max(last, r->step);
    }
    return last;
  }

  agent::NodeCgroups node;
  std::unique_ptr<UnixUser> alice, bob;
  std::unique_ptr<TempDir> dir;
  std::unique_ptr<AgentProcess> agent;
  std::unique_ptr<ClientKeys> aliceKeys, bobKeys;
};

// Steps reported ten times a second, for ever.
constexpr const char* kReporter =
    "import lockstep, time\n"
    "for i in range(1, 100000):\n"
    "    lockstep.step(samples=1, loss=1.0, step=i)\n"
    "    time.sleep(0.1)\n";

TEST_F(Fences, ARankOverItsMemoryLimitIsKilledAndAnotherUsersJobGoesOn) {
  if (!node.memory.available()) GTEST_SKIP() << "no memory controller for jobs here: " << node.off.front();
  startAgent();
  auto a = connectTo(*agent, *aliceKeys);
  auto b = connectTo(*agent, *bobKeys);
  ASSERT_TRUE(a->startJob(pythonJob("alices", kReporter, workOf(*alice)), "", 10s).ok());
  ASSERT_TRUE(waitUntil([&] { return lastStep(*a, "alices") >= 3; }, 30s)) << "alice's job does not report";

  JobSpec hog = pythonJob("hog", "import time\nb = bytearray(1 << 30)\ntime.sleep(60)\n", workOf(*bob));
  hog.memPerRank = 256u << 20;
  ASSERT_TRUE(b->startJob(hog, "", 10s).ok());
  const auto end = jobEnd(*b, "hog");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->state, JobState::kFailed);
  EXPECT_NE(end->message.find("rank 0 on node-a was killed by the kernel: the job's memory limit of 256.0 MiB per rank "
                              "was reached"),
            std::string::npos)
      << end->message;

  // Alice's job and the agent are untouched: her steps go on.
  const std::uint64_t before = lastStep(*a, "alices");
  EXPECT_TRUE(waitUntil([&] { return lastStep(*a, "alices") >= before + 5; }, 20s));
  const auto alices = jobStatusOn(*a, "alices");
  ASSERT_TRUE(alices.has_value());
  EXPECT_EQ(alices->state, JobState::kRunning);
  EXPECT_TRUE(a->stopJob("alices", 500, 10s).ok());
}

// A restarted agent adopts a user's job: its records still come through (the report channel knows
// its user), its cores stay held, and its cgroups go with it when it ends.
TEST_F(Fences, AnAdoptedJobKeepsReportingHoldsItsCoresAndItsCgroupsGoWithIt) {
  if (!node.memory.available()) GTEST_SKIP() << "no memory controller for jobs here";
  startAgent();
  auto a = connectTo(*agent, *aliceKeys);
  JobSpec spec = pythonJob("adopted", kReporter, workOf(*alice));
  spec.memPerRank = 512u << 20;
  ASSERT_TRUE(a->startJob(spec, "", 10s).ok());
  ASSERT_TRUE(waitUntil([&] { return lastStep(*a, "adopted") >= 3; }, 30s));
  const auto before = jobStatusOn(*a, "adopted");
  ASSERT_TRUE(before.has_value());
  ASSERT_EQ(before->cpus.size(), 1u);
  const std::uint64_t step = lastStep(*a, "adopted");
  a.reset();
  agent->restart();
  a = connectTo(*agent, *aliceKeys);
  EXPECT_TRUE(waitUntil([&] { return lastStep(*a, "adopted") >= step + 5; }, 30s)) << "no steps after the restart";
  const auto after = jobStatusOn(*a, "adopted");
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->cpus, before->cpus);
  EXPECT_EQ(after->memoryLimitBytes, 512u << 20);
  const std::string prefix = agent::partCgroupPrefix("node-a", agent->stateDir());
  const std::string memory = node.memory.base + "/" + prefix + "adopted-0";
  EXPECT_TRUE(fs::exists(memory)) << memory;
  ASSERT_TRUE(a->stopJob("adopted", 500, 10s).ok());
  ASSERT_TRUE(jobEnd(*a, "adopted").has_value());
  EXPECT_TRUE(waitUntil([&] { return !fs::exists(memory); }, 15s)) << memory << " is left";
}

TEST_F(Fences, AForkBombStopsAtItsProcessLimitAndTheJobFailsSayingSo) {
  if (!node.pids.available()) GTEST_SKIP() << "no pids controller for jobs here";
  startAgent();
  auto b = connectTo(*agent, *bobKeys);
  // Children that wait, forked until the kernel says no; then the rank fails.
  const char* bomb =
      "import os, sys, time\n"
      "n = 0\n"
      "while n < 100000:\n"
      "    try:\n"
      "        if os.fork() == 0:\n"
      "            time.sleep(120); os._exit(0)\n"
      "    except OSError as e:\n"
      "        print('fork refused after', n, e, flush=True); sys.exit(3)\n"
      "    n += 1\n";
  JobSpec spec = pythonJob("bomb", bomb, workOf(*bob));
  spec.maxProcessesPerRank = 40;
  ASSERT_TRUE(b->startJob(spec, "", 10s).ok());
  const auto end = jobEnd(*b, "bomb");
  ASSERT_TRUE(end.has_value());
  EXPECT_EQ(end->state, JobState::kFailed);
  EXPECT_NE(end->message.find("exited with exit code 3"), std::string::npos) << end->message;
  EXPECT_NE(end->message.find("the kernel refused it a new process at the job's limit of 40 processes and threads per rank"),
            std::string::npos)
      << end->message;
  auto logs = b->logs("bomb", 0, 4096, 5s);
  ASSERT_TRUE(logs.ok());
  EXPECT_NE(logs->text.find("fork refused after"), std::string::npos) << logs->text;
  EXPECT_TRUE(jobStatusOn(*b, "bomb").has_value()) << "the agent does not answer";
  // What the bomb forked went with it.
  EXPECT_TRUE(waitUntil([&] { return runCommand({"pgrep", "-u", bob->name}, 5s)->status.exitCode == 1; }, 15s));
}

// The cores a job's rank 0 runs on, as the kernel says (it writes them to cpus.txt and waits).
std::vector<int> coresOf(const std::string& work) {
  if (!waitUntil([&] { return fs::exists(work + "/cpus.txt") && fs::file_size(work + "/cpus.txt") > 0; }, 30s)) return {};
  return agent::parseCpuList(readText(work + "/cpus.txt"));
}

constexpr const char* kSayCores = "import os, time\nopen('cpus.txt', 'w').write(','.join(map(str, sorted(os.sched_getaffinity(0)))))\ntime.sleep(60)\n";

TEST_F(Fences, TwoJobsGetCoresOfTheirOwnAndAThirdIsRefusedWithTheFigures) {
  if (node.cpus.size() < 2) GTEST_SKIP() << "this machine has one core";
  startAgent();
  auto a = connectTo(*agent, *aliceKeys);
  auto b = connectTo(*agent, *bobKeys);
  const std::string aliceWork = workOf(*alice), bobWork = workOf(*bob);
  JobSpec first = pythonJob("first", kSayCores, aliceWork);
  first.cpusPerRank = static_cast<std::uint32_t>(node.cpus.size() / 2);
  JobSpec second = pythonJob("second", kSayCores, bobWork);
  second.cpusPerRank = static_cast<std::uint32_t>(node.cpus.size() / 2);
  ASSERT_TRUE(a->startJob(first, "", 10s).ok());
  ASSERT_TRUE(b->startJob(second, "", 10s).ok());
  const auto mine = coresOf(aliceWork), theirs = coresOf(bobWork);
  ASSERT_EQ(mine.size(), node.cpus.size() / 2) << readText(aliceWork + "/cpus.txt");
  ASSERT_EQ(theirs.size(), node.cpus.size() / 2) << readText(bobWork + "/cpus.txt");
  for (int cpu : mine) EXPECT_EQ(std::count(theirs.begin(), theirs.end(), cpu), 0) << "core " << cpu << " is both jobs'";

  // Nothing left: a third job's start says what the node has free and what it asked for.
  auto third = a->startJob(pythonJob("third", "pass", aliceWork), "", 10s);
  ASSERT_FALSE(third.ok());
  const std::string cores = std::to_string(node.cpus.size() % 2) + " of " + std::to_string(node.cpus.size()) + " cores";
  EXPECT_NE(third.error().message.find("node node-a has " + cores), std::string::npos) << third.error().message;
  EXPECT_NE(third.error().message.find("the job asks for 1 cores"), std::string::npos) << third.error().message;
  // More memory than the node has is refused too, before anything runs.
  JobSpec huge = pythonJob("huge", "pass", aliceWork);
  huge.memPerRank = std::uint64_t{1} << 49;
  auto refused = a->startJob(huge, "", 10s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("and 512.0 TiB"), std::string::npos) << refused.error().message;
  EXPECT_TRUE(a->stopJob("first", 500, 10s).ok());
  EXPECT_TRUE(b->stopJob("second", 500, 10s).ok());
}

// What a user types: the flags reach the fences, and `lockstepctl nodes` says what is left.
TEST_F(Fences, LockstepctlsFlagsFenceTheJobAndNodesSaysWhatIsFree) {
  if (!node.memory.available() || node.cpus.size() < 2) GTEST_SKIP() << "no memory controller, or one core";
  startAgent();
  Ctl ctl{*dir, dir->file("config")};
  ASSERT_TRUE(ctl.pairWith(*agent));
  const std::string work = dir->file("root-work");
  fs::create_directories(work);
  const auto started = ctl({"start", "--ranks", "1", "--job-id", "flagged", "--mem-per-rank", "256M", "--cpus-per-rank", "1",
                            "--workdir", work, "--", "/usr/bin/python3", "-c", kSayCores});
  ASSERT_EQ(started.status.exitCode, 0) << started.err;
  ASSERT_EQ(coresOf(work).size(), 1u);
  const auto nodes = ctl({"nodes", "--json"});
  ASSERT_EQ(nodes.status.exitCode, 0) << nodes.err;
  const auto seen = nlohmann::json::parse(nodes.out)[0];
  EXPECT_EQ(seen["free_cores"].get<std::size_t>(), node.cpus.size() - 1) << nodes.out;
  EXPECT_EQ(seen["memory_bytes"].get<std::uint64_t>() - seen["free_memory_bytes"].get<std::uint64_t>(), 256u << 20) << nodes.out;
  EXPECT_EQ(seen["fences_off"].size(), node.off.size()) << nodes.out;
  const auto text = ctl({"nodes"});
  EXPECT_NE(text.out.find("free: " + std::to_string(node.cpus.size() - 1) + " cores"), std::string::npos) << text.out;
  // A size it cannot read is refused with what to write.
  const auto bad = ctl({"start", "--ranks", "1", "--mem-per-rank", "lots", "--", "/bin/true"});
  EXPECT_NE(bad.status.exitCode, 0);
  EXPECT_NE(bad.err.find("--mem-per-rank: 'lots' is not a size: write it as 512K, 256M, 4G or 1T"), std::string::npos) << bad.err;
  EXPECT_EQ(ctl({"stop", "flagged"}).status.exitCode, 0);
}

TEST_F(Fences, ARankCannotOpenADeviceNodeOfAGpuNotItsOwn) {
  if (!node.devices.available()) GTEST_SKIP() << "no device fence for jobs here";
  // Stand-ins with NVIDIA's major: no driver answers for them here, so an open the fence lets
  // through fails with ENXIO (or ENODEV), and one it stops with EPERM.
  const std::string devices = dir->file("dev");
  fs::create_directories(devices);
  ::chmod(devices.c_str(), 0755);
  for (const auto& [name, minor] : {std::pair{"nvidia3", 3u}, std::pair{"nvidiactl", 255u}}) {
    const std::string path = devices + "/" + name;
    ASSERT_EQ(::mknod(path.c_str(), S_IFCHR | 0666, makedev(195, minor)), 0) << path;
    ::chmod(path.c_str(), 0666);
  }
  startAgent();
  auto a = connectTo(*agent, *aliceKeys);
  const std::string work = workOf(*alice);
  const std::string program =
      "import errno, os\n"
      "out = []\n"
      "for name in ('nvidia3', 'nvidiactl'):\n"
      "    try:\n"
      "        os.close(os.open('" + devices + "/' + name, os.O_RDWR)); out.append(name + ' opened')\n"
      "    except OSError as e:\n"
      "        out.append(name + ' ' + errno.errorcode[e.errno])\n"
      "open('devices.txt', 'w').write('\\n'.join(out))\n";
  ASSERT_TRUE(a->startJob(pythonJob("gpus", program, work), "", 10s).ok());
  const auto end = jobEnd(*a, "gpus");
  ASSERT_TRUE(end.has_value());
  const std::string found = readText(work + "/devices.txt");
  EXPECT_NE(found.find("nvidia3 EPERM"), std::string::npos) << found;
  EXPECT_EQ(found.find("nvidiactl EPERM"), std::string::npos) << found;
  EXPECT_NE(found.find("nvidiactl EN"), std::string::npos) << found;  // ENXIO or ENODEV: no driver here
}

}  // namespace
}  // namespace lockstep::test
