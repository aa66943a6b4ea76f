// Issue 3: the agent's parts on their own.

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "loop/config.h"
#include "lockstep/net/keys.h"
#include "lockstep/protocol/validate.h"
#include "sensors/nvml.h"
#include "jobs/preflight.h"
#include "jobs/rank_launch.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/progress.h"
#include "stalls/stall_watch.h"
#include "stream/stream_buffer.h"
#include "support/test_support.h"

namespace lockstep::agent {
namespace {

using test::TempDir;

GpuSample sample(std::uint32_t gpu) {
  GpuSample s;
  s.node = "n";
  s.gpuIndex = gpu;
  return s;
}

TEST(StreamBuffer, NumbersFetchesAndForgetsTheOldest) {
  std::vector<std::uint64_t> reserved;
  StreamBuffer buffer("node-a", 1, 5, [&](std::uint64_t upTo) {
    reserved.push_back(upTo);
    return Result<void>{};
  });
  for (std::uint32_t i = 0; i < 8; ++i) ASSERT_EQ(*buffer.append(sample(i)), i + 1);
  EXPECT_EQ(reserved, std::vector<std::uint64_t>{StreamBuffer::kReserveBlock});  // reserved before the first
  EXPECT_EQ(buffer.lastSeq(), 8u);
  EXPECT_EQ(buffer.firstSeq(), 4u);  // capacity 5: 4..8 kept
  auto f = buffer.fetch(5, 2, 99);
  EXPECT_EQ(f.instanceId, 99u);
  EXPECT_EQ(f.firstSeq, 4u);
  ASSERT_EQ(f.messages.size(), 2u);
  EXPECT_EQ(f.messages[0].seq, 6u);
  EXPECT_EQ(std::get<GpuSample>(f.messages[1].payload).gpuIndex, 6u);
  EXPECT_EQ(f.messages[0].node, "node-a");
  // A client behind the buffer gets what is left and can see the jump from firstSeq.
  f = buffer.fetch(1, 100, 99);
  ASSERT_EQ(f.messages.size(), 5u);
  EXPECT_EQ(f.messages.front().seq, 4u);
  EXPECT_TRUE(buffer.fetch(8, 100, 99).messages.empty());
  EXPECT_FALSE(buffer.hasAfter(8));
}

// Issue 14: with the state disk full, numbers beyond the reserved block were handed out anyway,
// and an agent restarted afterwards handed them out again, so a client skipped those messages.
TEST(StreamBuffer, NoNumberIsHandedOutBeforeItIsReservedSoARestartNeverReusesOne) {
  bool full = false;
  std::uint64_t persisted = 0;
  auto reserve = [&](std::uint64_t upTo) -> Result<void> {
    if (full) return errnoError("cannot write seq", ENOSPC);
    persisted = upTo;
    return {};
  };
  std::uint64_t handedOut = 0;
  {
    StreamBuffer first("n", 1, 100, reserve, 10);
    for (int i = 0; i < 10; ++i) handedOut = *first.append(sample(0));
    full = true;
    for (int i = 0; i < 5; ++i) {
      auto seq = first.append(sample(static_cast<std::uint32_t>(i + 1)));
      ASSERT_FALSE(seq.ok());
      EXPECT_NE(seq.error().message.find("No space left"), std::string::npos) << seq.error().message;
    }
    EXPECT_EQ(first.lastSeq(), 10u) << "numbers handed out that no reservation covers";
    EXPECT_EQ(first.waiting(), 5u);
    full = false;
    handedOut = *first.append(sample(6));
    EXPECT_EQ(handedOut, 16u) << "the waiting messages are numbered first, in order";
    auto f = first.fetch(10, 10, 1);
    ASSERT_EQ(f.messages.size(), 6u);
    for (std::uint32_t i = 0; i < 6; ++i) EXPECT_EQ(std::get<GpuSample>(f.messages[i].payload).gpuIndex, i + 1);
    full = true;
    for (int i = 0; i < 300; ++i) (void)first.append(sample(0));  // the block runs out again
    EXPECT_LE(first.lastSeq(), persisted);
    EXPECT_EQ(first.waiting(), 100u) << "at most `capacity` wait";
    EXPECT_GT(first.droppedWaiting(), 0u);
    handedOut = first.lastSeq();
  }
  full = false;
  StreamBuffer second("n", persisted + 1, 100, reserve, 10);
  EXPECT_GT(*second.append(sample(0)), handedOut);
}

TEST(StreamBuffer, ARestartContinuesAfterTheReservedBlock) {
  std::uint64_t persisted = 0;
  auto reserve = [&](std::uint64_t upTo) {
    persisted = upTo;
    return Result<void>{};
  };
  {
    StreamBuffer first("n", 1, 100, reserve);
    for (int i = 0; i < 3; ++i) (void)first.append(sample(0));
  }
  StreamBuffer second("n", persisted + 1, 100, reserve);
  EXPECT_EQ(*second.append(sample(0)), StreamBuffer::kReserveBlock + 1);
  EXPECT_EQ(persisted, 2 * StreamBuffer::kReserveBlock);
}

TEST(Nvml, NoLibraryMeansACpuOnlyNodeSaidPlainly) {
  std::string why;
  auto nvml = Nvml::load("libnvidia-ml-that-does-not-exist.so.1", &why);
  EXPECT_EQ(nvml, nullptr);
  EXPECT_NE(why.find("CPU-only node"), std::string::npos) << why;
}

TEST(Nvml, LoadsTheNewestSymbolsAndKeepsUnsupportedMetricsUnknown) {
  std::string why;
  auto nvml = Nvml::load(LOCKSTEP_FAKE_NVML_PATH, &why);
  ASSERT_NE(nvml, nullptr) << why;
  EXPECT_TRUE(why.empty());
  ASSERT_EQ(nvml->gpus().size(), 2u);
  EXPECT_EQ(nvml->gpus()[1].name, "Fake GPU 1");
  EXPECT_EQ(nvml->gpus()[1].uuid, "GPU-fake-1");
  EXPECT_EQ(nvml->gpus()[0].memoryTotalBytes, 80ull << 30);
  const auto withPower = nvml->read(0, true);
  EXPECT_EQ(withPower.powerMilliwatts, 300000u);
  EXPECT_EQ(withPower.energyMillijoules, 123456u);
  EXPECT_EQ(withPower.utilizationPct, 50.0f);
  EXPECT_EQ(nvml->read(0, false).energyMillijoules, std::nullopt);  // the slow counter only when asked
  const auto withoutPower = nvml->read(1, true);
  EXPECT_EQ(withoutPower.powerMilliwatts, std::nullopt) << "unsupported must stay unknown, not 0";
  EXPECT_EQ(withoutPower.energyMillijoules, std::nullopt);
  EXPECT_EQ(withoutPower.memoryUsedBytes, 2ull << 30);
  EXPECT_EQ(withoutPower.temperatureC, 60);
}

TEST(AgentConfig, FlagsOverTheConfigFile) {
  TempDir dir;
  std::ofstream(dir.file("agent.conf")) << "# comment\nlisten = tcp://0.0.0.0:7800\nsample_hz = 10\nname = from-file\n";
  auto c = parseAgentArgs({"--state-dir", dir.path().string(), "--name", "from-flag"});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->listen, "tcp://0.0.0.0:7800");
  EXPECT_EQ(c->listenHost(), "0.0.0.0");
  EXPECT_EQ(c->sampleHz, 10u);
  EXPECT_EQ(c->name, "from-flag");
  EXPECT_EQ(c->keepJobs, 100u);
  EXPECT_EQ(parseAgentArgs({"--state-dir", dir.path().string(), "--keep-jobs", "5"})->keepJobs, 5u);
  for (auto [args, text] : std::initializer_list<std::pair<std::vector<std::string>, const char*>>{
           {{"--state-dir", dir.path().string(), "--sample-hz", "50"}, "from 1 to 20"},
           {{"--state-dir", dir.path().string(), "--keep-jobs", "0"}, "--keep-jobs"},
           {{"--state-dir", dir.path().string(), "--listen", "udp://x"}, "expected tcp://HOST:PORT"},
           {{"--state-dir", dir.path().string(), "--colour", "red"}, "unknown setting 'colour'"},
           {{"--config", dir.file("missing.conf")}, "no such file"}}) {
    auto bad = parseAgentArgs(args);
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.error().message.find(text), std::string::npos) << bad.error().message;
  }
}

// Issue 8: the Debian package keeps authorized keys in /etc/lockstep (a conffile), apart from the
// agent's state in /var/lib.
// Found running the examples: with a relative --state-dir, ranks that start in another working
// directory got a relative LOCKSTEP_REPORT (ipc://state/report.sock) and every report was lost.
TEST(AgentConfig, TheStateDirectoryIsMadeAbsolute) {
  TempDir dir;
  const auto before = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  auto c = parseAgentArgs({"--state-dir", "relative/state", "--trainer", "bin/trainer"});
  std::filesystem::current_path(before);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->stateDir, (dir.path() / "relative/state").string());
  EXPECT_EQ(c->trainer, (dir.path() / "bin/trainer").string());
}

TEST(AgentConfig, AuthorizedKeysFileFromTheConfigFile) {
  TempDir dir;
  auto defaults = parseAgentArgs({"--state-dir", dir.path().string()});
  ASSERT_TRUE(defaults.ok()) << defaults.error().message;
  EXPECT_EQ(defaults->authorizedKeysPath(), dir.file("authorized_keys"));
  std::ofstream(dir.file("agent.conf")) << "state-dir = " << dir.file("state") << "\nauthorized-keys = /etc/lockstep/authorized_keys\n";
  auto c = parseAgentArgs({"--config", dir.file("agent.conf")});
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->stateDir, dir.file("state"));
  EXPECT_EQ(c->authorizedKeysPath(), "/etc/lockstep/authorized_keys");
  EXPECT_EQ(c->logPath(), dir.file("state/agent.log"));
}

TEST(Keys, PairsFingerprintsAndAuthorizedKeys) {
  TempDir dir;
  bool created = false;
  auto pair = loadOrCreateKeyPair(dir.file("k"), "agent", &created);
  ASSERT_TRUE(pair.ok()) << pair.error().message;
  EXPECT_TRUE(created);
  EXPECT_EQ(std::filesystem::status(dir.file("k/agent.key")).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto again = loadOrCreateKeyPair(dir.file("k"), "agent", &created);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(again->publicKey, pair->publicKey);
  EXPECT_EQ(fingerprint(pair->publicKey).rfind("SHA256:", 0), 0u);
  EXPECT_EQ(fingerprint(pair->publicKey).size(), 7u + 43u);

  std::filesystem::permissions(dir.file("k/agent.key"), std::filesystem::perms::others_read, std::filesystem::perm_options::add);
  auto exposed = loadKeyPair(dir.file("k"), "agent");
  ASSERT_FALSE(exposed.ok());
  EXPECT_NE(exposed.error().message.find("chmod 600"), std::string::npos);

  std::ofstream(dir.file("authorized")) << "# who may connect\n" << pair->publicKey << " alice@laptop\n\n";
  auto keys = readAuthorizedKeys(dir.file("authorized"));
  ASSERT_TRUE(keys.ok());
  EXPECT_TRUE(keys->allows(pair->publicKey));
  EXPECT_EQ(keys->byKey.at(pair->publicKey).comment, "alice@laptop");
  EXPECT_FALSE(keys->allows(generateKeyPair()->publicKey));
  std::ofstream(dir.file("broken")) << "not-a-key comment\n";
  auto broken = readAuthorizedKeys(dir.file("broken"));
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.error().message.find("line 1"), std::string::npos);
  EXPECT_TRUE(readAuthorizedKeys(dir.file("none"))->byKey.empty());
}


// Issue 13: an admin refuses command jobs per key, as sshd's options in authorized_keys do.
TEST(Keys, AuthorizedKeysOptions) {
  TempDir dir;
  const auto a = generateKeyPair()->publicKey, b = generateKeyPair()->publicKey;
  std::ofstream(dir.file("authorized")) << a << " alice@laptop\n" << "no-command-jobs " << b << " ci runner\n";
  auto keys = readAuthorizedKeys(dir.file("authorized"));
  ASSERT_TRUE(keys.ok()) << keys.error().message;
  EXPECT_TRUE(keys->allowsCommandJobs(a));
  EXPECT_TRUE(keys->allows(b));
  EXPECT_FALSE(keys->allowsCommandJobs(b));
  EXPECT_EQ(keys->byKey.at(b).comment, "ci runner");
  std::ofstream(dir.file("typo")) << "no-comand-jobs " << b << "\n";
  auto typo = readAuthorizedKeys(dir.file("typo"));
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.error().message.find("unknown option 'no-comand-jobs'"), std::string::npos) << typo.error().message;
}

// Issue 33: a key maps to a Unix user, with the options of the example written either way.
TEST(Keys, AKeyCarriesItsUserAndRights) {
  TempDir dir;
  const auto a = generateKeyPair()->publicKey, b = generateKeyPair()->publicKey, c = generateKeyPair()->publicKey;
  std::ofstream(dir.file("authorized")) << "user=alice no-command-jobs " << a << " alice@laptop\n"
                                        << "user=root,allow-root,admin " << b << " the admin\n"
                                        << c << " nobody in particular\n";
  auto keys = readAuthorizedKeys(dir.file("authorized"));
  ASSERT_TRUE(keys.ok()) << keys.error().message;
  const KeyGrant& alice = keys->byKey.at(a);
  EXPECT_EQ(alice.user, "alice");
  EXPECT_FALSE(alice.commandJobs);
  EXPECT_FALSE(alice.admin);
  EXPECT_EQ(alice.comment, "alice@laptop");
  const KeyGrant& admin = keys->byKey.at(b);
  EXPECT_EQ(admin.user, "root");
  EXPECT_TRUE(admin.allowRoot && admin.admin && admin.commandJobs);
  EXPECT_EQ(keys->byKey.at(c).user, "");
  for (const std::string bad : {"user= ", "user=-rf ", "user=a/b "}) {
    std::ofstream(dir.file("bad")) << bad << a << "\n";
    auto refused = readAuthorizedKeys(dir.file("bad"));
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.error().message.find("is not a Unix user name"), std::string::npos) << refused.error().message;
  }
}

// The checks run on their own thread: a check that hangs is answered at its deadline and
// abandoned, and a node with too many hung checks says so instead of starting more threads.
TEST(Preflight, AHungCheckIsAnsweredAtItsDeadlineAndTheRestGoOn) {
  using namespace std::chrono_literals;
  Preflight preflight(1000ms);
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto hang = [release]() -> Result<CheckedPaths> {
    while (!release->load()) std::this_thread::sleep_for(5ms);
    return CheckedPaths{"/late"};
  };
  ASSERT_TRUE(preflight.submit(1, hang, "node-a"));
  ASSERT_TRUE(preflight.submit(2, [] { return Result<CheckedPaths>(CheckedPaths{"/bin/true"}); }, "node-a"));
  std::vector<Preflight::Done> done;
  const auto start = std::chrono::steady_clock::now();
  while (done.size() < 2 && std::chrono::steady_clock::now() - start < 10s) {
    for (auto& d : preflight.take()) done.push_back(std::move(d));
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].id, 2u);  // the quick one first, not behind the hung one
  EXPECT_EQ(done[0].result->program, "/bin/true");
  EXPECT_EQ(done[1].id, 1u);
  ASSERT_FALSE(done[1].result);
  EXPECT_EQ(done[1].result.error().code, ErrorCode::kTimeout);
  EXPECT_NE(done[1].result.error().message.find("node-a"), std::string::npos);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1000ms);

  for (std::uint64_t id = 10; id < 10 + Preflight::kMaxInFlight - 1; ++id) ASSERT_TRUE(preflight.submit(id, hang, "node-a"));
  auto refused = preflight.submit(99, hang, "node-a");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kResourceExhausted);
  release->store(true);  // the abandoned result arrives late and is dropped
  std::this_thread::sleep_for(100ms);
  for (const auto& d : preflight.take()) EXPECT_NE(d.id, 1u);
}

TEST(Preflight, FindsTheProgramAndSaysWhyOneCannotRun) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("bin"));
  std::ofstream(dir.file("bin/tool")) << "#!/bin/sh\n";
  ::chmod(dir.file("bin/tool").c_str(), 0755);
  std::ofstream(dir.file("bin/plain")) << "data\n";
  const PathFacts facts{"node-a", "/nonexistent/lockstep-trainer", "relative:" + dir.file("bin") + ":/usr/bin"};
  JobSpec spec;
  spec.command = CommandSpec{{"tool", "--flag"}, dir.path().string(), {}};
  auto found = checkJobPaths(spec, facts);
  ASSERT_TRUE(found) << found.error().message;
  EXPECT_EQ(found->program, dir.file("bin/tool"));
  spec.command->argv[0] = "plain";
  auto plain = checkJobPaths(spec, facts);
  ASSERT_FALSE(plain);
  EXPECT_NE(plain.error().message.find("bin/plain: it is not executable"), std::string::npos) << plain.error().message;
  spec.command->argv[0] = "bin/tool";  // relative to the working directory
  EXPECT_EQ(checkJobPaths(spec, facts)->program, dir.file("bin/tool"));
  spec.command->env = {{"PATH", "/nowhere"}};  // the job's PATH, not the agent's
  spec.command->argv[0] = "tool";
  auto elsewhere = checkJobPaths(spec, facts);
  ASSERT_FALSE(elsewhere);
  EXPECT_NE(elsewhere.error().message.find("not found on node-a (PATH=/nowhere)"), std::string::npos);
  JobSpec trainerJob;
  auto noTrainer = checkJobPaths(trainerJob, facts);
  ASSERT_FALSE(noTrainer);
  EXPECT_NE(noTrainer.error().message.find("set --trainer"), std::string::npos) << noTrainer.error().message;
}

// What a command job's rank gets (docs/own-program.md): torchrun's variables, the node's job GPUs
// in local-rank order (so that cuda:LOCAL_RANK is its own), and the job's variables on top.
TEST(RankLaunch, TorchrunsEnvironmentAndGpusInLocalRankOrder) {
  JobSpec spec;
  spec.jobId = "j";
  spec.backend = Backend::kCuda;
  spec.worldSize = 4;
  spec.ranks = {{0, "a", 0, 0u}, {1, "a", 1, 1u}, {2, "b", 1, 7u}, {3, "b", 0, 5u}};
  spec.command = CommandSpec{{"python3", "train.py"}, "/work", {{"OMP_NUM_THREADS", "3"}, {"PYTHONPATH", "/mine"}}};
  NodeLaunch node{&spec, {spec.ranks[2], spec.ranks[3]}, "/usr/bin/python3", "10.0.0.1", 29511, "ipc:///r", 16, "",
                  "/state/jobs/j", "/opt/lockstep/python", "", ""};
  const SpawnOptions o = rankSpawnOptions(node, "b", spec.ranks[2], "/state/jobs/j/rank-2.log");
  const auto env = [&](const std::string& name) {
    for (const auto& [n, v] : o.env) {
      if (n == name) return v;
    }
    return std::string("<unset>");
  };
  EXPECT_EQ(o.argv, (std::vector<std::string>{"python3", "train.py"}));
  EXPECT_EQ(o.executable, "/usr/bin/python3");
  EXPECT_EQ(o.workingDir, "/work");
  EXPECT_EQ(env("RANK"), "2");
  EXPECT_EQ(env("LOCAL_RANK"), "1");
  EXPECT_EQ(env("LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(env("GROUP_RANK"), "1");
  EXPECT_EQ(env("GROUP_WORLD_SIZE"), "2");
  EXPECT_EQ(env("MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(env("MASTER_PORT"), "29511");
  EXPECT_EQ(env("CUDA_VISIBLE_DEVICES"), "5,7");  // local rank 0's GPU first
  EXPECT_EQ(env("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
  EXPECT_EQ(env("OMP_NUM_THREADS"), "3");  // the job's own value wins
  // The package, and its boot/ directory whose sitecustomize loads the stack dumper (issue 32).
  EXPECT_EQ(env("PYTHONPATH"), "/mine:/opt/lockstep/python:/opt/lockstep/python/boot");
  EXPECT_EQ(env("LOCKSTEP_PROGRESS"), node.jobDir + "/progress-2");
  EXPECT_EQ(env("LOCKSTEP_STACKS"), node.jobDir + "/stacks-2.txt");
  EXPECT_EQ(env("LOCKSTEP_REPORT"), "ipc:///r");
  EXPECT_EQ(env("LOCKSTEP_AGENT_STORE"), "<unset>");  // the program has its own store
  EXPECT_TRUE(o.stdinFromDevNull);
  EXPECT_TRUE(o.newProcessGroup);
  // Every variable the agent sets is one a job may not set itself (validate.cpp's list), but for
  // the defaults a job may change: the two lists cannot drift apart.
  spec.command->env.clear();
  for (const auto& [name, value] : rankSpawnOptions(node, "b", spec.ranks[2], "/log").env) {
    if (name == "OMP_NUM_THREADS" || name == "PYTHONPATH") continue;
    EXPECT_TRUE(isRankVariable(name)) << name << " is set for ranks but a job's environment may set it too";
  }
}

// Issue 46: a stall is judged the moment a rank's allowance runs out, not on the next periodic
// read: the agent's loop wakes at dueUs().
TEST(StallWatch, IsDueTheMillisecondARanksAllowanceRunsOutFromItsRecordsOwnTime) {
  TempDir dir;
  const std::string path = dir.file("progress.0");
  ASSERT_TRUE(progress::create(path));
  progress::Writer writer(path);
  writer.stepDone(1, "data");
  const WatchedJob job{"j", 1, OnStall::kReport, false, {WatchedRank{0, ::getpid(), ::getpgrp(), path, "", ""}}};
  StallWatch watch;
  EXPECT_EQ(watch.dueUs(), std::numeric_limits<std::int64_t>::max()) << "nothing read yet";
  ASSERT_TRUE(watch.tick({job}).empty());
  const std::int64_t moved = progress::read(path)->stepBeganUs;
  const std::int64_t due = watch.dueUs();
  EXPECT_EQ(due, moved + 1'001'000) << "1 s (--stall-after-s 1) and a millisecond after the step began";
  std::this_thread::sleep_for(std::chrono::microseconds(std::max<std::int64_t>(0, due - unixMicrosNow() - 100'000)));
  auto changes = watch.tick({job});
  // A loaded machine may have slept past the moment: only a look that ended before it must see no stall.
  if (unixMicrosNow() < due) EXPECT_TRUE(changes.empty()) << "before it is due: not stalled";
  if (changes.empty()) {
    std::this_thread::sleep_for(std::chrono::microseconds(std::max<std::int64_t>(0, due - unixMicrosNow())));
    changes = watch.tick({job});
  }
  ASSERT_EQ(changes.size(), 1u) << "due: stalled";
  EXPECT_TRUE(changes[0].began);
  EXPECT_EQ(changes[0].stall.sinceUnixUs, moved) << "since its last progress, as its record stamped it";
  EXPECT_EQ(watch.dueUs(), std::numeric_limits<std::int64_t>::max()) << "a stalled job is due nothing";
  writer.stepDone(2, "data");
  ASSERT_EQ(watch.tick({job}).size(), 1u) << "it moved: the stall ended";
  EXPECT_GT(watch.dueUs(), due) << "due again, from the new step";
}

}  // namespace
}  // namespace lockstep::agent
