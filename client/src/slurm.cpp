#include "lockstep/client/slurm.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lockstep/common/files.h"
#include "lockstep/common/identity.h"
#include "lockstep/common/process.h"
#include "lockstep/net/keys.h"
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
// job's directory, by node number; its metrics on a port of its own, named for Prometheus in the
// metrics directory.
std::string agentLine(const AgentsLaunch& l) {
  return "exec " + quoted(l.agentProgram) + " --listen tcp://0.0.0.0:0" +
         " --state-dir \"$D/node-$SLURM_NODEID\" --announce \"$D/node-$SLURM_NODEID.agent\"" +
         " --authorized-keys \"$D/authorized_keys\" --slurm-job \"$SLURM_JOB_ID\" --exit-when-idle-s " +
         std::to_string(l.lingerS) + " --metrics-listen 0.0.0.0:0 --metrics-targets \"$M/" + l.lockstepJobId +
         "-node-$SLURM_NODEID.json\"";
}

// --overlap: the agents' step shares the allocation with any step the user runs beside it.
// Since Slurm 22.05 a step does not inherit the job's --cpus-per-task: it is given again.
std::string srunCommand(const AgentsLaunch& l, const std::string& dir) {
  const std::uint32_t cpus = l.allocation.cpusPerNode;
  return "srun --nodes=" + std::to_string(l.allocation.nodes) + " --ntasks-per-node=1 --overlap --kill-on-bad-exit=0 " +
         (cpus ? "--cpus-per-task=" + std::to_string(cpus) + " " : "") + "/bin/sh -c " +
         quoted("D=" + quoted(dir) + "; M=" + quoted(metricsTargetsDirectory()) + "; " + agentLine(l));
}

// The agents' step, then the end of the job (also when Slurm ends it: SIGTERM reaches this shell
// too): its directory goes, the line saying which Slurm job ran it stays (startedFor), and the
// ranks' logs go where the user asked (--slurm-logs), if anywhere. A directory whose agents never
// all announced themselves (launchAgents marks it) stays: its output says why.
std::string stepThenEnd(const AgentsLaunch& l, const std::string& dir) {
  std::string s = "D=" + quoted(dir) + "; E=" + quoted(endedDirectory()) + "; M=" + quoted(metricsTargetsDirectory()) +
                  "; J=" + quoted(l.lockstepJobId) + "; L=" + quoted(l.logsDir) + "\n";
  s += "end() {\n"
       "  [ -e \"$D/announced\" ] || return 0\n"
       "  mkdir -p \"$E\" && cp \"$D/slurm-job\" \"$E/$J\" 2>/dev/null\n"
       "  if [ -n \"$L\" ]; then\n"
       "    for f in \"$D\"/node-*/jobs/*/rank-*.log*; do\n"
       "      [ -f \"$f\" ] || continue; n=${f#\"$D\"/}; n=${n%%/*}; mkdir -p \"$L/$n\" && cp \"$f\" \"$L/$n/\"\n"
       "    done\n"
       "  fi\n"
       "  rm -f \"$M/$J\"-node-*.json; rm -rf \"$D\"\n"
       "}\n"
       "trap 'trap - TERM; end; exit 143' TERM\n";
  return s + srunCommand(l, dir) + "\nstatus=$?\ntrap - TERM\nend\nexit $status\n";
}

std::string batchScript(const AgentsLaunch& l, const std::string& dir) {
  const Allocation& a = l.allocation;
  std::string s = "#!/bin/sh\n# Written by lockstepctl start --slurm for Lockstep job " + l.lockstepJobId +
                  ": one lockstep-agent per node (docs/cluster.md).\n";
  s += "#SBATCH --job-name=lockstep-" + l.lockstepJobId + "\n";
  s += "#SBATCH --nodes=" + std::to_string(a.nodes) + "\n#SBATCH --ntasks-per-node=1\n";
  if (a.gpusPerNode > 0) s += "#SBATCH --gpus-per-node=" + std::to_string(a.gpusPerNode) + "\n";
  // The agent is the node's one task and its ranks are the agent's children: they share what the
  // task was given. Slurm's default is one CPU, so whole nodes unless told how many.
  s += a.cpusPerNode ? "#SBATCH --cpus-per-task=" + std::to_string(a.cpusPerNode) + "\n" : "#SBATCH --exclusive\n";
  if (!a.time.empty()) s += "#SBATCH --time=" + a.time + "\n";
  if (!a.partition.empty()) s += "#SBATCH --partition=" + a.partition + "\n";
  if (!a.account.empty()) s += "#SBATCH --account=" + a.account + "\n";
  return s + stepThenEnd(l, dir);
}

// Slurm's own words for a field the user typed into a #SBATCH line: no line breaks, no spaces.
Result<void> checkField(const char* flag, const std::string& value) {
  if (value.find_first_of(" \t\r\n'\"\\") != std::string::npos) {
    return invalidArgument(std::string(flag) + " '" + value + "' holds a space, quote or line break; give Slurm's own value");
  }
  return {};
}

std::string lastLinesOf(const std::string& path, std::size_t lines) {
  auto text = readFile(path, 1u << 20);
  return text ? lastLines(*text, lines) : std::string();
}

// N of "node-N.agent", the name an agent announces itself under.
std::optional<std::uint32_t> nodeNumber(const std::string& name) {
  const std::string head = "node-", tail = ".agent";
  if (name.size() <= head.size() + tail.size() || name.rfind(head, 0) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  if (digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return static_cast<std::uint32_t>(std::stoul(digits));
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

// $HOME, or the password database's home when it is unset (as under some batch systems); never a
// shared directory such as /tmp, where another user could write the agents' addresses.
fs::path lockstepHome() {
  const char* home = std::getenv("HOME");
  const passwd* user = home && *home ? nullptr : ::getpwuid(::getuid());
  const std::string base = home && *home ? home : user && user->pw_dir ? user->pw_dir : "";
  return fs::path(base.empty() ? "/nonexistent-home" : base) / ".lockstep";
}

std::string jobDirectory(const std::string& lockstepJobId) { return (lockstepHome() / "slurm" / lockstepJobId).string(); }
std::string endedDirectory() { return (lockstepHome() / "slurm" / "ended").string(); }
std::string metricsTargetsDirectory() { return (lockstepHome() / "metrics").string(); }

std::vector<std::string> clientKeys(const std::string& configDir) {
  std::vector<std::string> out;
  for (const char* name : {"client", "app"}) {
    if (auto keys = loadKeyPair(configDir, name)) out.push_back(keys->publicKey);
  }
  return out;
}

Result<Started> startAgents(const AgentsLaunch& l, milliseconds timeout) {
  LOCKSTEP_TRY(validateJobId(l.lockstepJobId));  // it names a directory and the batch job
  for (const auto& [flag, value] : {std::pair("--time", l.allocation.time), {"--partition", l.allocation.partition},
                                    {"--account", l.allocation.account}}) {
    LOCKSTEP_TRY(checkField(flag, value));
  }
  if (const char* inside = std::getenv("SLURM_JOB_ID"); inside && *inside) {
    const Allocation& a = l.allocation;
    if (!a.time.empty() || !a.partition.empty() || !a.account.empty() || a.cpusPerNode) {
      return invalidArgument(std::string("inside Slurm job ") + inside +
                             " (SLURM_JOB_ID is set) its own time, partition, account and CPUs apply: leave out "
                             "--time, --partition, --account and --cpus-per-node, or run outside the allocation");
    }
  }
  const std::string dir = jobDirectory(l.lockstepJobId);
  std::error_code ec;
  for (const auto& trace : {fs::path(dir), fs::path(endedDirectory()) / l.lockstepJobId}) {
    if (fs::exists(trace, ec)) {
      return invalidArgument("job " + l.lockstepJobId + " already ran through Slurm (" + trace.string() + "); give another --job-id");
    }
  }
  if (!l.logsDir.empty() && !fs::path(l.logsDir).is_absolute()) return invalidArgument("--slurm-logs " + l.logsDir + ": give an absolute path");
  LOCKSTEP_TRY(makeDirectories(dir, 0700));
  fs::permissions(fs::path(dir).parent_path(), fs::perms::owner_all, ec);
  // Prometheus may run as another user: it reads the metrics directory (addresses, no secrets),
  // and passes through ~/.lockstep (which it cannot list).
  LOCKSTEP_TRY(makeDirectories(metricsTargetsDirectory(), 0755));
  fs::permissions(lockstepHome(), fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::add, ec);
  if (!l.logsDir.empty()) LOCKSTEP_TRY(makeDirectories(l.logsDir, 0700));
  const std::string output = (l.logsDir.empty() ? dir : l.logsDir) + "/slurm-%j.out";
  if (l.clientPublicKeys.empty()) return invalidArgument("no client key to let in (run `lockstepctl keygen` first)");
  // The agents run as this user (Slurm runs the batch job as its submitter): the keys' jobs do too.
  const Identity self = currentIdentity();
  const std::string options = "user=" + self.user + (self.uid == 0 ? " allow-root " : " ");
  std::string authorized;
  for (const auto& key : l.clientPublicKeys) authorized += options + key + " lockstep-client\n";
  LOCKSTEP_TRY(writeFileAtomic(dir + "/authorized_keys", authorized, 0600));
  Started started;
  if (const char* inside = std::getenv("SLURM_JOB_ID"); inside && *inside) {
    // Inside an allocation: the agents are a step of it, left running when lockstepctl exits.
    const std::string srun = findOnPath("srun");
    if (srun.empty()) return Error{ErrorCode::kUnavailable, "SLURM_JOB_ID is set but srun is not on PATH"};
    SpawnOptions spawn;
    spawn.argv = {"/bin/sh", "-c", stepThenEnd(l, dir)};
    spawn.stdoutPath = spawn.stderrPath = (l.logsDir.empty() ? dir : l.logsDir) + "/srun.out";
    spawn.newProcessGroup = true;
    spawn.stdinFromDevNull = true;
    LOCKSTEP_ASSIGN_OR_RETURN(const pid_t step, spawnProcess(spawn));
    started = {inside, false, step, l.logsDir};
  } else {
    const std::string script = dir + "/job.sbatch";
    LOCKSTEP_TRY(writeFileAtomic(script, batchScript(l, dir), 0700));
    LOCKSTEP_ASSIGN_OR_RETURN(const std::string out, tool({"sbatch", "--parsable", "--output=" + output, script}, timeout));
    started = {trim(out.substr(0, out.find(';'))), true, -1, l.logsDir};  // --parsable: ID or ID;CLUSTER
    if (started.slurmJobId.empty()) return Error{ErrorCode::kFailedPrecondition, "sbatch printed no job id"};
  }
  LOCKSTEP_TRY(writeFileAtomic(dir + "/slurm-job", started.slurmJobId + (started.submitted ? " submitted\n" : " allocation\n"), 0600));
  return started;
}

Result<Started> startedFor(const std::string& lockstepJobId) {
  // While it runs, its directory says; once it ended, the line kept of it.
  std::string path = jobDirectory(lockstepJobId) + "/slurm-job";
  std::error_code ec;
  if (!fs::exists(path, ec)) path = (fs::path(endedDirectory()) / lockstepJobId).string();
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
  std::map<std::uint32_t, Announced> byNode;  // nodes announce in any order
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(jobDirectory(lockstepJobId), ec)) {
    const std::string name = entry.path().filename().string();
    const auto node = nodeNumber(name);
    if (!node) continue;
    auto text = readFile(entry.path().string(), 4096);
    if (!text) continue;
    std::stringstream words(*text);
    Announced a;
    if (words >> a.address >> a.publicKey) byNode[*node] = a;
  }
  std::vector<Announced> out;
  for (auto& [node, a] : byNode) out.push_back(std::move(a));
  return out;
}

namespace {

// What the job's Slurm output and srun's said last, for an error.
std::string outputOf(const std::string& lockstepJobId, const Started& started) {
  const std::string dir = started.outputDir.empty() ? jobDirectory(lockstepJobId) : started.outputDir;
  const std::string output = lastLinesOf(dir + "/slurm-" + started.slurmJobId + ".out", 5) + lastLinesOf(dir + "/srun.out", 5);
  return output.empty() ? "" : "; it said:\n" + output;
}

}  // namespace

Result<std::vector<Announced>> waitForAgents(const std::string& lockstepJobId, const Started& started,
                                             std::uint32_t nodes, milliseconds timeout,
                                             const std::function<bool(const JobInfo&)>& progress) {
  const auto deadline = Clock::now() + timeout;
  auto nextQuery = Clock::now();
  while (true) {
    auto agents = announced(lockstepJobId);
    if (agents.size() >= nodes) return agents;
    if (started.stepPid > 0) {
      auto exited = waitProcess(started.stepPid, milliseconds(0));
      if (exited && *exited) {
        return Error{ErrorCode::kFailedPrecondition, "the srun that starts the agents in Slurm job " + started.slurmJobId +
                                                         " ended (" + (*exited)->describe() + ") before they started" +
                                                         outputOf(lockstepJobId, started)};
      }
    }
    if (Clock::now() >= nextQuery) {
      nextQuery = Clock::now() + milliseconds(2000);
      LOCKSTEP_ASSIGN_OR_RETURN(const JobInfo info, query(started.slurmJobId, milliseconds(10000)));
      if (!progress(info)) return Error{ErrorCode::kCancelled, "gave up waiting for " + info.describe()};
      if (info.ended()) {
        return Error{ErrorCode::kFailedPrecondition,
                     info.describe() + " ended before its agents started" + outputOf(lockstepJobId, started)};
      }
      if (Clock::now() >= deadline) {
        return timeoutError(info.describe() + ": " + std::to_string(agents.size()) + " of " + std::to_string(nodes) +
                            " agents started within " + std::to_string(timeout.count() / 1000) + " s");
      }
    }
    std::this_thread::sleep_for(milliseconds(250));
  }
}

Result<Agents> launchAgents(const AgentsLaunch& launch, milliseconds toolTimeout, milliseconds waitTimeout,
                            const std::function<bool(const std::string&)>& say) {
  const std::uint32_t nodes = launch.allocation.nodes;
  LOCKSTEP_ASSIGN_OR_RETURN(const Started started, startAgents(launch, toolTimeout));
  const std::string agents = std::to_string(nodes) + " agent" + (nodes == 1 ? "" : "s");
  const bool go = say(started.submitted ? "submitted Slurm job " + started.slurmJobId + " for job " + launch.lockstepJobId +
                                              "; waiting for its " + agents
                                        : "in allocation, Slurm job " + started.slurmJobId + ": starting job " +
                                              launch.lockstepJobId + "'s " + agents);
  std::string said;  // each change of Slurm's state once
  auto announcedAgents = waitForAgents(launch.lockstepJobId, started, nodes, waitTimeout, [&](const JobInfo& info) {
    if (info.describe() == said) return go;
    return say(said = info.describe()) && go;
  });
  if (!announcedAgents) {
    Error e = announcedAgents.error();
    if (started.submitted) {
      const auto cancelled = cancel(started.slurmJobId, toolTimeout);
      e.message += cancelled ? "; cancelled Slurm job " + started.slurmJobId : "; " + cancelled.error().message;
    }
    return e;
  }
  // From here the job's directory goes with the job (stepThenEnd); before, it stays to say why the
  // agents never came.
  (void)writeFileAtomic(jobDirectory(launch.lockstepJobId) + "/announced", "", 0600);
  Agents out{started, std::move(*announcedAgents), 0};
  if (auto info = query(started.slurmJobId, toolTimeout)) out.allocatedGpus = info->gpus;
  if (out.allocatedGpus == 0) out.allocatedGpus = nodes * launch.allocation.gpusPerNode;
  return out;
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
