#pragma once
// What lockstepctl's commands share: global options, exit codes, error printing, agents and a
// job's parts (ctl_agents.cpp). The command line (ctl_run.cpp) and one flag parser (ctl_flags.h);
// the commands: keygen and trust (ctl_keys.cpp), nodes, status, stop and logs (ctl_jobs.cpp),
// start (ctl_start.cpp), watch (ctl_watch.cpp), the job history's (ctl_history.cpp). All of it is
// the lockstep_ctl library; lockstepctl is a thin main over it.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/client/agent_client.h"
#include "lockstep/client/slurm.h"
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
// Returns fail(error) from the calling command when `expr` (a Result) holds an error.
#define LOCKSTEP_TRY_OR_FAIL(expr)                 \
  do {                                             \
    auto&& lockstep_ctl_result_ = (expr);          \
    if (!lockstep_ctl_result_) {                   \
      return ::lockstep::ctl::fail(lockstep_ctl_result_.error()); \
    }                                              \
  } while (false)
int fail(const Error& e);            // prints "lockstepctl: message" and returns its exit code
std::string timeText(std::int64_t unixUs);  // local time, present::kUnknown for 0
// A figure for --json: the value (times `scale`), or null when it is unknown (never 0).
nlohmann::ordered_json jsonFigure(const std::optional<double>& value, double scale = 1);
// `text` in a column `width` characters wide (not bytes: "–" is three in UTF-8), right-aligned;
// left-aligned for a negative width, as printf's.
std::string column(const std::string& text, int width);

// Records what `start --wait` and `watch` see of a job into the history. A history that cannot be
// opened or written is reported once and then left alone: running a job never fails for it.
class Recorder {
 public:
  explicit Recorder(const Globals& g);
  void part(const NodeHello& node, const JobStatus& status);
  // The agent's clock against this machine's (AgentClient::measureClock), at most once a minute
  // per node: the job's trace lines its nodes up with it (report/trace.h).
  void clock(AgentClient& agent);
  void messages(const std::vector<StreamMessage>& batch);
  void finish();  // the final KPIs of jobs that ended

 private:
  void failed(const Error& e);
  std::optional<history::History> history_;
  std::set<std::string> nodes_;
  std::map<std::string, std::chrono::steady_clock::time_point> nextClock_;  // per node
  std::chrono::milliseconds timeout_;
};

// The signal that asked lockstepctl to stop (SIGINT, SIGTERM), or 0.
extern std::atomic<int> g_interrupted;

// ---- agents and jobs (ctl_agents.cpp) ----

struct Connected {
  std::vector<std::unique_ptr<AgentClient>> clients;
  std::vector<AgentClient*> all() const;
  // The specs findJob took whole, by agent and attempt: its later lists name them, and the agents
  // answer those without the spec (a 16,384-rank job's is 420 KB an agent, every poll). Agents that
  // sent equal specs (every part of an attempt, as a rule) share one.
  mutable std::map<std::pair<AgentClient*, JobAttempt>, std::shared_ptr<const JobSpec>> heldSpecs;
};
// lockstepctl's own key pair (`client` in the config directory); the error says to run keygen.
Result<CurveKeyPair> ownKeyPair(const Globals& g);
// The --agent options, or else every pinned agent, connected.
Result<Connected> connectAgents(const Globals& g);

// The job's parts: each agent that knows the job, with its status there.
struct Part {
  AgentClient* agent;
  JobStatus status;
};
// With `lost`: agents in it are skipped, and one that does not answer is added to it instead of
// failing the call (a supervised job outlives a lost node).
Result<std::vector<Part>> findJob(const Connected& agents, const std::string& jobId, std::chrono::milliseconds timeout,
                                  std::set<AgentClient*>* lost = nullptr);
bool partEnded(const JobStatus& s);
bool allPartsEnded(const std::vector<Part>& parts);  // of every attempt listed
// A job's state as clients show it (jobOutcome): its supervisor's verdict, else its newest attempt's
// parts' combined state.
JobState overall(const std::vector<Part>& parts);
// What the job's supervising agent says of it (none where no agent supervises it).
const Supervision& supervisionOf(const std::vector<Part>& parts);
// Whether the job is over (protocol's jobOver): its supervisor's verdict is in, else every part ended.
bool jobOver(const std::vector<Part>& parts);
int exitForState(JobState s);
// The Unix user the job runs as (combinedOwner of its parts).
std::string ownerOf(const std::vector<Part>& parts);
// Stops every part and waits until no rank runs, or the grace period (and a margin) passes.
Result<std::vector<Part>> stopEverywhere(const Connected& agents, const std::string& jobId, std::uint32_t graceMs,
                                         std::chrono::milliseconds timeout, std::set<AgentClient*>* lost = nullptr);
// The status of the part whose agent supervises the job (docs/agent.md), if it answered; else its
// standby's.
const JobStatus* supervisingPart(const std::vector<Part>& parts);
// A job's stall across its parts (kpi::jobStall), and "stalled 43 s: <diagnosis>".
std::optional<Stall> stallOf(const std::vector<Part>& parts);
std::string stallText(const Stall& stall);
int printJob(const Globals& g, const std::string& jobId, const std::vector<Part>& parts);
// After a job ended: what the agents sent since the last fetch (its last reports and events).
void drain(std::map<AgentClient*, std::uint64_t>& lastSeq, Recorder& recorder, std::chrono::milliseconds timeout);

// ---- Slurm (ctl_slurm.cpp, docs/cluster.md) ----

struct SlurmStart {
  bool on = false;
  slurm::Allocation allocation;
  std::uint32_t lingerS = 30;  // how long the agents wait for the job, and after it, before they exit
  std::uint32_t waitS = 600;   // how long the allocation may take to start
  std::string logsDir;         // --slurm-logs: where Slurm's output and the ranks' logs are kept
};
// Starts the job's agents through Slurm and connects to them; sets the spec's Slurm job id and
// allocated GPUs. A submitted job that does not start in time is cancelled.
Result<Connected> startSlurmAgents(const Globals& g, const SlurmStart& s, JobSpec& spec);
// The agents of a job: those of its Slurm job when it was started with --slurm (and no --agent is
// given), else connectAgents'.
Result<Connected> connectAgentsFor(const Globals& g, const std::string& jobId);
// `e`, with what Slurm says of the job's Slurm job when it has one (its agents went away).
Error withSlurmState(const Globals& g, const std::string& slurmJobId, Error e);
// After the job was stopped: cancels the Slurm job lockstepctl submitted for it, if any.
void endSlurmJob(const Globals& g, const std::string& jobId);

// ---- commands ----

int run(int argc, char** argv);  // lockstepctl's command line: global options, then a command

int cmdKeygen(const Globals& g, const std::vector<std::string>& args);  // ctl_keys.cpp
int cmdTrust(const Globals& g, const std::vector<std::string>& args);
int cmdNodes(const Globals& g, const std::vector<std::string>& args);  // ctl_jobs.cpp
int cmdStatus(const Globals& g, const std::vector<std::string>& args);
int cmdStop(const Globals& g, const std::vector<std::string>& args);
int cmdStacks(const Globals& g, const std::vector<std::string>& args);
int cmdAlerts(const Globals& g, const std::vector<std::string>& args);  // ctl_alerts.cpp
int cmdLogs(const Globals& g, const std::vector<std::string>& args);
int cmdStart(const Globals& g, const std::vector<std::string>& args);
int cmdWatch(const Globals& g, const std::vector<std::string>& args);
int cmdHistory(const Globals& g, const std::vector<std::string>& args);
int cmdReport(const Globals& g, const std::vector<std::string>& args);
int cmdTrace(const Globals& g, const std::vector<std::string>& args);
int cmdCompare(const Globals& g, const std::vector<std::string>& args);

}  // namespace lockstep::ctl
