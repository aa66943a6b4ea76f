#include "alerts/alert_desk.h"

#include <algorithm>
#include <cstdio>

#include "base/log.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"

namespace lockstep::agent {
namespace {

using alerts::Action;
using alerts::Rule;

// The built-in trainer writes a checkpoint when it is stopped only where it writes them at all; a
// command job is told through the lockstep package (should_stop) before it is stopped.
Result<void> canCheckpoint(const JobSpec& spec, const Rule& rule) {
  if (spec.isCommand() || (!spec.checkpointDir.empty() && spec.checkpointEvery > 0)) return {};
  return invalidArgument("alert rule '" + rule.text +
                         "': checkpoint needs the job to write checkpoints: give --checkpoint-dir and "
                         "--checkpoint-every, or drop checkpoint from its actions");
}

// Not built yet: an alert's restart would need the supervisor to restart a job none of whose
// ranks failed. Refused rather than ignored.
Result<void> canRestart(const JobSpec&, const Rule& rule) {
  return invalidArgument("alert rule '" + rule.text +
                         "': restart is not an action alerts take yet; use stop, or --on-stall restart for a stalled job");
}

// --budget: the job stops with a checkpoint where it can write one, and says so either way.
Rule budgetRule(const JobSpec& spec) {
  const std::string checkpoint = canCheckpoint(spec, Rule{}) ? "checkpoint," : "";
  char amount[32];
  std::snprintf(amount, sizeof amount, "%.15g", *spec.budget);
  auto rule = alerts::parseRule("cost >= " + std::string(amount) + " -> notify," + checkpoint + "stop");
  return rule ? *rule : Rule{};
}

}  // namespace

Result<std::vector<Rule>> readAlertRulesFile(const std::string& path) {
  std::vector<Rule> rules;
  LOCKSTEP_TRY(forEachSettingsLine(path, 1u << 20, [&](const std::string& line, int n) -> Result<void> {
    auto rule = alerts::parseRule(line);
    if (!rule) return rule.error().withContext(path + " line " + std::to_string(n));
    if (alerts::has(rule->actions, Action::kRestart)) {
      return canRestart(JobSpec{}, *rule).error().withContext(path + " line " + std::to_string(n));
    }
    rules.push_back(std::move(*rule));
    return {};
  }));
  return rules;
}

AlertDesk::AlertDesk(AlertDefaults defaults, Log& log, alerts::Webhooks::Options webhooks)
    : defaults_(std::move(defaults)), log_(log), webhooks_(webhooks) {}

AlertDesk::~AlertDesk() {
  // The agent stops: what is under way gets a moment to arrive (each POST has its own timeout).
  if (!webhooks_.drain(std::chrono::seconds(2))) log_.info("stopped with alerts still on their way to webhooks");
}

// The job's own rules (with --notify and no --alert: the defaults), which must all be able to
// run, and the agent's (with webhooks of its own and no rules file: the defaults), which bend to
// the job: a checkpoint it cannot write becomes a plain stop. Each rule once.
Result<std::vector<Rule>> AlertDesk::rulesFor(const JobSpec& spec) const {
  LOCKSTEP_ASSIGN_OR_RETURN(std::vector<Rule> rules, alerts::parseRules(spec.alertRules));
  if (rules.empty() && !spec.notify.empty()) rules = alerts::defaultRules();
  if (spec.budget) rules.push_back(budgetRule(spec));
  for (const auto& rule : rules) {
    if (alerts::has(rule.actions, Action::kCheckpoint)) LOCKSTEP_TRY(canCheckpoint(spec, rule));
    if (alerts::has(rule.actions, Action::kRestart)) LOCKSTEP_TRY(canRestart(spec, rule));
  }
  if (spec.budget && *spec.budget <= 0) return invalidArgument("--budget must be more than 0");
  if (spec.budget && !spec.prices.anySet()) {
    return invalidArgument("--budget needs the job's prices to reach it: give --price-gpu-hour, --price-core-hour or --price-kwh");
  }
  for (const auto& url : spec.notify) {
    if (auto ok = alerts::checkWebhookUrl(url); !ok) return ok.error().withContext("--notify");
  }
  auto agents = defaults_.rules;
  if (agents.empty() && !defaults_.notify.empty()) agents = alerts::defaultRules();
  for (auto rule : agents) {
    if (alerts::has(rule.actions, Action::kCheckpoint) && !canCheckpoint(spec, rule)) {
      std::erase(rule.actions, Action::kCheckpoint);
    }
    const auto same = [&](const Rule& r) { return r.text == rule.text; };
    if (std::none_of(rules.begin(), rules.end(), same)) rules.push_back(std::move(rule));
  }
  return rules;
}

std::vector<std::string> AlertDesk::webhooksFor(const JobSpec& spec) const {
  std::vector<std::string> urls = spec.notify;
  for (const auto& url : defaults_.notify) {
    if (std::find(urls.begin(), urls.end(), url) == urls.end()) urls.push_back(url);
  }
  return urls;
}

void AlertDesk::publish(const alerts::Alert& alert, const std::vector<std::string>& urls) {
  if (alert.state == alerts::State::kPending) return;
  const std::string json = alerts::alertJson(alert);
  if (alert.notify) {
    // The job, then the alert as an undelivered event names it (a job id holds no newline).
    const std::string what =
        alert.jobId + "\n" + "alert '" + alert.rule + "' (" + std::string(alerts::stateName(alert.state)) + ")";
    for (const auto& url : urls) webhooks_.post(url, json, what);
  }
  std::lock_guard lock(mutex_);
  events_.push_back(alerts::alertEvent(alert));
}

std::vector<JobEvent> AlertDesk::takeEvents() {
  std::vector<JobEvent> out;
  {
    std::lock_guard lock(mutex_);
    out.swap(events_);
  }
  for (const auto& outcome : webhooks_.take()) {
    if (outcome.delivered) continue;
    const auto nl = outcome.what.find('\n');
    if (nl == std::string::npos) continue;
    JobEvent e;
    e.jobId = outcome.what.substr(0, nl);
    e.kind = JobEventKind::kAlertUndelivered;
    e.timeUnixUs = unixMicrosNow();
    e.message = outcome.what.substr(nl + 1) + " was not delivered to " + outcome.redactedUrl + ": " +
                outcome.why + " (" + std::to_string(outcome.attempts) + " attempt" + (outcome.attempts == 1 ? "" : "s") + ")";
    log_.info("job " + e.jobId + ": " + e.message);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace lockstep::agent
