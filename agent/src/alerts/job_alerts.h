#pragma once
// One supervised job's alerts, on its supervision thread (jobs/supervision.cpp): what the job's
// agents stream (this one's included) is fetched through the same connections the supervision
// uses, read by the KPI engine, and the job's rules evaluated on the result (alerts/book.h) each
// time the supervision polls. A changed alert is published through the agent's AlertDesk; the
// ones that fired are handed back for the supervision to act on (stop, checkpoint, restart).

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lockstep/alerts/alert.h"
#include "lockstep/alerts/book.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/protocol/types.h"

namespace lockstep {
class AgentClient;
}

namespace lockstep::agent {

class AlertDesk;

class JobAlerts {
 public:
  // `self`: this agent's node (its disk is measured where the job writes).
  JobAlerts(const JobSpec& spec, std::vector<alerts::Rule> rules, std::string self, AlertDesk& desk);

  bool idle() const { return rules_.empty(); }
  // Reads what each of `nodes`' agents streamed since the last call (`client` gives the
  // connection; null: not reachable now) and evaluates the rules. Returns the alerts that fired.
  std::vector<alerts::Alert> poll(const std::set<std::string>& nodes,
                                  const std::function<AgentClient*(const std::string&)>& client);
  // The job's stall as the supervision sees it across its parts (kpi::jobStall): each agent
  // reports the stall its own ranks show, and only the whole job says which rank is behind.
  void stalled(const Stall& stall);
  // What the supervision decided, evaluated at the next poll.
  void ended(JobState state, const std::string& message);
  void restarted(const std::string& why);

 private:
  struct Cursor {
    std::uint64_t instance = 0;
    std::uint64_t afterSeq = 0;
  };
  void fetchFrom(const std::string& node, AgentClient& client);
  void take(const StreamMessage& message);
  void measureDisk();

  JobSpec spec_;
  std::vector<alerts::Rule> rules_;
  std::string self_;
  AlertDesk& desk_;
  std::vector<std::string> urls_;
  kpi::JobTracker tracker_;
  alerts::AlertBook book_;
  alerts::NodeFacts facts_;
  std::map<std::string, Cursor> cursors_;
  std::int64_t diskMeasuredUs_ = 0;
  std::int64_t createdUs_;
  std::int64_t stallEndedUs_ = 0;  // the newest stall_ended seen: a stall from before it is over
};

}  // namespace lockstep::agent
