#include "jobs/preflight.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "lockstep/common/fd.h"
#include "lockstep/common/files.h"
#include "lockstep/common/npy.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Error unfit(std::string message) { return Error{ErrorCode::kFailedPrecondition, std::move(message)}; }

// Whether the job's user may use `path` as `mode` says (checked with that user's rights:
// FileRightsOf is in force); errno says why not.
bool userMay(const std::string& path, int mode) { return ::faccessat(AT_FDCWD, path.c_str(), mode, AT_EACCESS) == 0; }

Error userMayNot(const PathFacts& f, const std::string& what, const std::string& path) {
  return Error{ErrorCode::kPermissionDenied, f.owner.user + " cannot " + what + " " + path + " on " + f.node + " (" +
                                                 std::strerror(errno) + "): the job runs as " + f.owner.user +
                                                 "; give that user access, or name another path"};
}

// A path under the job's private /tmp or /dev/shm is not the node's: refused, saying so.
Result<void> notPrivate(const std::string& path, const PathFacts& f) {
  const std::string shared = f.privateTmp ? privateToJobs(path) : "";
  if (shared.empty()) return {};
  return unfit(path + " is under " + shared + ", and each job on " + f.node + " has a " + shared +
               " of its own, where it is not: put it elsewhere (/var/tmp, a home or project directory)");
}

Result<void> checkWorkingDir(const std::string& dir, const PathFacts& f) {
  if (dir.empty()) return {};
  LOCKSTEP_TRY(notPrivate(dir, f));
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == EACCES) return userMayNot(f, "enter", dir);
    return unfit("working directory " + dir + " does not exist on " + f.node + " (" + std::strerror(errno) +
                 "): create it there, or choose another (lockstepctl start --workdir DIR)");
  }
  if (!S_ISDIR(st.st_mode)) return unfit("working directory " + dir + " on " + f.node + " is " + fileKind(st.st_mode) + ", not a directory");
  if (!userMay(dir, X_OK)) return userMayNot(f, "enter", dir);
  return {};
}

// Why `path` cannot be run, or "" when it can.
std::string whyNotRunnable(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "it is " + fileKind(st.st_mode) + ", not a program";
  if (!userMay(path, X_OK)) {
    if (errno == EACCES && (st.st_mode & 0111) != 0) return "the job's user may not run it (" + std::string(std::strerror(errno)) + ")";
    return "it is not executable: `chmod +x` it, or run it through its interpreter (-- python3 " + path + ")";
  }
  return "";
}

// A file the job reads: readable by its user when it exists (whether it does is the caller's).
Result<void> readable(const std::string& path, const PathFacts& f) {
  if (path.empty()) return {};
  LOCKSTEP_TRY(notPrivate(path, f));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno != EACCES) return {};
  if (!userMay(path, R_OK)) return userMayNot(f, "read", path);
  return {};
}

// A directory the job writes (its checkpoints): it, or the nearest directory above it that
// exists, writable by the job's user.
Result<void> writableDir(const std::string& dir, const PathFacts& f) {
  if (dir.empty()) return {};
  LOCKSTEP_TRY(notPrivate(dir, f));
  fs::path at = fs::path(dir).lexically_normal();
  struct stat st {};
  while (::stat(at.c_str(), &st) != 0 && errno == ENOENT && at.has_parent_path() && at != at.parent_path()) {
    at = at.parent_path();
  }
  if (!userMay(at.string(), W_OK | X_OK)) return userMayNot(f, "write", at.string());
  return {};
}

Result<std::string> resolveProgram(const CommandSpec& c, const std::string& pathVar, const std::string& node) {
  const std::string& name = c.argv.front();
  if (name.find('/') != std::string::npos) {
    if (name.front() != '/' && c.workingDir.empty()) {
      return unfit("program " + name + " is a relative path and the job has no working directory: give an "
                   "absolute path, or a working directory (--workdir)");
    }
    const std::string path = name.front() == '/' ? name : (fs::path(c.workingDir) / name).string();
    if (const std::string why = whyNotRunnable(path); !why.empty()) {
      return unfit("program " + path + " cannot be run on " + node + ": " + why);
    }
    return path;
  }
  std::string lastWhy;
  std::size_t start = 0;
  while (start <= pathVar.size()) {
    const std::size_t colon = std::min(pathVar.find(':', start), pathVar.size());
    const std::string dir = pathVar.substr(start, colon - start);
    start = colon + 1;
    if (dir.empty() || dir.front() != '/') continue;  // a relative PATH entry means the agent's directory: never
    const std::string candidate = (fs::path(dir) / name).string();
    const std::string why = whyNotRunnable(candidate);
    if (why.empty()) return candidate;
    if (::access(candidate.c_str(), F_OK) == 0) lastWhy = candidate + ": " + why;
  }
  if (!lastWhy.empty()) return unfit("program " + name + " cannot be run on " + node + ": " + lastWhy);
  return unfit("program " + name + " is not found on " + node + " (PATH=" + pathVar +
               "): install it there, give its absolute path, or set PATH in the job's environment (--env PATH=...)");
}

std::string pathOf(const CommandSpec& c, const std::string& agentPath) {
  for (const auto& [name, value] : c.env) {
    if (name == "PATH") return value;
  }
  return agentPath;
}

}  // namespace

Result<CheckedPaths> checkJobPaths(const JobSpec& spec, const PathFacts& facts) {
  // Everything below with the job's user's rights, not the agent's (for this thread only).
  const FileRightsOf rights(facts.owner);
  if (!rights.ok()) return unfit("cannot check the job's paths as " + facts.owner.user + " on " + facts.node + ": " + rights.why());
  CheckedPaths out;
  if (spec.command) {
    LOCKSTEP_TRY(checkWorkingDir(spec.command->workingDir, facts));
    LOCKSTEP_ASSIGN_OR_RETURN(out.program, resolveProgram(*spec.command, pathOf(*spec.command, facts.agentPath), facts.node));
    LOCKSTEP_TRY(notPrivate(out.program, facts));
    return out;
  }
  LOCKSTEP_TRY(notPrivate(facts.trainerPath, facts));
  if (const std::string why = whyNotRunnable(facts.trainerPath); !why.empty()) {
    return unfit("the trainer " + facts.trainerPath + " cannot be run on " + facts.node + " (" + why +
                 "): set --trainer when starting the agent");
  }
  out.program = facts.trainerPath;
  if (const auto* npy = std::get_if<NpyDataset>(&spec.dataset)) {
    LOCKSTEP_TRY(readable(npy->featuresPath, facts));
    LOCKSTEP_TRY(readable(npy->labelsPath, facts));
    LOCKSTEP_TRY(checkNpyDataset(npy->featuresPath, npy->labelsPath, spec.layers.front()));
  }
  LOCKSTEP_TRY(writableDir(spec.checkpointDir, facts));
  // Initial weights are read by rank 0 only, on its own node: checked where they are.
  LOCKSTEP_TRY(readable(spec.initWeightsPath, facts));
  return out;
}

// ---- running checks off the loop ----

Preflight::Preflight(std::chrono::milliseconds deadline) : deadline_(deadline) {}
Preflight::~Preflight() = default;  // checks still running finish alone (off_loop.h)

int Preflight::wakeFd() const { return checks_.wakeFd(); }

Result<void> Preflight::submit(std::uint64_t id, Check check, const std::string& node) {
  const Error busy{ErrorCode::kResourceExhausted, "node " + node + " is still checking the paths of " +
                                                      std::to_string(kMaxInFlight) +
                                                      " jobs (a hung file system?); try again later"};
  LOCKSTEP_TRY(checks_.submit(id, std::move(check), busy, "check the job's paths"));
  waiting_.push_back(Waiting{id, Clock::now() + deadline_, node});
  return {};
}

std::vector<Preflight::Done> Preflight::take() {
  std::vector<Done> out;
  for (auto& done : checks_.take()) {
    const auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return w.id == done.id; });
    if (it == waiting_.end()) continue;  // answered already, at its deadline
    waiting_.erase(it);
    out.push_back(std::move(done));
  }
  const auto now = Clock::now();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (now < it->deadline) {
      ++it;
      continue;
    }
    out.push_back(Done{it->id, timeoutError("checking the job's paths on " + it->node + " took longer than " +
                                            std::to_string(deadline_.count()) +
                                            " ms (a hung network file system, or a very slow disk? the agent's "
                                            "path-check-timeout-ms sets the limit)")});
    it = waiting_.erase(it);
  }
  return out;
}

Clock::time_point Preflight::nextDeadline() const {
  auto next = Clock::time_point::max();
  for (const auto& w : waiting_) next = std::min(next, w.deadline);
  return next;
}

}  // namespace lockstep::agent
