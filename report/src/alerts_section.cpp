#include "alerts_section.h"

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/alerts/rules.h"
#include "text.h"

namespace lockstep::report::detail {
namespace {

// What a rule asked of the job, in words; never the webhooks' URLs (their paths hold secrets).
std::string rulesText(const JobSpec& spec) {
  std::string out;
  for (const auto& rule : spec.alertRules) out += (out.empty() ? "" : "; ") + rule;
  if (out.empty() && !spec.notify.empty()) out = "the default rules (failed, stalled, restarted, finished -> notify)";
  if (spec.budget) {
    out += (out.empty() ? "" : "; ") + std::string("a budget of ") + present::money(*spec.budget, spec.prices.currency);
  }
  if (!spec.notify.empty()) {
    out += "; " + std::to_string(spec.notify.size()) + (spec.notify.size() == 1 ? " webhook" : " webhooks");
  }
  return out;
}

// The value in the KPI's unit (alerts/rules.h unitName), as the rest of the report shows figures.
std::string valueText(const alerts::Alert& a, const std::string& currency) {
  if (!a.value) return dash();
  const double v = *a.value;
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "∞" : "−∞";
  if (a.unit == "%") return number(v, 1) + "%";
  if (a.unit == "s") return duration(v);
  if (a.unit == "money") return present::money(v, currency);
  if (a.unit == "°C") return number(v, 0) + " °C";
  if (a.unit.empty()) return number(v, 4);
  return number(v, 2) + " " + a.unit;
}

// What it is about: "rank 1 on node-a; data wait".
std::string aboutText(const alerts::Alert& a) {
  std::string out;
  if (!a.ranks.empty()) {
    out = a.ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < a.ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(a.ranks[i]);
  }
  if (!a.nodes.empty()) out += (out.empty() ? "" : " on ") + present::nodesText(a.nodes);
  if (!a.cause.empty()) out += (out.empty() ? "" : "; ") + a.cause;
  return out.empty() ? dash() : out;
}

// One alert's changes share a rule; a node's KPI is judged on each node apart, so there the node
// is part of which alert it is.
std::pair<std::string, std::vector<std::string>> keyOf(const alerts::Alert& a) {
  const alerts::KpiInfo* kpi = alerts::findKpi(a.kpi);
  return {a.rule, kpi != nullptr && kpi->scope == alerts::Scope::kNode ? a.nodes : std::vector<std::string>{}};
}

// For each change, whether it is a firing that no later change resolved. failed, finished and
// restarted never resolve (alerts::isInstant): theirs is not a loose end.
std::vector<bool> neverResolved(const std::vector<alerts::Alert>& changes) {
  std::vector<bool> out(changes.size(), false);
  std::map<std::pair<std::string, std::vector<std::string>>, std::size_t> open;  // key -> the firing change
  for (std::size_t i = 0; i < changes.size(); ++i) {
    const auto& a = changes[i];
    if (alerts::isInstant(a.kpi)) continue;
    if (a.state == alerts::State::kFiring) {
      open[keyOf(a)] = i;
    } else if (a.state == alerts::State::kResolved) {
      open.erase(keyOf(a));
    }
  }
  for (const auto& [key, i] : open) out[i] = true;
  return out;
}

}  // namespace

std::optional<Section> alertSection(const ReportData& data) {
  const JobSpec& spec = data.job.spec;
  const bool hadRules = !spec.alertRules.empty() || !spec.notify.empty() || spec.budget.has_value();
  if (!hadRules && data.alerts.empty() && data.undeliveredAlerts.empty()) return std::nullopt;
  Section s;
  s.heading = "Alerts";
  if (hadRules) s.paragraphs.push_back("Rules: " + rulesText(spec) + ".");
  if (data.alerts.empty()) s.paragraphs.push_back("No alert fired.");

  const bool ended = data.job.endedUnixUs > 0;
  const std::vector<bool> loose = neverResolved(data.alerts);
  std::size_t looseCount = 0;
  Table changes{"Firing and resolved", {"Time", "State", "Rule", "Value", "About", "Text"}, {}};
  for (std::size_t i = 0; i < data.alerts.size(); ++i) {
    const auto& a = data.alerts[i];
    std::string state(alerts::stateName(a.state));
    if (loose[i]) {
      state += ended ? ", never resolved" : ", not resolved yet";
      ++looseCount;
    }
    std::string text = a.text;
    if (!a.notify && !a.notNotifiedWhy.empty()) text += " (not notified: " + a.notNotifiedWhy + ")";
    changes.rows.push_back({displayTime(a.timeUs), std::move(state), a.rule, valueText(a, spec.prices.currency),
                            aboutText(a), std::move(text)});
  }
  if (looseCount > 0) {
    s.paragraphs.push_back(
        std::to_string(looseCount) + (looseCount == 1 ? " alert" : " alerts") + " fired and " +
        (ended ? "never resolved before the job ended." : "had not resolved when the report was written."));
  }
  if (!changes.rows.empty()) s.tables.push_back(std::move(changes));

  if (!data.undeliveredAlerts.empty()) {
    Table undelivered{"Webhooks that did not take an alert", {"Time", "What happened"}, {}};
    for (const auto& e : data.undeliveredAlerts) undelivered.rows.push_back({displayTime(e.timeUnixUs), e.message});
    s.tables.push_back(std::move(undelivered));
  }
  return s;
}

}  // namespace lockstep::report::detail
