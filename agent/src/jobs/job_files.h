#pragma once
// Files of a job's directory, which its ranks can write, read safely from the agent and given to
// the job's user; and a rank's pidfd. The job manager, its table and rank processes (jobs/) and the
// evidence taker (stalls/evidence.cpp) share them.

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "lockstep/common/fd.h"
#include "lockstep/common/files.h"
#include "lockstep/common/identity.h"
#include "lockstep/common/npy.h"
#include "lockstep/common/result.h"

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

// `path` given to the job's user, where the agent runs as root and the job does not.
inline Result<void> giveToOwner(const Identity& owner, const std::string& path) {
  if (::geteuid() != 0 || owner.uid == 0) return {};
  if (::lchown(path.c_str(), owner.uid, owner.gid) != 0) {
    return errnoError("cannot give " + path + " to " + owner.user, errno);
  }
  return {};
}

}  // namespace lockstep::agent
