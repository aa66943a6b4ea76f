#pragma once
// What lockstepctl's commands share: global options, exit codes, error printing. The job history
// commands live in ctl_history.cpp, the rest in lockstepctl.cpp.

#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/history/history.h"
#include "lockstep/protocol/types.h"

namespace lockstep::ctl {

// Exit codes scripts can rely on (also in --help).
enum Exit : int {
  kOk = 0,
  kFailed = 1,       // an agent answered with an error
  kUsage = 2,        // bad command line or input file
  kUnreachable = 3,  // an agent did not answer
  kRefused = 4,      // keys: an agent not pinned or not matching, or this client not authorized
  kJobFailed = 5,    // the job ended failed (start --wait, watch)
  kJobStopped = 6,   // the job ended stopped (start --wait, watch)
};

struct Globals {
  std::vector<std::string> agents;
  std::string agentKey;
  bool json = false;
  std::chrono::milliseconds timeout{10000};
  std::string configDir;
  std::string historyPath;  // empty: do not record (--no-history)
};

int exitFor(const Error& e);
int fail(const Error& e);            // prints "lockstepctl: message" and returns its exit code
std::string timeText(std::int64_t unixUs);  // local time, "-" for 0

// Records what `start --wait` and `watch` see of a job into the history. A history that cannot be
// opened or written is reported once and then left alone: running a job never fails for it.
class Recorder {
 public:
  explicit Recorder(const Globals& g);
  void part(const NodeHello& node, const JobStatus& status);
  void messages(const std::vector<StreamMessage>& batch);
  void finish();  // the final KPIs of jobs that ended

 private:
  void failed(const Error& e);
  std::optional<history::History> history_;
  std::set<std::string> nodes_;
};

int cmdHistory(const Globals& g, const std::vector<std::string>& args);
int cmdReport(const Globals& g, const std::vector<std::string>& args);
int cmdCompare(const Globals& g, const std::vector<std::string>& args);

}  // namespace lockstep::ctl
