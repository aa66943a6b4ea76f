#pragma once
// Elastic restarts (--max-restarts), decided by the job's supervising agent: which ranks of an
// ended attempt were lost, and whether and how the job goes on with the ones left.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep {

// Whether a rank's end means it was lost, rather than stopped because a peer was. A rank its agent
// stopped (a failed job's others, a stalled job's ranks) was not lost. Trainer ranks that survive
// exit 3 (a lost peer), 0, or on a supervisor's SIGTERM (143, or the signal itself); of a job
// running its own program, the rank whose end failed the job was lost.
bool rankLost(const RankStatus& r, bool ownProgram = false);
std::string rankEndText(const RankStatus& r);  // "killed by signal 9 (Killed)", "exited with code 1"

// How an agent's message begins when a stall failed the job (docs/stalls.md): with --on-stall stop
// the job is over, whatever --max-restarts allows; with restart it goes on.
inline constexpr std::string_view kStallStopMessage = "stalled (--on-stall stop): ";
inline constexpr std::string_view kStallRestartMessage = "stalled (--on-stall restart): ";

// One part of an ended attempt: the ranks its agent reported, or its agent gone.
struct EndedPart {
  std::string node;
  std::string agent;  // how the client reaches it, for messages
  std::vector<RankStatus> ranks;
  bool agentLost = false;
  JobState state = JobState::kRunning;  // as its agent reported it (not meaningful when agentLost)
  std::uint32_t attempt = 0;            // of the part its agent reported
  std::string message;                  // why it failed, as its agent said (a stall's diagnosis)
  bool stopAsked = false;               // its agent was asked to stop it (JobStatus::stopAsked)
};

struct RestartPlan {
  std::string lost;     // what was lost and why, in words
  std::string refusal;  // why the job does not go on; empty: restart with `next`
  // The next attempt, not yet placed: attempt + 1, the reason, the same global batch over the ranks
  // left (more rows per rank), and how many ranks go on each node.
  JobSpec next;
  std::vector<std::pair<std::string, std::uint32_t>> ranksPerNode;
};

// The restart of `spec` (the attempt that ended) after `parts` ended it.
RestartPlan planRestart(const JobSpec& spec, const std::vector<EndedPart>& parts);

// Whether `next` is the next attempt of `ended` (within its max_restarts) that differs only as a
// restart does: its reason, fewer or as many ranks on the nodes and GPUs the job had, their batch,
// a rendezvous at one of the job's nodes. The same program, data, prices and agents.
bool isRestartOf(const JobSpec& next, const JobSpec& ended);

}  // namespace lockstep
