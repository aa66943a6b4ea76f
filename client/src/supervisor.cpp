#include "lockstep/client/supervisor.h"

#include <algorithm>

namespace lockstep {
namespace {

// A lost agent's part is not waited for: nothing more will be learnt of it (the plan counts it lost).
bool partEnded(const EndedPart& p) {
  return p.agentLost || jobStateEnded(p.state);
}

}  // namespace

JobState partsState(const std::vector<EndedPart>& parts) {
  std::vector<JobState> states;
  for (const auto& p : parts) {
    if (!p.agentLost) states.push_back(p.state);
  }
  return combinedState(states);
}

Supervisor::Supervisor(JobSpec launched, std::vector<std::string> attempts)
    : spec_(std::move(launched)), attempts_(std::move(attempts)) {}

Supervisor::Action Supervisor::end(JobState state, const std::string& message) {
  over_ = true;
  Action a;
  a.kind = Action::Kind::kEnd;
  a.state = state;
  a.message = message;
  return a;
}

Supervisor::Action Supervisor::observe(const std::vector<EndedPart>& allParts, Clock::time_point now) {
  if (over_ || restarting_) return {};
  // An earlier attempt's part (a node the restart left out still reports it) is history.
  std::vector<EndedPart> parts;
  for (const auto& p : allParts) {
    if (p.agentLost || p.attempt >= spec_.attempt) parts.push_back(p);
  }
  const bool elastic = spec_.maxRestarts > 0;
  // Every agent lost: nothing is known to run, and nothing will say it ended. The job failed.
  const bool allLost = !parts.empty() && std::all_of(parts.begin(), parts.end(), [](const EndedPart& p) { return p.agentLost; });
  const JobState state = allLost ? JobState::kFailed : partsState(parts);
  const bool allEnded = std::all_of(parts.begin(), parts.end(), partEnded);
  if (stopAsked_) return allEnded ? end(JobState::kStopped, *stopAsked_) : Action{};
  // Stopped, though no agent of it was asked: its trainer ranks stopped at a stop vote that a rank
  // given SIGTERM elsewhere started (a node shutting down). A job that may restart goes on, as after
  // a lost node.
  const bool unasked = state == JobState::kStopped &&
                       std::none_of(parts.begin(), parts.end(), [](const EndedPart& p) { return p.stopAsked; });
  if (state != JobState::kFailed && !(elastic && unasked && allEnded)) {
    failedSince_.reset();
    if (allEnded && state != JobState::kStarting) return end(state, "");
    return {};
  }
  if (!allEnded) {
    if (!failedSince_) failedSince_ = now;
    if (stopSent_ || now - *failedSince_ < (elastic ? kRestartGrace : Clock::duration::zero())) return {};
    stopSent_ = true;
    Action stop;
    stop.kind = Action::Kind::kStop;
    return stop;
  }
  // Every part ended, and the job failed (or stopped unasked, with restarts allowed).
  failedSince_.reset();
  RestartPlan plan = planRestart(spec_, parts);
  if (!elastic) return end(JobState::kFailed, plan.lost);
  attempts_.push_back("attempt " + std::to_string(spec_.attempt) + " with " + std::to_string(spec_.worldSize) + " rank" +
                      (spec_.worldSize == 1 ? "" : "s") + ": " + plan.lost);
  if (!plan.refusal.empty()) {
    // Failed, or stopped from outside (as a job that may not restart ends), saying why not restarted.
    attempts_.push_back("not restarted: " + plan.refusal);
    return end(state, plan.lost + "; not restarted: " + plan.refusal);
  }
  restarting_ = true;
  Action restart;
  restart.kind = Action::Kind::kRestart;
  restart.message = plan.lost;
  restart.plan = std::move(plan);
  return restart;
}

Supervisor::Action Supervisor::interrupt(const std::vector<EndedPart>& parts) {
  if (over_) return {};
  if (!std::all_of(parts.begin(), parts.end(), partEnded) && !stopSent_) {
    stopSent_ = true;
    Action stop;
    stop.kind = Action::Kind::kStop;
    return stop;
  }
  return end(partsState(parts), "interrupted");
}

void Supervisor::stopAsked(std::string why) {
  stopAsked_ = std::move(why);
  stopSent_ = true;
}

void Supervisor::restarted(const JobSpec& placed) {
  spec_ = placed;
  restarting_ = false;
  stopSent_ = false;
}

Supervisor::Action Supervisor::restartFailed(const std::string& why) {
  restarting_ = false;
  if (stopAsked_) {  // a stop came while it was to restart: the restart is not wanted
    attempts_.push_back("not restarted: " + *stopAsked_);
    return end(JobState::kStopped, *stopAsked_);
  }
  attempts_.push_back("not restarted: the restart did not start: " + why);
  return end(JobState::kFailed, "the restart did not start: " + why);
}

}  // namespace lockstep
