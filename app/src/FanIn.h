#pragma once
// Which jobs the app watches fanned in (docs/fan-in.md): a job on more than `nodesOver` nodes is
// shown from its supervising agent's frames, ten a second over one connection, and its records
// are left out of every agent's stream to this app. Below that, the app folds every record itself
// (the timeline, the history). One rule, decided once per job in one book that the agent workers
// (what to leave out, what to ask), the ingest (what a job's KPIs come from) and the dashboard
// (what it can show) share.

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "lockstep/protocol/types.h"

namespace lockstep::app {

struct FanInRule {
  // 128 nodes (1,024 GPUs of 8): the most the app was measured to fold at the full rate with room
  // to spare (docs/benchmarks.md); a job that large is the one a VPN link cannot carry in full.
  static constexpr std::size_t kDefaultNodesOver = 128;
  std::size_t nodesOver = kDefaultNodesOver;

  // A job without agents (so without a supervision to make its frames) never is.
  bool fannedIn(const JobSpec& spec) const;
};

// Each job's decision, made from the first spec of it seen and kept for the app's life: a
// reconnect, or an elastic restart whose attempt crosses the line, does not change how a job is
// watched. Any thread.
class FanInBook {
 public:
  explicit FanInBook(FanInRule rule) : rule_(rule) {}

  const FanInRule& rule() const { return rule_; }
  // The job's decision; made now, from `spec`, if it has none.
  bool decide(const JobSpec& spec);
  // The decision for a job whose spec a list left out (it came whole before); unset if none.
  std::optional<bool> decided(const std::string& jobId) const;

 private:
  const FanInRule rule_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, bool> decisions_;
};

}  // namespace lockstep::app
