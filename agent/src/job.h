#pragma once
// A job as the job manager holds it, and the file helpers its parts share (jobs.cpp starts, watches
// and stops jobs; job_table.cpp keeps the table on disk and re-adopts ranks). Private to agent/.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "jobs.h"
#include "host.h"
#include "lockstep/common/fd.h"
#include "lockstep/common/files.h"
#include "lockstep/common/identity.h"
#include "lockstep/common/npy.h"
#include "lockstep/common/process.h"
#include "lockstep/common/store.h"

namespace lockstep::agent {

inline int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// A file in a job's directory, which its ranks can write: never through a symlink they planted
// (to the agent's key), never a FIFO that would block the loop; a regular file or nothing.
inline UniqueFd openJobFile(const std::string& path, int flags) {
  auto fd = openRegularFile(path, "the job's file", flags | O_NOFOLLOW);
  return fd ? UniqueFd(*fd) : UniqueFd();
}

// The last `maxBytes` of an open file (and how much more there was).
inline std::string fileTail(int fd, std::uint64_t maxBytes, bool* more, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {};
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t start = size > maxBytes ? size - maxBytes : 0;
  if (more) *more = start > 0;
  std::string text(static_cast<std::size_t>(size - start), '\0');
  if (!readExactly(fd, text.data(), text.size(), start, path)) return {};
  return text;
}

// The last `maxBytes` of a job's file (and how much more there was).
inline std::string fileTail(const std::string& path, std::uint64_t maxBytes, bool* more) {
  UniqueFd fd = openJobFile(path, O_RDONLY);
  if (!fd.valid()) return {};
  return fileTail(fd.get(), maxBytes, more, path);
}

struct Rank {
  RankPlacement placement;
  pid_t pid = -1;  // the rank's keeper: the process group's leader, what the agent waits for
  pid_t programPid = -1;
  std::uint64_t startTicks = 0;
  bool child = true;  // false once adopted by a restarted agent: its exit status is not ours to read
  UniqueFd pidfd;
  JobState state = JobState::kRunning;
  std::optional<ExitStatus> exit;
  bool exitUnknown = false;
  std::string logPath;
  std::uint64_t lastStep = 0;
};

struct JobManager::Job {
  JobSpec spec;
  Identity owner;  // who its ranks run as
  JobState state = JobState::kStarting;
  std::vector<Rank> ranks;
  std::int64_t startedUnixUs = 0;
  std::int64_t endedUnixUs = 0;
  std::string message;
  std::string dir;
  std::unique_ptr<StoreServer> store;
  std::uint32_t storePort = 0;   // the trainer's rendezvous store, when rank 0 runs here
  std::string storeSecret;       // its secret (docs/security.md), which the job's ranks get
  std::uint32_t masterPort = 0;  // a command job's MASTER_PORT, when rank 0 runs here
  bool stopRequested = false;
  std::string stopReason;  // empty: stopped on request
  std::optional<std::chrono::steady_clock::time_point> killAt;
  KeptProcess init;  // the job's init on this node (rank_launch.h), while this agent runs it
  UniqueFd initPidfd;
  std::string cgroup;  // its cgroup (job_cgroup.h), while it has one

  bool running() const { return state == JobState::kStarting || state == JobState::kRunning; }
  bool anyRankRunning() const {
    return std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.state == JobState::kRunning; });
  }
};

}  // namespace lockstep::agent
