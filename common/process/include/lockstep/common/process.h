#pragma once
// Child processes: start one without a shell, wait for it with a timeout, stop its group.
// Used by the trainer's --nproc launcher, the agent and the tests.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep {

struct SpawnOptions {
  // argv[0] is the executable's path unless `executable` names it; there is no PATH lookup and no
  // shell.
  std::vector<std::string> argv;
  std::string executable;
  int executableFd = -1;  // when set, what is run (execveat), whatever argv[0] and `executable` say
  // Set on top of the parent's environment (an existing name is replaced).
  std::vector<std::pair<std::string, std::string>> env;
  // Files for the child's stdout/stderr (created or truncated); empty means inherit.
  std::string stdoutPath;
  std::string stderrPath;
  // Put the child in a new process group (pgid == pid) so the whole group can be signalled.
  bool newProcessGroup = false;
  // Signal delivered to the child when the spawning thread dies (PR_SET_PDEATHSIG); 0 for none.
  int parentDeathSignal = 0;
  // The child's working directory; empty: the parent's.
  std::string workingDir;
  // stdin from /dev/null instead of the parent's.
  bool stdinFromDevNull = false;
  // How long the child may take to get from fork to exec (entering its working directory and
  // loading the program, on a file system that may hang); then it is killed and spawnProcess fails.
  std::chrono::milliseconds startTimeout{10000};
  // A private view of the file system (docs/security.md): in a new mount namespace an empty tmpfs
  // covers `hide`, and the paths under it in `keep` (directories or files) are bound back in
  // place. Not root, the child is in a new user namespace that maps only the caller's uid and
  // gid, so it holds no capability to undo that; root, it keeps uid 0 with no capabilities
  // (bounding set emptied, SECBIT_NOROOT). The spawn fails when the kernel refuses a step.
  struct Sandbox {
    std::string hide;
    std::vector<std::string> keep;
    std::vector<std::string> readOnly;  // those of `keep` the child may not change
    bool privateTmp = false;            // an empty /tmp and /dev/shm of its own (tmpfs, mode 1777)
  };
  std::optional<Sandbox> sandbox;
  // Namespaces the child joins (setns) before anything else, descriptors of another process's
  // /proc/PID/ns/{user,mnt,pid} (-1: not that one): the job's namespaces, which its first process
  // made (docs/security.md). Joining a mount namespace resets the root and working directories to
  // its own; the pid namespace is the one the child's children are born in, so only a kept
  // child's program (spawnKept) lands in it.
  struct Join {
    int userNs = -1, mountNs = -1, pidNs = -1;
  };
  std::optional<Join> join;
  // Cgroups' cgroup.procs (one per hierarchy), open for writing: the child moves itself there
  // first, so that all it and its children do is the cgroups'. Empty: the caller's cgroups.
  std::vector<int> cgroupProcsFds;
  // The cores the child runs on (sched_setaffinity), once in its cgroups. Empty: the caller's.
  std::vector<int> cpus;
  // A new PID namespace for the kept program (spawnKept), which is its init (pid 1), with /proc
  // mounted anew for it: the sandbox must be set. What it sees of the node's processes is its own.
  bool newPidNamespace = false;
  // The user the child becomes after entering its sandbox and before it opens its output files,
  // enters its working directory or runs its program (a caller running as root): supplementary
  // groups, gid and uid, for good. Unset: the caller's.
  struct Credentials {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
  };
  std::optional<Credentials> credentials;
  std::optional<mode_t> umask;  // the child's; unset: the caller's
  // A child that is root when it runs its program keeps no capability (sandbox.h): uid 0 still
  // owns root's files, but cannot undo mounts nor read other processes through /proc.
  bool dropRootCapabilities = false;
};

// Starts the child; fails (without leaving a child behind) when exec fails, saying why.
Result<pid_t> spawnProcess(const SpawnOptions& options);

// A keeper stands between the caller and the program so that how the program ended outlives the
// caller (the agent restarting while its ranks run). The caller's child is the keeper: it leads
// the process group, blocks every signal it can, waits for the program (its own child), writes how
// it ended to `exitRecord`, and then ends the same way (by the same exit code or signal; for a
// signal that dumps core, by exit code 128 + signal, so that no second crash is reported): the
// caller reads the record for the whole truth. `executable` is a program whose main() hands `kKeeperArg` to runKeeper (for the agent,
// /proc/self/exe: a fresh image, not a copy of the caller's memory).
struct Keeper {
  std::string executable;
  std::string exitRecord;  // created anew (whatever was at the path is removed first)
  // When set, `executable` is run through this descriptor (execveat): the binary need not be
  // visible where the child stands (a job's namespaces, with /tmp private and /proc its own).
  int executableFd = -1;
};
inline constexpr const char* kKeeperArg = "--lockstep-keeper";

// A job's init (pid 1 of the PID namespace its ranks share on a node, docs/security.md): reaps
// what is orphaned there and exits once nothing else has run there for ten seconds (or nothing ever
// came within two minutes), which kills whatever the job left behind. `executable kJobInitArg`.
inline constexpr const char* kJobInitArg = "--lockstep-job-init";
int runJobInit(int argc, char** argv);

struct KeptProcess {
  pid_t keeper = -1;   // the caller's child and the process group's id: wait for and signal this
  pid_t program = -1;  // the program itself (what uses the CPU, the GPU and the memory)
};
Result<KeptProcess> spawnKept(const SpawnOptions& options, const Keeper& keeper);

// The keeper's main, for argv = {any, kKeeperArg, PROGRAM_PID, RECORD_FD}; returns the exit code
// for main() as the program's (128 + signal if one ended it), or 2 with a usage message when argv
// is not a keeper's.
int runKeeper(int argc, char** argv);

struct ExitStatus {
  int exitCode = 0;  // valid when signal == 0
  int signal = 0;    // the signal that killed the child, or 0

  bool success() const { return signal == 0 && exitCode == 0; }
  // The shell's convention: the exit code, or 128 + signal.
  int shellCode() const { return signal != 0 ? 128 + signal : exitCode; }
  // "exit code 3" or "signal 9 (Killed)".
  std::string describe() const;
  // What a keeper writes: "exit 3\n" or "signal 9\n"; fromRecord reads it back, nullopt for anything
  // else (an empty file: the keeper died before the program did).
  std::string record() const;
  static std::optional<ExitStatus> fromRecord(std::string_view record);
};

ExitStatus exitStatusFromWait(int waitStatus);

// Waits for one child to exit and reaps it. Returns nullopt when the timeout passes first.
Result<std::optional<ExitStatus>> waitProcess(pid_t pid, std::chrono::milliseconds timeout);

// Waits until any of `pids` exits (reaping it) or the timeout passes. Returns the pid and its
// status, or nullopt on timeout. Pids that were already reaped must not be passed.
Result<std::optional<std::pair<pid_t, ExitStatus>>> waitAnyProcess(const std::vector<pid_t>& pids,
                                                                   std::chrono::milliseconds timeout);

// `name`'s path on PATH (a name with a slash: itself), or empty when it is not there or not executable.
std::string findOnPath(const std::string& name);

// A command-line tool's run (sbatch, scontrol): how it ended and what it printed.
struct CommandOutput {
  ExitStatus status;
  std::string out, err;  // each at most the first maxBytes
};
// Runs argv[0], looked up on PATH, in a process group of its own with stdin from /dev/null and
// SIGTERM ignored; kills the group and fails, saying so, when it runs past the timeout.
Result<CommandOutput> runCommand(const std::vector<std::string>& argv, std::chrono::milliseconds timeout,
                                 std::size_t maxBytes = 1u << 20);

// Sends SIGTERM, waits up to `grace`, then SIGKILL and reaps. Returns how the child ended.
Result<ExitStatus> terminateProcess(pid_t pid, std::chrono::milliseconds grace, bool wholeGroup);

}  // namespace lockstep
