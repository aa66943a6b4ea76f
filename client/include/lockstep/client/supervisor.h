#pragma once
// Following a launched job to its end, and its elastic restarts (--max-restarts), as a plain state
// machine that the job's supervising agent drives (agent/src/jobs/supervision.h): the job's parts and
// the time come in, what to do comes out. Tests drive it with a fake clock.
//
// The rules: a job that failed while some of its ranks still run gets a grace period (10 s when it
// may restart, so that the ranks left end by themselves and say they survived; none otherwise),
// then its remaining parts are stopped. Once every part ended: finished, stopped or failed; a
// failed job with restarts left is restarted from its last checkpoint with the ranks left (the
// plan: elastic.h), else given up with what happened. A lost agent alone is no failure (it may
// be a slow answer); its node's peers failing is.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/client/elastic.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

// The one rule of who supervises a job (docs/agent.md): the first of its agents supervises it and
// the second stands by; the others only run their parts. `isThis` says whether an entry of
// spec.agents is the agent asked about (by node name, or by key).
struct SupervisingRole {
  const JobAgent* agent = nullptr;  // its entry; null: it neither supervises nor stands by
  bool standby = false;
  explicit operator bool() const { return agent != nullptr; }
};
template <class IsThis>
SupervisingRole supervisingRole(const JobSpec& spec, IsThis isThis) {
  for (std::size_t i = 0; i < spec.agents.size() && i < 2; ++i) {
    if (isThis(spec.agents[i])) return SupervisingRole{&spec.agents[i], i == 1};
  }
  return {};
}
// The job's supervising agent's entry (the first of its agents); null when none supervises it.
inline const JobAgent* supervisorOf(const JobSpec& spec) {
  return supervisingRole(spec, [](const JobAgent&) { return true; }).agent;
}

class Supervisor {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kRestartGrace = std::chrono::seconds(10);

  // What to do now.
  struct Action {
    enum class Kind {
      kWait,     // nothing yet
      kStop,     // stop every part still running (handed out once per attempt)
      kRestart,  // place and launch `plan.next` with `plan.ranksPerNode`, then restarted() or restartFailed()
      kEnd,      // the job is over: `state` and `summary`
    };
    Kind kind = Kind::kWait;
    RestartPlan plan;
    JobState state = JobState::kRunning;
    std::string message;  // for kRestart and kEnd: what happened, in words
  };

  // `attempts`: what an earlier supervisor of the job said of its attempts (a standby taking over).
  explicit Supervisor(JobSpec launched, std::vector<std::string> attempts = {});

  // The job's parts as last seen (an agent that does not answer: agentLost), at `now`.
  Action observe(const std::vector<EndedPart>& parts, Clock::time_point now);
  // The user asked to stop following (Ctrl-C): stop the job, then end.
  Action interrupt(const std::vector<EndedPart>& parts);

  // A rule asked for the job to stop (an alert's stop, a budget; docs/alerts.md), and the caller
  // stops its parts: however they end (a rank may fail as its peers go), the job ends stopped, with
  // `why`, and is not restarted.
  void stopAsked(std::string why);

  void restarted(const JobSpec& placed);       // the next attempt runs
  // It did not start: the job ends failed, or stopped where a stop was asked meanwhile (stopAsked).
  Action restartFailed(const std::string& why);

  const JobSpec& spec() const { return spec_; }
  // Of a job that may restart: one line per attempt that ended, and why the last was not restarted.
  const std::vector<std::string>& attempts() const { return attempts_; }

 private:
  Action end(JobState state, const std::string& message);
  JobSpec spec_;
  std::optional<Clock::time_point> failedSince_;
  bool stopSent_ = false;
  bool restarting_ = false;
  bool over_ = false;
  std::optional<std::string> stopAsked_;
  std::vector<std::string> attempts_;
};

// A job's overall state from the parts whose agents answer, by the history's rule (combinedState).
JobState partsState(const std::vector<EndedPart>& parts);

}  // namespace lockstep
