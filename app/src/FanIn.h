#pragma once
// Which jobs the app watches fanned in (docs/fan-in.md): a job on more than `nodesOver` nodes is
// shown from its supervising agent's frames, twice a second over one connection, and its records
// are left out of every agent's stream to this app. Below that, the app folds every record itself
// (the timeline, the history). One rule, read by the agent workers (what to leave out, what to
// ask), the ingest (what a job's KPIs come from) and the dashboard (what it can show).

#include <cstddef>

#include "lockstep/protocol/types.h"

namespace lockstep::app {

struct FanInRule {
  // 128 nodes (1,024 GPUs of 8): the most the app was measured to fold at the full rate with room
  // to spare (docs/benchmarks.md); a job that large is the one a VPN link cannot carry in full.
  static constexpr std::size_t kDefaultNodesOver = 128;
  std::size_t nodesOver = kDefaultNodesOver;

  bool fannedIn(const JobSpec& spec) const;
};

}  // namespace lockstep::app
