#include "lockstep/alerts/alert.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

#include <nlohmann/json.hpp>

namespace lockstep::alerts {
namespace {

using Json = nlohmann::json;

// A job event's message and log tail are each at most 64 KiB (protocol/src/validate.cpp); stay
// well under so that a validated stream never refuses an alert.
constexpr std::size_t kMaxEventTextBytes = 4096;
constexpr std::size_t kMaxEventJsonBytes = 60 * 1024;

constexpr State kStates[] = {State::kPending, State::kFiring, State::kResolved};

// JSON has no NaN or infinity; a NaN loss is exactly what `loss is nan` reports, so it travels as
// a string.
Json numberJson(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

std::optional<double> numberOf(const Json& j) {
  if (j.is_number()) return j.get<double>();
  if (!j.is_string()) return std::nullopt;
  const auto& s = j.get_ref<const std::string&>();
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  return std::nullopt;
}

// "2026-12-05T21:30:00.123Z"
std::string rfc3339(std::int64_t unixUs) {
  const std::int64_t ms = unixUs >= 0 ? unixUs / 1000 : -((-unixUs + 999) / 1000);
  std::int64_t seconds = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
  const auto millis = static_cast<int>(ms - seconds * 1000);
  const auto t = static_cast<std::time_t>(seconds);
  std::tm parts{};
  gmtime_r(&t, &parts);
  char out[64];
  std::snprintf(out, sizeof out, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", parts.tm_year + 1900, parts.tm_mon + 1,
                parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec, millis);
  return out;
}

Json toJson(const Alert& a) {
  Json history = Json::array();
  for (const auto& [timeUs, value] : a.history) history.push_back(Json::array({timeUs, numberJson(value)}));
  Json actions = Json::array();
  for (const Action action : a.actions) actions.push_back(std::string(actionName(action)));
  return Json{{"job", a.jobId},
              {"rule", a.rule},
              {"kpi", a.kpi},
              {"state", std::string(stateName(a.state))},
              {"value", a.value ? numberJson(*a.value) : Json(nullptr)},
              {"unit", a.unit},
              {"started_at", rfc3339(a.startedAtUs)},
              {"started_at_us", a.startedAtUs},
              {"time_us", a.timeUs},
              {"ranks", a.ranks},
              {"nodes", a.nodes},
              {"cause", a.cause},
              {"history", std::move(history)},
              {"evidence", a.evidence},
              {"actions", std::move(actions)},
              {"notify", a.notify},
              {"not_notified_why", a.notNotifiedWhy},
              {"text", a.text}};
}

// Reads an alert's fields one by one, keeping the first thing wrong; nlohmann's accessors are only
// called on values whose type was checked, so nothing throws.
class Fields {
 public:
  explicit Fields(const Json& j) : j_(j) {}

  const Json* find(const char* key, bool required) {
    const auto it = j_.find(key);
    if (it == j_.end() || (it->is_null() && required)) {
      if (required) wrong(key, "is missing");
      return nullptr;
    }
    return &*it;
  }
  std::string text(const char* key, bool required = false) {
    const Json* v = find(key, required);
    if (v == nullptr) return {};
    if (!v->is_string()) return wrong(key, "is not a string"), std::string{};
    return v->get<std::string>();
  }
  std::int64_t integer(const char* key, bool required = false) {
    const Json* v = find(key, required);
    if (v == nullptr) return 0;
    if (!v->is_number_integer()) return wrong(key, "is not an integer"), 0;
    return v->get<std::int64_t>();
  }
  bool flag(const char* key, bool fallback) {
    const Json* v = find(key, false);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return wrong(key, "is not true or false"), fallback;
    return v->get<bool>();
  }
  std::optional<double> number(const char* key) {
    const Json* v = find(key, false);
    if (v == nullptr || v->is_null()) return std::nullopt;
    const auto n = numberOf(*v);
    if (!n) wrong(key, "is not a number");
    return n;
  }
  const Json* array(const char* key) {
    const Json* v = find(key, false);
    if (v != nullptr && !v->is_array()) return wrong(key, "is not an array"), nullptr;
    return v;
  }
  void wrong(const std::string& key, const std::string& what) {
    if (!error_) error_ = invalidArgument("alert JSON: \"" + key + "\" " + what);
  }
  const std::optional<Error>& error() const { return error_; }

 private:
  const Json& j_;
  std::optional<Error> error_;
};

void readLists(Fields& f, Alert& a) {
  if (const Json* ranks = f.array("ranks")) {
    for (const auto& r : *ranks) {
      if (!r.is_number_unsigned() || r.get<std::uint64_t>() > std::numeric_limits<std::uint32_t>::max()) {
        return f.wrong("ranks", "holds something other than a rank");
      }
      a.ranks.push_back(r.get<std::uint32_t>());
    }
  }
  if (const Json* nodes = f.array("nodes")) {
    for (const auto& n : *nodes) {
      if (!n.is_string()) return f.wrong("nodes", "holds something other than a node's name");
      a.nodes.push_back(n.get<std::string>());
    }
  }
  if (const Json* history = f.array("history")) {
    for (const auto& point : *history) {
      const auto value = point.is_array() && point.size() == 2 ? numberOf(point[1]) : std::nullopt;
      if (!value || !point[0].is_number_integer())
        return f.wrong("history", "holds something other than [time_us, value]");
      a.history.emplace_back(point[0].get<std::int64_t>(), *value);
    }
  }
}

void readActions(Fields& f, Alert& a) {
  const Json* actions = f.array("actions");
  if (actions == nullptr) return;
  for (const auto& name : *actions) {
    const auto match = name.is_string() ? actionNamed(name.get_ref<const std::string&>()) : std::nullopt;
    if (!match) return f.wrong("actions", "holds something other than notify, stop, checkpoint, restart");
    a.actions.push_back(*match);
  }
}

Result<Alert> fromJson(const Json& j) {
  if (!j.is_object()) return invalidArgument("alert JSON: not an object");
  Fields f(j);
  Alert a;
  a.jobId = f.text("job", true);
  a.rule = f.text("rule", true);
  a.kpi = f.text("kpi");
  const std::string state = f.text("state", true);
  bool known = false;
  for (const State s : kStates) {
    if (stateName(s) == state) a.state = s, known = true;
  }
  if (!known) f.wrong("state", "is not pending, firing or resolved");
  a.value = f.number("value");
  a.unit = f.text("unit");
  a.startedAtUs = f.integer("started_at_us");
  a.timeUs = f.integer("time_us", true);
  readLists(f, a);
  a.cause = f.text("cause");
  a.evidence = f.text("evidence");
  readActions(f, a);
  a.notify = f.flag("notify", true);
  a.notNotifiedWhy = f.text("not_notified_why");
  a.text = f.text("text");
  if (f.error()) return *f.error();
  return a;
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// The alert's JSON within a job event's limit: the evidence goes first (halved until it fits),
// then the oldest history, then long lists; what is left still says what fired.
std::string fittedJson(Alert a) {
  for (;;) {
    std::string json = dump(toJson(a));
    if (json.size() <= kMaxEventJsonBytes) return json;
    if (!a.evidence.empty()) {
      a.evidence = clipUtf8(std::move(a.evidence), a.evidence.size() / 2);
    } else if (!a.history.empty()) {
      a.history.erase(a.history.begin(), a.history.begin() + static_cast<long>((a.history.size() + 1) / 2));
    } else if (a.nodes.size() > 1 || a.ranks.size() > 1) {
      a.nodes.resize(a.nodes.size() / 2);
      a.ranks.resize(a.ranks.size() / 2);
    } else {
      a.text = clipUtf8(std::move(a.text), kMaxEventTextBytes);
      a.notNotifiedWhy = clipUtf8(std::move(a.notNotifiedWhy), 256);
      a.cause = clipUtf8(std::move(a.cause), 256);
      a.nodes.clear();
      if (dump(toJson(a)).size() > kMaxEventJsonBytes) a.jobId = clipUtf8(std::move(a.jobId), 256);
      return dump(toJson(a));
    }
  }
}

}  // namespace

std::string clipUtf8(std::string text, std::size_t bytes) {
  if (text.size() <= bytes) return text;
  std::size_t end = bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  text.resize(end);
  return text;
}


std::string_view stateName(State state) {
  switch (state) {
    case State::kPending:
      return "pending";
    case State::kFiring:
      return "firing";
    case State::kResolved:
      return "resolved";
  }
  return "";
}

std::string alertJson(const Alert& alert) { return dump(toJson(alert)); }

Result<Alert> alertFromJson(std::string_view json) {
  const Json j = Json::parse(json.begin(), json.end(), nullptr, false);
  if (j.is_discarded()) return invalidArgument("alert JSON: not valid JSON");
  try {
    return fromJson(j);
  } catch (const Json::exception& e) {
    // Not expected (types are checked first); kept so that no input can throw out of here.
    return invalidArgument(std::string("alert JSON: ") + e.what());
  }
}

// Precondition: a firing or resolved alert. Pending alerts are not events (nothing was notified);
// should one come, it travels as kAlertFiring with "pending" in its JSON, and alertOf() reads it
// back as pending.
JobEvent alertEvent(const Alert& alert) {
  JobEvent event;
  event.jobId = alert.jobId;
  event.kind = alert.state == State::kResolved ? JobEventKind::kAlertResolved : JobEventKind::kAlertFiring;
  event.timeUnixUs = alert.timeUs;
  if (!alert.ranks.empty()) event.rank = alert.ranks.front();
  event.message = clipUtf8(alert.text, kMaxEventTextBytes);
  event.logTail = fittedJson(alert);
  return event;
}

std::optional<Alert> alertOf(const JobEvent& event) {
  if (event.kind != JobEventKind::kAlertFiring && event.kind != JobEventKind::kAlertResolved) return std::nullopt;
  auto alert = alertFromJson(event.logTail);
  if (!alert) return std::nullopt;
  const bool resolved = alert->state == State::kResolved;
  if (resolved != (event.kind == JobEventKind::kAlertResolved)) return std::nullopt;
  return std::move(alert).value();
}

}  // namespace lockstep::alerts
