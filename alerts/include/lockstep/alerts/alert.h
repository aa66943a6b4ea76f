#pragma once
// One alert as it changes state (Alertmanager's semantics: pending while its condition has held
// for less than the rule's `for`, then firing once, then resolved), with its evidence, and its
// one JSON form: the webhook's body, a job event's payload (and so the history, reports,
// `lockstepctl alerts`, the app) are this JSON.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lockstep/alerts/rules.h"
#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::alerts {

enum class State { kPending, kFiring, kResolved };
std::string_view stateName(State state);  // "pending", "firing", "resolved"

struct Alert {
  std::string jobId;
  std::string rule;  // the rule's text
  std::string kpi;
  State state = State::kFiring;
  std::optional<double> value;  // in the KPI's unit; unset for events
  std::string unit;             // unitName() of the KPI
  std::int64_t startedAtUs = 0;   // when the condition began to hold (Unix µs)
  std::int64_t timeUs = 0;        // of this change of state
  std::vector<std::uint32_t> ranks;  // what it is about: the straggler, the stalled ranks, ...
  std::vector<std::string> nodes;
  std::string cause;  // for a straggler: "data wait", "compute", ...; else empty
  std::vector<std::pair<std::int64_t, double>> history;  // the value's recent readings (Unix µs, value)
  std::string evidence;  // a stall's diagnosis and stacks, a failure's message; clipped
  std::vector<Action> actions;
  bool notify = true;           // false: rate limited, or the rule does not notify
  std::string notNotifiedWhy;   // why not, in words
  std::string text;             // one line for people (Slack shows it as it is)
  bool operator==(const Alert&) const = default;
};

inline constexpr std::size_t kMaxEvidenceBytes = 16 * 1024;
// At most `bytes` of `text`, never cutting a UTF-8 sequence in two (the JSON must stay valid UTF-8).
std::string clipUtf8(std::string text, std::size_t bytes);
inline constexpr std::size_t kMaxHistoryPoints = 60;

// {"job", "rule", "kpi", "state", "value" (null when unset; NaN as "nan"), "unit", "started_at"
// (RFC 3339 UTC, milliseconds), "started_at_us", "time_us", "ranks", "nodes", "cause", "history"
// ([[time_us, value], ...]), "evidence", "actions", "notify", "not_notified_why", "text"}.
std::string alertJson(const Alert& alert);
Result<Alert> alertFromJson(std::string_view json);

// The job event that carries it into the stream (kAlertFiring / kAlertResolved; message: the
// text, logTail: the JSON), and back.
JobEvent alertEvent(const Alert& alert);
std::optional<Alert> alertOf(const JobEvent& event);

}  // namespace lockstep::alerts
