#include "lockstep/common/files.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <filesystem>
#include <sstream>

#include "lockstep/common/fd.h"

namespace lockstep {
namespace {

Result<void> writeAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError("cannot write " + path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

rlimit g_filesBefore{};  // set once, before any thread could fork
bool g_filesRaised = false;

}  // namespace

void raiseOpenFilesLimit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0 || files.rlim_cur >= files.rlim_max) return;
  g_filesBefore = files;
  files.rlim_cur = files.rlim_max;
  g_filesRaised = ::setrlimit(RLIMIT_NOFILE, &files) == 0;
}

void restoreOpenFilesLimit() {
  if (g_filesRaised) ::setrlimit(RLIMIT_NOFILE, &g_filesBefore);
}

std::string fileKind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
  }
  return "not a file";
}

Result<int> openRegularFile(const std::string& path, std::string_view role, int flags) {
  const std::string who = std::string(role) + " " + path;
  // O_PATH opens nothing for I/O: a FIFO without a writer, or a device, cannot block or react here.
  UniqueFd probe(::open(path.c_str(), O_PATH | O_CLOEXEC | (flags & O_NOFOLLOW)));
  if (!probe.valid()) return errnoError("cannot open " + who, errno);
  struct stat st {};
  if (::fstat(probe.get(), &st) != 0) return errnoError("cannot stat " + who, errno);
  if (!S_ISREG(st.st_mode)) return invalidArgument(who + " is " + fileKind(st.st_mode) + ", not a file");
  // O_NONBLOCK: should the path be swapped for a FIFO in between, open still returns at once.
  UniqueFd fd(::open(path.c_str(), flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd.valid()) return errnoError("cannot open " + who, errno);
  struct stat again {};
  if (::fstat(fd.get(), &again) != 0) return errnoError("cannot stat " + who, errno);
  if (again.st_dev != st.st_dev || again.st_ino != st.st_ino || !S_ISREG(again.st_mode)) {
    return invalidArgument(who + " changed while it was being opened; try again");
  }
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  return fd.release();
}

Result<std::string> readFile(const std::string& path, std::uint64_t maxBytes) {
  LOCKSTEP_ASSIGN_OR_RETURN(const int raw, openRegularFile(path, "file"));
  UniqueFd fd(raw);
  return readOpenFile(fd.get(), path, maxBytes);
}

Result<std::string> readOpenFile(int fd, const std::string& path, std::uint64_t maxBytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errnoError("cannot stat " + path, errno);
  if (static_cast<std::uint64_t>(st.st_size) > maxBytes) {
    return Error{ErrorCode::kResourceExhausted,
                 path + " is " + std::to_string(st.st_size) + " bytes, more than the limit of " +
                     std::to_string(maxBytes)};
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError("cannot read " + path, errno);
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

namespace {

// A new temp file beside `target`, with a name nobody can guess, made by this call: O_EXCL and
// O_NOFOLLOW, so a name planted in the directory (a symlink to a victim file) is never opened.
Result<int> createTempBeside(const std::filesystem::path& dir, const std::filesystem::path& target, unsigned mode,
                             std::string& tmp) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    unsigned char random[8];
    if (::getrandom(random, sizeof random, 0) != static_cast<ssize_t>(sizeof random)) {
      return errnoError("cannot get random bytes for a temp file name", errno);
    }
    std::string suffix;
    for (unsigned char c : random) suffix += "0123456789abcdef"[c >> 4], suffix += "0123456789abcdef"[c & 15];
    tmp = (dir / ("." + target.filename().string() + ".tmp." + suffix)).string();
    // The mode is narrowed by the umask, as for any file a program creates.
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) return fd;
    if (errno != EEXIST) return errnoError("cannot create " + tmp, errno);
  }
  return ioError("cannot create a temp file beside " + target.string() + ": every name tried exists");
}

}  // namespace

Result<void> writeFileAtomic(const std::string& path, std::string_view data, unsigned mode) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  std::string tmp;
  {
    LOCKSTEP_ASSIGN_OR_RETURN(const int raw, createTempBeside(dir, target, mode, tmp));
    UniqueFd fd(raw);
    if (auto written = writeAll(fd.get(), data, tmp); !written) {
      ::unlink(tmp.c_str());
      return written.error();
    }
    if (::fsync(fd.get()) != 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      return errnoError("cannot fsync " + tmp, err);
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return errnoError("cannot rename " + tmp + " to " + path, err);
  }
  // The rename is durable only once the directory entry is on disk.
  UniqueFd dirFd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dirFd.get() >= 0) ::fsync(dirFd.get());
  return {};
}

Result<void> makeDirectories(const std::string& path, unsigned mode) {
  std::error_code ec;
  const bool created = std::filesystem::create_directories(path, ec);
  if (ec) return ioError("cannot create directory " + path + ": " + ec.message());
  if (!std::filesystem::is_directory(path)) return invalidArgument(path + " exists and is not a directory");
  // Only a directory we made gets our mode; an existing one keeps the mode its owner chose.
  if (created) ::chmod(path.c_str(), mode);
  return {};
}

bool isWithin(const std::string& path, const std::string& dir) {
  const auto relative = std::filesystem::path(path).lexically_normal().lexically_relative(
      std::filesystem::path(dir).lexically_normal());
  return !relative.empty() && *relative.begin() != "..";
}

std::string privateToJobs(const std::string& path) {
  for (const char* shared : kPrivateToJobs) {
    if (isWithin(path, shared)) return shared;
  }
  return "";
}

std::string besideThisProgram(const std::string& name) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return name;
  return (std::filesystem::path(std::string(self, static_cast<size_t>(n))).parent_path() / name).string();
}

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return std::string(text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1));
}

std::string lastLines(std::string_view text, std::size_t lines) {
  std::size_t at = text.size();
  if (at > 0 && text[at - 1] == '\n') --at;  // the last line's own newline
  for (std::size_t n = 0; at > 0 && lines > 0; --at) {
    if (text[at - 1] == '\n' && ++n == lines) break;
  }
  std::string out(lines == 0 ? std::string_view() : text.substr(at));
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

Result<void> forEachSettingsLine(const std::string& path, std::uint64_t maxBytes,
                                 const std::function<Result<void>(const std::string& line, int number)>& each) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(const auto text, readFile(path, maxBytes));
  return forEachSettingsLineIn(text, each);
}

Result<void> forEachSettingsLineIn(std::string_view text,
                                   const std::function<Result<void>(const std::string& line, int number)>& each) {
  std::istringstream lines{std::string(text)};
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    line = trim(line);
    if (line.empty() || line[0] == '#') continue;
    LOCKSTEP_TRY(each(line, number));
  }
  return {};
}

}  // namespace lockstep
