#pragma once
// One job's alerts: its rules evaluated against its KPIs and events, with Alertmanager's
// semantics. A rule is pending from the moment its condition holds until it has held for its
// `for`, then fires once (no flood), then resolves when the condition stops holding. An event rule
// (stalled, failed, finished, restarted) fires when its event comes; `stalled` resolves when
// progress moves again, the others at once. At most Options::maxNotificationsPerMinute changes of
// state are notified per job per minute: the others are still returned (kept in the history) with
// notify = false and why. Not thread-safe: one owner (the job's supervising agent's worker).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/alerts/alert.h"
#include "lockstep/alerts/rules.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/protocol/types.h"

namespace lockstep::alerts {

// What the KPI engine does not hold: each GPU's memory (from its node's hello) and the free share
// of each node's disk where the job writes (its checkpoint directory, or working directory).
struct NodeFacts {
  std::map<kpi::NodeGpu, std::uint64_t, kpi::NodeGpuLess> gpuMemoryTotalBytes;
  std::map<std::string, double> diskFreePct;  // by node
};

class AlertBook {
 public:
  struct Options {
    std::size_t maxNotificationsPerMinute = 10;
    // A stall's alert waits this long for its ranks' stacks (rank_evidence events) once the stall
    // is seen, then fires with what came.
    std::int64_t evidenceWaitUs = 3'000'000;
    // throughput_drop compares the window's samples/s with the median of the job's readings over
    // this long, once it has at least minBaselineReadings of them.
    std::int64_t baselineUs = 30LL * 60 * 1'000'000;
    std::size_t minBaselineReadings = 12;
  };

  AlertBook(std::string jobId, std::vector<Rule> rules, Options options);
  AlertBook(std::string jobId, std::vector<Rule> rules) : AlertBook(std::move(jobId), std::move(rules), Options{}) {}
  ~AlertBook();

  // The job's events as they come: stalled (its rank: the first rank behind), rank_evidence,
  // stall_ended. Others are ignored.
  void onEvent(const JobEvent& event);
  // What the supervisor decided: the job ended (finished, failed, stopped), or restarted.
  void onEnded(JobState state, const std::string& message, std::int64_t nowUs);
  void onRestarted(const std::string& why, std::int64_t nowUs);

  // The changes of state since the last call (pending ones included: they are not notified), each
  // rule's condition read from the KPIs as of `nowUs`.
  std::vector<Alert> evaluate(const kpi::JobKpis& kpis, const NodeFacts& facts, std::int64_t nowUs);

  // Alerts pending or firing now.
  std::vector<Alert> active() const;
  const std::vector<Rule>& rules() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::alerts
