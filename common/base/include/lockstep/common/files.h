#pragma once
// Small file helpers with errors that name the file.

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "lockstep/common/result.h"

namespace lockstep {

// Opens a regular file for reading without ever blocking on what is not one: a FIFO, a device or
// a directory is refused with what it is ("is a FIFO, not a file") before it is opened for
// reading. `role` names the file in errors ("the features file").
// `flags`: O_RDONLY or O_RDWR, plus O_NOFOLLOW to refuse a symlink ("is a symbolic link").
Result<int> openRegularFile(const std::string& path, std::string_view role, int flags = O_RDONLY);

// Raises this process's soft limit on open files to its hard limit: a client holds a few files per
// agent it talks to (a supervising agent one connection per node of its job, the app one per agent),
// and desktops start programs at 1,024.
void raiseOpenFilesLimit();
// Puts the soft limit raiseOpenFilesLimit found back, in a child about to exec another program (a
// job's rank gets the limit it would have had, not the agent's): async-signal-safe.
void restoreOpenFilesLimit();

// What kind of file `mode` (st_mode) is, in words: "a FIFO", "a directory", "a character device".
std::string fileKind(unsigned mode);

// Reads a whole file; refuses files larger than maxBytes instead of exhausting memory.
Result<std::string> readFile(const std::string& path, std::uint64_t maxBytes);
// The same for a file already open (openRegularFile); `path` names it in errors.
Result<std::string> readOpenFile(int fd, const std::string& path, std::uint64_t maxBytes);

// Writes `data` to `path` so that readers see the old file or the complete new one, never a
// partial one, even across a crash: temp file in the same directory (created with `mode`),
// fsync, rename, fsync dir.
Result<void> writeFileAtomic(const std::string& path, std::string_view data, unsigned mode = 0644);

// Creates a directory and its parents; a newly made leaf gets `mode`. Succeeds if it exists.
Result<void> makeDirectories(const std::string& path, unsigned mode = 0755);

// Whether `path` is `dir` or lies below it, by their names alone (normalised; no link followed).
bool isWithin(const std::string& path, const std::string& dir);

// The directories each job has a private one of (its /tmp and /dev/shm, docs/security.md).
inline constexpr const char* kPrivateToJobs[] = {"/tmp", "/dev/shm"};
// Which of kPrivateToJobs `path` lies in; "" when none.
std::string privateToJobs(const std::string& path);

// `name` in the directory of the running program (/proc/self/exe), or `name` itself when that
// cannot be read.
std::string besideThisProgram(const std::string& name);

// Text without leading and trailing blanks (spaces, tabs, CR, LF).
std::string trim(std::string_view text);
// The last `lines` lines of `text`, each ending in a newline.
std::string lastLines(std::string_view text, std::size_t lines);

// The settings-file format shared by agent.conf, authorized_keys and known_agents: calls `each`
// with every line that is not blank or a # comment, trimmed, and its 1-based number; stops at the
// first error. A missing file has no lines.
Result<void> forEachSettingsLine(const std::string& path, std::uint64_t maxBytes,
                                 const std::function<Result<void>(const std::string& line, int number)>& each);
// The same over text already read.
Result<void> forEachSettingsLineIn(std::string_view text,
                                   const std::function<Result<void>(const std::string& line, int number)>& each);

}  // namespace lockstep
