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
};

// Checks the request (every kept path under `hide`, `hide` a directory) and prepares it.
Result<Plan> plan(const SpawnOptions::Sandbox& sandbox);

// In the child. Returns false with errno set when the kernel refuses a step.
bool enter(Plan& plan);

}  // namespace lockstep::sandbox
