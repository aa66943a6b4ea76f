#pragma once
// The private view of the file system a spawned child gets (SpawnOptions::sandbox): built before
// fork, entered in the child between fork and exec, where only async-signal-safe calls are
// allowed (so: system calls on prepared strings, no allocation).

#include <string>
#include <vector>

#include "lockstep/common/process.h"

namespace lockstep::sandbox {

struct Plan {
  bool userNamespace = false;  // not root: a user namespace that maps only our uid and gid
  std::string uidMap, gidMap;
  std::string hide;
  std::vector<std::string> dirsToMake;  // under `hide`, in order: mount points and their parents
  struct Keep {
    std::string path;
    bool directory;
    bool readOnly;
    std::string procPath;  // "/proc/self/fd/" and room for the number, filled in the child
    int fd;                // opened in the child
  };
  std::vector<Keep> keep;
  bool newPid = false;  // SpawnOptions::newPidNamespace
  bool privateTmp = false;
};

// Checks the request (every kept path under `hide`, `hide` a directory) and prepares it.
Result<Plan> plan(const SpawnOptions::Sandbox& sandbox, bool newPidNamespace);

// In the child. Returns false with errno set when the kernel refuses a step. With newPid, the
// child's children are born in a new PID namespace.
bool enter(Plan& plan);
// In the first process of the new PID namespace (the child's child): /proc of that namespace.
bool enterPidNamespace(const Plan& plan);

// Root keeps uid 0 but no capability survives exec: it can neither unmount what hides nor read
// another process's files through /proc (bounding set emptied, SECBIT_NOROOT, locked).
bool dropCapabilities();

}  // namespace lockstep::sandbox
