#pragma once
// What a job needs of the node's file system, checked before any rank starts and off the agent's
// event loop: a FIFO, a device, a slow disk or a hung network file system named in a spec must
// never stall the loop (Hello, Stop and the SIGKILL timers keep running).
//
// Each check runs on a thread of its own with a deadline. A check still running at its deadline
// is answered with a timeout error and abandoned: its thread keeps nothing of the agent's, and its
// result is dropped when it comes. At most kMaxInFlight checks run (or hang) at once; beyond that
// StartJob is refused as busy.
//
// Not thread-safe: the agent's event loop calls it; the checks themselves run elsewhere.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/off_loop.h"
#include "lockstep/common/identity.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

// What the checks found, for starting the ranks.
struct CheckedPaths {
  std::string program;  // a command job's program, resolved to an absolute path
};

struct PathFacts {
  std::string node;         // for messages
  std::string trainerPath;  // lockstep-trainer, for jobs of the built-in trainer
  std::string agentPath;    // the agent's own PATH, where a program name is looked up
  Identity owner;           // who the job runs as: every path is checked with that user's rights
  bool privateTmp = false;  // the job gets a /tmp and /dev/shm of its own: paths there are not the node's
};

// The checks themselves, on the calling thread (the tests call it directly).
Result<CheckedPaths> checkJobPaths(const JobSpec& spec, const PathFacts& facts);

class Preflight {
 public:
  static constexpr std::size_t kMaxInFlight = 8;

  explicit Preflight(std::chrono::milliseconds deadline = std::chrono::seconds(5));
  ~Preflight();
  Preflight(const Preflight&) = delete;
  Preflight& operator=(const Preflight&) = delete;

  // Readable when a check finished.
  int wakeFd() const;
  using Check = std::function<Result<CheckedPaths>()>;
  // Starts `check` (checkJobPaths of a spec) on a thread; `id` comes back with its result. `node`
  // names this node in errors.
  Result<void> submit(std::uint64_t id, Check check, const std::string& node);

  using Done = OffLoop<Result<CheckedPaths>>::Done;
  // Checks that finished, and those past their deadline (as timeout errors).
  std::vector<Done> take();
  // When the next unanswered check reaches its deadline; max() when none waits.
  std::chrono::steady_clock::time_point nextDeadline() const;

 private:
  struct Waiting {
    std::uint64_t id;
    std::chrono::steady_clock::time_point deadline;
    std::string node;
  };
  std::chrono::milliseconds deadline_;
  OffLoop<Result<CheckedPaths>> checks_{kMaxInFlight};
  std::vector<Waiting> waiting_;
};

}  // namespace lockstep::agent
