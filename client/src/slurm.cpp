#include "lockstep/client/slurm.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "lockstep/common/files.h"
#include "lockstep/common/process.h"
#include "lockstep/protocol/validate.h"

namespace lockstep::slurm {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A Slurm tool's run: its output, or an error that says what it said.
Result<std::string> tool(const std::vector<std::string>& argv, milliseconds timeout) {
  auto ran = runCommand(argv, timeout);
  if (!ran && ran.error().code == ErrorCode::kNotFound) {
    return Error{ErrorCode::kUnavailable, argv[0] + " is not on PATH: run this on a Slurm login host (docs/cluster.md)"};
  }
  if (!ran) return ran.error().withContext(argv[0]);
  if (!ran->status.success()) {
    return Error{ErrorCode::kFailedPrecondition, argv[0] + " failed (" + ran->status.describe() + "): " + trim(ran->err + ran->out)};
  }
  return ran->out;
}

// Single quotes for sh: nothing inside is expanded.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The line each of the allocation's tasks runs: one agent, its state and announcement under the
// job's directory, by node number.
std::string agentLine(const AgentsLaunch& l) {
  return "exec " + quoted(l.agentProgram) + " --listen tcp://0.0.0.0:0" +
         " --state-dir \"$D/node-$SLURM_NODEID\" --announce \"$D/node-$SLURM_NODEID.agent\"" +
         " --authorized-keys \"$D/authorized_keys\" --slurm-job \"$SLURM_JOB_ID\" --exit-when-idle-s " +
         std::to_string(l.lingerS);
}

std::string srunLine(const AgentsLaunch& l, const std::string& dir) {
  return "srun --nodes=" + std::to_string(l.allocation.nodes) + " --ntasks-per-node=1 --kill-on-bad-exit=0 " +
         "/bin/sh -c " + quoted("D=" + quoted(dir) + "; " + agentLine(l));
}

std::string batchScript(const AgentsLaunch& l, const std::string& dir) {
  const Allocation& a = l.allocation;
  std::string s = "#!/bin/sh\n# Written by lockstepctl start --slurm for Lockstep job " + l.lockstepJobId +
                  ": one lockstep-agent per node (docs/cluster.md).\n";
  s += "#SBATCH --job-name=lockstep-" + l.lockstepJobId + "\n";
  s += "#SBATCH --nodes=" + std::to_string(a.nodes) + "\n#SBATCH --ntasks-per-node=1\n";
  if (a.gpusPerNode > 0) s += "#SBATCH --gpus-per-node=" + std::to_string(a.gpusPerNode) + "\n";
  if (!a.time.empty()) s += "#SBATCH --time=" + a.time + "\n";
  if (!a.partition.empty()) s += "#SBATCH --partition=" + a.partition + "\n";
  if (!a.account.empty()) s += "#SBATCH --account=" + a.account + "\n";
  s += "#SBATCH --output=" + dir + "/slurm-%j.out\n";
  return s + "exec " + srunLine(l, dir) + "\n";
}

// Slurm's own words for a field the user typed into a #SBATCH line: no line breaks, no spaces.
Result<void> checkField(const char* flag, const std::string& value) {
  if (value.find_first_of(" \t\r\n'\"\\") != std::string::npos) {
    return invalidArgument(std::string(flag) + " '" + value + "' holds a space, quote or line break; give Slurm's own value");
  }
  return {};
}

std::string lastLines(const std::string& path, std::size_t lines) {
  auto text = readFile(path, 1u << 20);
  if (!text) return {};
  std::vector<std::string> all;
  std::stringstream in(*text);
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += all[i] + "\n";
  return out;
}

}  // namespace

bool JobInfo::ended() const {
  static const std::set<std::string> alive = {"PENDING",  "RUNNING",  "CONFIGURING", "COMPLETING", "SUSPENDED",
                                              "REQUEUED", "RESIZING", "SIGNALING",   "STAGE_OUT",  "REQUEUE_HOLD"};
  return !alive.count(state);
}

std::string JobInfo::endState() const {
  if (!ending()) return state;
  if (reason == "TimeLimit") return "TIMEOUT";
  return reason.empty() || reason == "None" ? "CANCELLED" : state;
}

std::string JobInfo::describe() const {
  return "Slurm job " + id + ": " + endState() + (reason.empty() || reason == "None" ? "" : " (" + reason + ")");
}

Result<JobInfo> parseJobInfo(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::stringstream words(line);
  for (std::string word; words >> word;) {
    const auto eq = word.find('=');
    if (eq != std::string::npos && eq > 0) fields.emplace(word.substr(0, eq), word.substr(eq + 1));
  }
  JobInfo info;
  info.id = fields["JobId"];
  info.state = fields["JobState"];
  if (info.id.empty() || info.state.empty()) return invalidArgument("not a line of `scontrol show job -o`: " + line.substr(0, 200));
  info.reason = fields["Reason"];
  info.exitCode = fields["ExitCode"];
  info.nodes = static_cast<std::uint32_t>(std::strtoul(fields["NumNodes"].c_str(), nullptr, 10));
  const std::string& tres = fields["TRES"];
  if (const auto at = tres.find("gres/gpu="); at != std::string::npos) {
    info.gpus = static_cast<std::uint32_t>(std::strtoul(tres.c_str() + at + 9, nullptr, 10));
  }
  return info;
}

Result<JobInfo> query(const std::string& slurmJobId, milliseconds timeout) {
  auto out = tool({"scontrol", "show", "job", "-o", slurmJobId}, timeout);
  if (!out && out.error().message.find("Invalid job id") != std::string::npos) {
    return Error{ErrorCode::kNotFound, "Slurm no longer knows job " + slurmJobId + " (it ended a while ago)"};
  }
  if (!out) return out.error();
  return parseJobInfo(trim(*out));
}

Result<void> cancel(const std::string& slurmJobId, milliseconds timeout) {
  LOCKSTEP_TRY(tool({"scancel", slurmJobId}, timeout));
  return {};
}

std::string jobDirectory(const std::string& lockstepJobId) {
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".lockstep" / "slurm" / lockstepJobId).string();
}

Result<Started> startAgents(const AgentsLaunch& l, milliseconds timeout) {
  LOCKSTEP_TRY(validateJobId(l.lockstepJobId));  // it names a directory and the batch job
  for (const auto& [flag, value] : {std::pair("--time", l.allocation.time), {"--partition", l.allocation.partition},
                                    {"--account", l.allocation.account}}) {
    LOCKSTEP_TRY(checkField(flag, value));
  }
  const std::string dir = jobDirectory(l.lockstepJobId);
  std::error_code ec;
  if (fs::exists(dir, ec)) return invalidArgument("job " + l.lockstepJobId + " already ran through Slurm (" + dir + "); give another --job-id");
  LOCKSTEP_TRY(makeDirectories(dir, 0700));
  fs::permissions(fs::path(dir).parent_path(), fs::perms::owner_all, ec);
  LOCKSTEP_TRY(writeFileAtomic(dir + "/authorized_keys", l.clientPublicKey + " lockstepctl\n", 0600));
  Started started;
  if (const char* inside = std::getenv("SLURM_JOB_ID"); inside && *inside) {
    // Inside an allocation: the agents are a step of it, left running when lockstepctl exits.
    const std::string srun = findOnPath("srun");
    if (srun.empty()) return Error{ErrorCode::kUnavailable, "SLURM_JOB_ID is set but srun is not on PATH"};
    SpawnOptions spawn;
    spawn.argv = {"/bin/sh", "-c", srunLine(l, dir)};
    spawn.stdoutPath = spawn.stderrPath = dir + "/srun.out";
    spawn.newProcessGroup = true;
    spawn.stdinFromDevNull = true;
    LOCKSTEP_TRY(spawnProcess(spawn));
    started = {inside, false};
  } else {
    const std::string script = dir + "/job.sbatch";
    LOCKSTEP_TRY(writeFileAtomic(script, batchScript(l, dir), 0700));
    LOCKSTEP_ASSIGN_OR_RETURN(const std::string out, tool({"sbatch", "--parsable", script}, timeout));
    started = {trim(out.substr(0, out.find(';'))), true};  // --parsable: ID or ID;CLUSTER
    if (started.slurmJobId.empty()) return Error{ErrorCode::kFailedPrecondition, "sbatch printed no job id"};
  }
  LOCKSTEP_TRY(writeFileAtomic(dir + "/slurm-job", started.slurmJobId + (started.submitted ? " submitted\n" : " allocation\n"), 0600));
  return started;
}

Result<Started> startedFor(const std::string& lockstepJobId) {
  const std::string path = jobDirectory(lockstepJobId) + "/slurm-job";
  std::error_code ec;
  if (!fs::exists(path, ec)) return Error{ErrorCode::kNotFound, "job " + lockstepJobId + " was not started through Slurm"};
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string text, readFile(path, 256));
  std::stringstream words(text);
  Started s;
  std::string how;
  words >> s.slurmJobId >> how;
  s.submitted = how == "submitted";
  return s;
}

std::vector<Announced> announced(const std::string& lockstepJobId) {
  std::vector<Announced> out;
  const std::string dir = jobDirectory(lockstepJobId);
  for (std::uint32_t node = 0;; ++node) {
    auto text = readFile(dir + "/node-" + std::to_string(node) + ".agent", 4096);
    if (!text) break;
    std::stringstream words(*text);
    Announced a;
    if (!(words >> a.address >> a.publicKey)) break;
    out.push_back(a);
  }
  return out;
}

Result<std::vector<Announced>> waitForAgents(const std::string& lockstepJobId, const std::string& slurmJobId,
                                             std::uint32_t nodes, milliseconds timeout,
                                             const std::function<bool(const JobInfo&)>& progress) {
  const auto deadline = Clock::now() + timeout;
  auto nextQuery = Clock::now();
  while (true) {
    auto agents = announced(lockstepJobId);
    if (agents.size() >= nodes) return agents;
    if (Clock::now() >= nextQuery) {
      nextQuery = Clock::now() + milliseconds(2000);
      LOCKSTEP_ASSIGN_OR_RETURN(const JobInfo info, query(slurmJobId, milliseconds(10000)));
      if (!progress(info)) return Error{ErrorCode::kCancelled, "gave up waiting for " + info.describe()};
      if (info.ended()) {
        const std::string dir = jobDirectory(lockstepJobId);
        const std::string output = lastLines(dir + "/slurm-" + slurmJobId + ".out", 5) + lastLines(dir + "/srun.out", 5);
        return Error{ErrorCode::kFailedPrecondition, info.describe() + " ended before its agents started" +
                                             (output.empty() ? "" : "; it said:\n" + output)};
      }
      if (Clock::now() >= deadline) {
        return timeoutError(info.describe() + ": " + std::to_string(agents.size()) + " of " + std::to_string(nodes) +
                            " agents started within " + std::to_string(timeout.count() / 1000) + " s");
      }
    }
    std::this_thread::sleep_for(milliseconds(250));
  }
}

Result<std::optional<std::string>> cancelSubmitted(const std::string& lockstepJobId, milliseconds timeout) {
  auto started = startedFor(lockstepJobId);
  if (!started && started.error().code == ErrorCode::kNotFound) return std::optional<std::string>();
  if (!started) return started.error();
  if (!started->submitted) return std::optional<std::string>();
  LOCKSTEP_TRY(cancel(started->slurmJobId, timeout));
  return std::optional(started->slurmJobId);
}

}  // namespace lockstep::slurm
