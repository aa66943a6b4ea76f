// Issue 2: the common pieces every part relies on: atomic files, child processes and the
// rendezvous store, all for real (files on disk, forked processes, TCP on loopback).

#include <gtest/gtest.h>

#include <filesystem>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <csignal>
#include <thread>

#include "lockstep/common/files.h"
#include "lockstep/common/process.h"
#include "lockstep/common/store.h"
#include "support/test_support.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using test::TempDir;

TEST(Files, AtomicWriteReplacesWholeFileAndLeavesNoTemp) {
  TempDir dir;
  const std::string path = dir.file("state.bin");
  ASSERT_TRUE(writeFileAtomic(path, "first version").ok());
  ASSERT_TRUE(writeFileAtomic(path, "second").ok());
  auto text = readFile(path, 1024);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "second");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

TEST(Files, ReadRefusesMissingAndOversizedFiles) {
  TempDir dir;
  auto missing = readFile(dir.file("nope"), 10);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  ASSERT_TRUE(writeFileAtomic(dir.file("big"), std::string(100, 'x')).ok());
  auto big = readFile(dir.file("big"), 10);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, ErrorCode::kResourceExhausted);
}

TEST(Process, ExitCodesSignalsAndOutput) {
  TempDir dir;
  auto r = test::runProcess({"/bin/sh", "-c", "echo hello; echo oops >&2; exit 7"}, {}, dir);
  EXPECT_EQ(r.status.exitCode, 7);
  EXPECT_EQ(r.out, "hello\n");
  EXPECT_EQ(r.err, "oops\n");
  r = test::runProcess({"/bin/sh", "-c", "kill -9 $$"}, {}, dir);
  EXPECT_EQ(r.status.signal, SIGKILL);
  EXPECT_EQ(r.status.shellCode(), 137);
  r = test::runProcess({"/bin/sh", "-c", "echo $LOCKSTEP_X"}, {{"LOCKSTEP_X", "42"}}, dir);
  EXPECT_EQ(r.out, "42\n");
}

TEST(Process, ExecFailureIsAnErrorNotAChild) {
  SpawnOptions options;
  options.argv = {"/nonexistent/program"};
  auto pid = spawnProcess(options);
  ASSERT_FALSE(pid.ok());
  EXPECT_NE(pid.error().message.find("/nonexistent/program"), std::string::npos);
}

// Issue 13: a command job's ranks start in the job's working directory and read nothing of the
// agent's stdin.
TEST(Process, WorkingDirectoryAndStdinFromDevNull) {
  TempDir dir;
  SpawnOptions options;
  options.argv = {"/bin/sh", "-c", "pwd; cat; echo end"};
  options.workingDir = dir.path().string();
  options.stdinFromDevNull = true;
  options.stdoutPath = dir.file("out");
  auto pid = spawnProcess(options);
  ASSERT_TRUE(pid.ok()) << pid.error().message;
  auto status = waitProcess(*pid, std::chrono::seconds(10));
  ASSERT_TRUE(status.ok() && status->has_value());
  EXPECT_EQ(test::readText(dir.file("out")), std::filesystem::canonical(dir.path()).string() + "\nend\n");

  options.workingDir = dir.file("missing");
  auto refused = spawnProcess(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("cannot enter the working directory " + dir.file("missing")),
            std::string::npos)
      << refused.error().message;
}

TEST(Process, WaitTimesOutThenTerminateStopsTheGroup) {
  SpawnOptions options;
  // The shell's child would survive a kill of the shell alone; the group kill takes both.
  options.argv = {"/bin/sh", "-c", "sleep 30 & wait"};
  options.newProcessGroup = true;
  auto pid = spawnProcess(options);
  ASSERT_TRUE(pid.ok());
  auto waited = waitProcess(*pid, 100ms);
  ASSERT_TRUE(waited.ok());
  EXPECT_FALSE(waited->has_value());
  const auto start = std::chrono::steady_clock::now();
  auto status = terminateProcess(*pid, 2s, true);
  ASSERT_TRUE(status.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  // The shell's `sleep` child is killed too (a zombie awaiting its reaper counts as gone).
  EXPECT_TRUE(test::waitUntil([&] { return test::livingProcessesInGroup(*pid).empty(); }, 3s))
      << "a process of the group survived";
}

// ---- rendezvous store ----

struct StoreFixture : ::testing::Test {
  void SetUp() override {
    auto s = StoreServer::start("127.0.0.1", 0);
    ASSERT_TRUE(s.ok()) << s.error().message;
    server = std::move(s).value();
  }
  std::unique_ptr<StoreClient> client() {
    auto c = StoreClient::connect("127.0.0.1", server->port(), 5s);
    EXPECT_TRUE(c.ok());
    return c.ok() ? std::move(c).value() : nullptr;
  }
  std::unique_ptr<StoreServer> server;
};

TEST_F(StoreFixture, GetWaitsForALaterSet) {
  auto a = client();
  auto b = client();
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(b->set("k", std::string("v\0x", 3)).ok());
  });
  auto value = a->get("k", 5s);
  setter.join();
  ASSERT_TRUE(value.ok()) << value.error().message;
  EXPECT_EQ(*value, std::string("v\0x", 3));
}

TEST_F(StoreFixture, GetTimesOutWithTheKeyInTheMessage) {
  auto a = client();
  const auto start = std::chrono::steady_clock::now();
  auto value = a->get("never", 200ms);
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.error().code, ErrorCode::kTimeout);
  EXPECT_NE(value.error().message.find("never"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_TRUE(a->set("still", "works").ok());
}

TEST_F(StoreFixture, LivenessTracksRegisteredRanks) {
  auto r0 = client();
  auto r1 = client();
  ASSERT_TRUE(r0->registerRank(0).ok());
  ASSERT_TRUE(r1->registerRank(1).ok());
  ASSERT_TRUE(r1->heartbeat(12, RankPhase::kCheckpoint, 5000).ok());
  auto status = r0->status();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->size(), 2u);
  EXPECT_EQ((*status)[1].step, 12);
  EXPECT_EQ((*status)[1].state, RankLiveness::State::kConnected);
  EXPECT_EQ((*status)[1].phase, RankPhase::kCheckpoint);
  EXPECT_GE((*status)[1].millisInPhase, 5000);
  EXPECT_LT((*status)[1].millisInPhase, 9000);

  r1.reset();  // the rank's process goes away
  server->noteRankExit(1, "exited with signal 9 (Killed)");
  ASSERT_TRUE(test::waitUntil(
      [&] {
        auto s = r0->status();
        return s.ok() && (*s)[1].state == RankLiveness::State::kDisconnected;
      },
      3s));
  EXPECT_EQ(r0->status()->at(1).exitNote, "exited with signal 9 (Killed)");
}

TEST_F(StoreFixture, AFailedCallReconnectsAndRegistersAgain) {
  auto r0 = client();
  auto r1 = client();
  ASSERT_TRUE(r1->registerRank(1).ok());
  // A get that times out drops r1's connection (its reply could still be on the way) ...
  ASSERT_FALSE(r1->get("never", std::chrono::milliseconds(100)).ok());
  // ... and the next call reconnects and registers rank 1 again.
  EXPECT_TRUE(r1->set("k", "v").ok());
  ASSERT_TRUE(test::waitUntil(
      [&] {
        auto s = r0->status();
        return s.ok() && s->size() == 1 && (*s)[0].state == RankLiveness::State::kConnected;
      },
      3s));
}

TEST_F(StoreFixture, GarbageAndOversizedFramesDoNotHurtOtherClients) {
  auto good = client();
  for (const std::string& junk : {std::string("\xff\xff\xff\x7f", 4) + "xxxx", std::string("\x03\x00\x00\x00\x63zz", 7)}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(server->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), static_cast<ssize_t>(junk.size()));
    char buf[16];
    // The server closes a connection that speaks nonsense.
    EXPECT_LE(::recv(fd, buf, sizeof buf, 0), 0);
    ::close(fd);
  }
  EXPECT_TRUE(good->set("a", "b").ok());
  EXPECT_EQ(*good->get("a", 1s), "b");
}

TEST(Store, ConnectToNobodyFailsInTimeSayingWhere) {
  const auto port = test::freePort();
  const auto start = std::chrono::steady_clock::now();
  auto c = StoreClient::connect("127.0.0.1", port, 500ms);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(c.error().message.find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST(Store, ServerOnABusyPortSaysSo) {
  auto first = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(first.ok());
  auto second = StoreServer::start("127.0.0.1", (*first)->port());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("MASTER_PORT"), std::string::npos) << second.error().message;
}

}  // namespace
}  // namespace lockstep
