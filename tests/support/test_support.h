#pragma once
// Helpers for tests that use real files and real processes.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/common/process.h"

namespace lockstep::test {

// A fresh directory under $TMPDIR (or `base`), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  explicit TempDir(const std::string& base);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

struct ProcessResult {
  ExitStatus status;
  std::string out;
  std::string err;
  double seconds = 0;
  bool timedOut = false;
};

using Env = std::vector<std::pair<std::string, std::string>>;

// The lockstep-trainer binary under test. $LOCKSTEP_TEST_BIN_DIR, when set, holds the binaries
// under test instead of the build tree (a bundle carried to the GPU machine).
std::string trainerPath();
std::string builtBinary(const char* name, const char* builtPath);

// Runs a program to completion (killing it after `timeout`), capturing stdout and stderr in dir.
ProcessResult runProcess(const std::vector<std::string>& argv, const Env& env, const TempDir& dir,
                         std::chrono::milliseconds timeout = std::chrono::seconds(120));

// Starts a program in the background with stdout/stderr going to files in dir; returns its pid.
pid_t startProcess(const std::vector<std::string>& argv, const Env& env, const std::string& stdoutPath,
                   const std::string& stderrPath);

std::string readText(const std::string& path);

// a, then b: command lines built from parts.
std::vector<std::string> join(std::vector<std::string> a, const std::vector<std::string>& b);

// Parses a JSON-lines file.
std::vector<nlohmann::json> readJsonLines(const std::string& path);

// Writes a .npy file (format 1.0) with the given dtype descriptor ("<f4", "<i8", ...) and shape.
void writeNpy(const std::string& path, const std::string& descr, const std::vector<std::uint64_t>& shape,
              const void* data, std::size_t bytes);

// A TCP port that was free a moment ago on 127.0.0.1.
std::uint16_t freePort();

// Polls `done` every 20 ms until it holds or the timeout passes.
bool waitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout);

// Child pids of a process (from /proc), and a process's environment variable.
std::vector<pid_t> childrenOf(pid_t pid);
std::optional<std::string> environOf(pid_t pid, const std::string& name);
// Processes of a process group that are not zombies.
std::vector<pid_t> livingProcessesInGroup(pid_t pgid);

// A process's resident memory in KiB (VmRSS; 0 for this process); -1 when it cannot be read.
std::int64_t residentKib(pid_t pid = 0);

}  // namespace lockstep::test
