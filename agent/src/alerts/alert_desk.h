#pragma once
// The agent's side of alerts (docs/alerts.md), shared by the jobs it supervises: its own default
// rules and webhooks (its configuration), the rules a job runs under, and where a changed alert
// goes: into the node's stream as a job event (history, reports, lockstepctl, the app, the
// Prometheus page all read it there) and to the webhooks (alerts/webhook.h, on their own thread).
// publish() may be called from any thread (each supervised job's); takeEvents() on the event loop.

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/alerts/alert.h"
#include "lockstep/alerts/rules.h"
#include "lockstep/alerts/webhook.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

class Log;

struct AlertDefaults {
  std::vector<alerts::Rule> rules;  // every job's, from the agent's --alert-rules file
  std::vector<std::string> notify;  // every job's webhooks
};

// The agent's --alert-rules file: one rule per line; blank lines and `#` comments skipped. A bad
// rule names the file and line.
Result<std::vector<alerts::Rule>> readAlertRulesFile(const std::string& path);

class AlertDesk {
 public:
  AlertDesk(AlertDefaults defaults, Log& log, alerts::Webhooks::Options webhooks = {});
  ~AlertDesk();
  AlertDesk(const AlertDesk&) = delete;
  AlertDesk& operator=(const AlertDesk&) = delete;

  // What a job runs under: its rules and the agent's; with none, but somewhere to notify, the
  // default rules (failed, stalled, restarted, finished); its budget as `cost >= BUDGET ->
  // checkpoint,stop`. Refuses what the job cannot do (a checkpoint without checkpoints) and bad
  // webhook URLs, naming them.
  Result<std::vector<alerts::Rule>> rulesFor(const JobSpec& spec) const;
  std::vector<std::string> webhooksFor(const JobSpec& spec) const;

  // A change of an alert's state: firing and resolved ones become job events and, when they
  // notify, webhook posts to `urls`. Any thread.
  void publish(const alerts::Alert& alert, const std::vector<std::string>& urls);

  // Event loop: the job events to append (alerts, and webhooks that did not take one).
  std::vector<JobEvent> takeEvents();

 private:
  AlertDefaults defaults_;
  Log& log_;
  alerts::Webhooks webhooks_;
  mutable std::mutex mutex_;
  std::vector<JobEvent> events_;
};

}  // namespace lockstep::agent
