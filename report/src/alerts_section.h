#pragma once
// The report's Alerts section (HTML and PDF through the one Document): each change of the job's
// alerts (docs/alerts.md) as its supervising agent raised it, and the webhooks that did not take
// one. Private to report/.

#include <optional>

#include "lockstep/report/report.h"

namespace lockstep::report::detail {

// None when the job had no rule (no --alert, --notify or --budget) and no alert fired (an agent's
// own rules may fire for any job); "No alert fired." when it had rules and none fired.
std::optional<Section> alertSection(const ReportData& data);

}  // namespace lockstep::report::detail
