#pragma once
// Alert rules (docs/alerts.md): `KPI OP VALUE [for DURATION] [-> ACTION[,ACTION]]`, or an event's
// name alone (`stalled`, `failed`, `finished`, `restarted`), or `loss is nan`. One catalogue of the
// KPIs a rule may name, with their units and where each is measured (job-wide on the job's
// supervising agent, per node on each node's figures). A malformed rule is refused naming the rule,
// the position and what was expected.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep::alerts {

enum class Op { kLess, kLessEqual, kGreater, kGreaterEqual, kIsNan, kEvent };
enum class Action { kNotify, kStop, kCheckpoint, kRestart };

// kPercent: 0..100 (a rule may write `30%` or `30`); kSeconds: a duration (`6h`, `90s`, or plain
// seconds); kMoney: the job's currency (its prices); kCelsius; kValue: as the program reports it
// (the loss); kEvent: no value, the rule fires when the event happens.
enum class Unit { kPercent, kSeconds, kMoney, kCelsius, kValue, kEvent };
enum class Scope { kJob, kNode };

struct KpiInfo {
  std::string_view name;  // as rules write it: "gpu_util"
  Unit unit;
  Scope scope;
  std::string_view meaning;  // one line for docs and --help
};
// Every KPI a rule may name, in the order docs/alerts.md lists them.
const std::vector<KpiInfo>& kpiCatalogue();
const KpiInfo* findKpi(std::string_view name);
std::string_view unitName(Unit unit);  // "%", "s", "money", "°C", "", "event"

struct Rule {
  std::string text;  // as written, with runs of blanks made one
  std::string kpi;
  Op op = Op::kEvent;
  double value = 0;      // in the KPI's unit (percent as 0..100, seconds, money, ...)
  std::int64_t forUs = 0;  // how long the condition must hold before the alert fires
  std::vector<Action> actions;  // never empty: a rule without `->` notifies
  bool operator==(const Rule&) const = default;
};

// Errors (kInvalidArgument): "alert rule 'gpu_util < x': at position 12: expected a percentage
// (30% or 30), found 'x'". Positions count from 1, in bytes of the rule as given.
Result<Rule> parseRule(std::string_view text);
Result<std::vector<Rule>> parseRules(const std::vector<std::string>& texts);
// Whether the rule holds for a value (kEvent rules: never; kIsNan: a NaN value).
bool holds(const Rule& rule, double value);

// failed, finished and restarted happen once: their alerts fire and never resolve.
inline bool isInstant(std::string_view kpi) { return kpi == "failed" || kpi == "finished" || kpi == "restarted"; }

// With --notify and no --alert: failed, stalled, restarted, finished, each -> notify.
std::vector<Rule> defaultRules();

std::string_view actionName(Action action);  // "notify", "stop", "checkpoint", "restart"
std::optional<Action> actionNamed(std::string_view name);
inline bool has(const std::vector<Action>& actions, Action action) {
  for (const Action a : actions) {
    if (a == action) return true;
  }
  return false;
}
std::string_view opText(Op op);              // "<", "<=", ">", ">=", "is nan", ""

}  // namespace lockstep::alerts
