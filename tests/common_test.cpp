// Issue 2: the common pieces every part relies on: atomic files and child processes, all for real
// (files on disk, forked processes). The rendezvous store has store_test.cpp.

#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <csignal>
#include <thread>

#include "lockstep/common/files.h"
#include "lockstep/common/process.h"
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

// Issue 14: the temp name was ".NAME.tmp.PID", so anyone who could write the directory could plant
// a symlink there and have the writer truncate and fill the file it points to.
TEST(Files, APlantedTempFileSymlinkIsNeverFollowed) {
  TempDir dir;
  const std::string victim = dir.file("victim");
  ASSERT_TRUE(writeFileAtomic(victim, "precious").ok());
  const std::string path = dir.file("ckpt.safetensors");
  for (const std::string& planted : {".ckpt.safetensors.tmp." + std::to_string(::getpid()), std::string(".ckpt.safetensors.tmp")}) {
    ASSERT_EQ(::symlink(victim.c_str(), dir.file(planted).c_str()), 0);
  }
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(writeFileAtomic(path, "checkpoint " + std::to_string(i)).ok());
  EXPECT_EQ(*readFile(victim, 64), "precious");
  EXPECT_EQ(*readFile(path, 64), "checkpoint 19");
}

TEST(Files, AtomicWritesFollowTheUmask) {
  TempDir dir;
  const mode_t old = ::umask(077);
  const auto written = writeFileAtomic(dir.file("private"), "x", 0644);
  ::umask(022);
  const auto secret = writeFileAtomic(dir.file("secret"), "x", 0600);
  ::umask(old);
  ASSERT_TRUE(written.ok() && secret.ok());
  struct stat st {};
  ASSERT_EQ(::stat(dir.file("private").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "umask 077 must narrow 0644";
  ASSERT_EQ(::stat(dir.file("secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "a 0600 file must not widen";
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

// A keeper's exit record (issue 14) reads back as what was written, and nothing else passes for one.
TEST(Files, LastLinesEachEndInANewline) {
  EXPECT_EQ(lastLines("a\nb\nc\n", 2), "b\nc\n");
  EXPECT_EQ(lastLines("a\nb\nc", 2), "b\nc\n") << "a last line without its newline gets one";
  EXPECT_EQ(lastLines("a\nb\n", 5), "a\nb\n") << "fewer lines than asked: all of them";
  EXPECT_EQ(lastLines("a\nb\n", 0), "");
  EXPECT_EQ(lastLines("", 3), "");
}

TEST(Process, AnExitRecordReadsBackAndNothingElseDoes) {
  for (const ExitStatus& s : {ExitStatus{0, 0}, ExitStatus{3, 0}, ExitStatus{0, 9}, ExitStatus{255, 0}}) {
    const auto back = ExitStatus::fromRecord(s.record());
    ASSERT_TRUE(back.has_value()) << s.record();
    EXPECT_EQ(back->exitCode, s.exitCode);
    EXPECT_EQ(back->signal, s.signal);
  }
  EXPECT_EQ((ExitStatus{0, 9}.record()), "signal 9\n");
  for (const char* bad : {"", "exit 3", "exit 256\n", "exit -1\n", "exit 3x\n", "quit 3\n", "signal \n"}) {
    EXPECT_FALSE(ExitStatus::fromRecord(bad).has_value()) << bad;
  }
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

// Issue 14: what a job's rank sees of the agent's state directory. Run as the agent's user would
// be: as this test's user, and (when that is root) once more as an unprivileged one, which takes
// the user-namespace path.
std::string sandboxedProbe(const std::string& state, const std::string& out) {
  SpawnOptions spawn;
  spawn.argv = {"/bin/sh", "-c",
                "{ cat " + state + "/agent.key; cat " + state + "/jobs/j/data; ls -A " + state + " " + state + "/jobs; cd " + state +
                    "/jobs/j && cat ../../agent.key; umount " + state + " && cat " + state + "/agent.key; } >" + out +
                    " 2>&1"};
  spawn.sandbox = SpawnOptions::Sandbox{state, {state + "/jobs/j"}, {}};
  auto pid = spawnProcess(spawn);
  if (!pid) return "spawn failed: " + pid.error().message;
  auto status = waitProcess(*pid, std::chrono::seconds(20));
  return status && *status ? test::readText(out) : "the probe did not finish";
}

void makeState(const std::string& state) {
  std::filesystem::create_directories(state + "/jobs/j");
  std::filesystem::create_directories(state + "/jobs/other");
  ASSERT_TRUE(writeFileAtomic(state + "/agent.key", "SECRET-KEY", 0600).ok());
  ASSERT_TRUE(writeFileAtomic(state + "/jobs/j/data", "job-data", 0600).ok());
}

TEST(Process, ASandboxedChildSeesOnlyWhatItKeeps) {
  TempDir dir;
  const std::string state = dir.file("state");
  makeState(state);
  const std::string seen = sandboxedProbe(state, dir.file("out"));
  EXPECT_EQ(seen.find("SECRET-KEY"), std::string::npos) << seen;
  EXPECT_NE(seen.find("job-data"), std::string::npos) << seen;
  EXPECT_EQ(seen.find("other"), std::string::npos) << "another job's directory was visible: " << seen;
}

TEST(Process, ASandboxedChildOfAnUnprivilegedUserSeesOnlyWhatItKeeps) {
  if (::geteuid() != 0) GTEST_SKIP() << "the test above ran this path already, as this unprivileged user";
  const std::string base = "/tmp/lockstep-sandbox-" + std::to_string(::getpid());
  std::filesystem::remove_all(base);
  const std::string state = base + "/state";
  makeState(state);
  for (const auto& p : std::filesystem::recursive_directory_iterator(base)) ::chown(p.path().c_str(), 65534, 65534);
  ::chown(base.c_str(), 65534, 65534);
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
      ::_exit(3);
    }
    const std::string seen = sandboxedProbe(state, base + "/out");
    const bool ok = seen.find("SECRET-KEY") == std::string::npos && seen.find("job-data") != std::string::npos;
    std::fprintf(stderr, "%s\n", seen.c_str());
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::filesystem::remove_all(base);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
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

}  // namespace
}  // namespace lockstep
