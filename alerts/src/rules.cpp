#include "lockstep/alerts/rules.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

namespace lockstep::alerts {
namespace {

// Long enough for any sensible rule, short enough that a rule quoted in an error or a webhook
// body stays readable.
constexpr std::size_t kMaxRuleBytes = 512;

// The one table of KPIs: parsing, the error messages that list names, the evaluator's units and
// the docs all read it.
const std::vector<KpiInfo> kCatalogue = {
    {"gpu_util", Unit::kPercent, Scope::kJob, "mean utilization of the job's GPUs, latest readings"},
    {"exposed_comm", Unit::kPercent, Scope::kJob, "share of step time spent in communication not hidden by compute"},
    {"throughput_drop", Unit::kPercent, Scope::kJob,
     "samples/s below the median of the job's recent readings, as a share of that median"},
    {"straggler_wait", Unit::kPercent, Scope::kJob, "share of step time the ranks spend waiting for the slowest rank"},
    {"mfu", Unit::kPercent, Scope::kJob, "model FLOPs utilization: the ranks' model FLOP/s over their peak, last 10 s"},
    {"loss", Unit::kValue, Scope::kJob, "the global loss (`loss is nan`: any rank's loss is NaN)"},
    {"cost", Unit::kMoney, Scope::kJob, "the job's cost so far, in its prices' currency"},
    {"projected_cost", Unit::kMoney, Scope::kJob, "the job's cost projected to its last step"},
    {"eta", Unit::kSeconds, Scope::kJob, "time left until the job's last step"},
    {"gpu_memory", Unit::kPercent, Scope::kNode, "memory used on a GPU, as a share of its memory"},
    {"gpu_temperature", Unit::kCelsius, Scope::kNode, "a GPU's temperature"},
    {"disk_free", Unit::kPercent, Scope::kNode, "free share of the disk the job writes to, per node"},
    {"stalled", Unit::kEvent, Scope::kJob, "the job's progress stopped (docs/stalls.md)"},
    {"failed", Unit::kEvent, Scope::kJob, "the job failed"},
    {"finished", Unit::kEvent, Scope::kJob, "the job finished"},
    {"restarted", Unit::kEvent, Scope::kJob, "the job restarted (elastic restart)"},
};

constexpr Action kActions[] = {Action::kNotify, Action::kStop, Action::kCheckpoint, Action::kRestart};

// "gpu_util, exposed_comm, ..." or the events' names: what an unknown KPI's error lists.
std::string catalogueNames(bool events) {
  std::string out;
  for (const auto& kpi : kCatalogue) {
    if ((kpi.unit == Unit::kEvent) != events) continue;
    out += (out.empty() ? "" : ", ") + std::string(kpi.name);
  }
  return out;
}

enum class Tok { kWord, kNumber, kOp, kArrow, kComma, kOther, kEnd };

struct Token {
  Tok kind = Tok::kEnd;
  std::string_view text;
  std::size_t pos = 0;  // 0-based byte offset
};

bool isWordStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool isWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool isBlank(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool isDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// Splits the rule into words, numbers (with their unit glued on: `30%`, `1h30m`, `1e-3`),
// comparisons, `->` and commas, so `gpu_util<30%` reads as well as `gpu_util < 30%`.
class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  Token next() {
    while (at_ < text_.size() && isBlank(text_[at_])) ++at_;
    const std::size_t start = at_;
    if (at_ >= text_.size()) return {Tok::kEnd, {}, start};
    const char c = text_[at_];
    if (isWordStart(c)) return take(Tok::kWord, start, wordEnd(start));
    if (startsNumber(start)) return take(Tok::kNumber, start, numberEnd(start));
    if (c == '-' && peek(start + 1) == '>') return take(Tok::kArrow, start, start + 2);
    if (c == '<' || c == '>') return take(Tok::kOp, start, start + (peek(start + 1) == '=' ? 2 : 1));
    if (c == ',') return take(Tok::kComma, start, start + 1);
    std::size_t end = start;
    while (end < text_.size() && !isBlank(text_[end])) ++end;
    return take(Tok::kOther, start, end);
  }

 private:
  char peek(std::size_t i) const { return i < text_.size() ? text_[i] : '\0'; }
  bool startsNumber(std::size_t i) const {
    const char c = peek(i);
    if (c == '-' || c == '+') return isDigit(peek(i + 1)) || (peek(i + 1) == '.' && isDigit(peek(i + 2)));
    return isDigit(c) || (c == '.' && isDigit(peek(i + 1)));
  }
  std::size_t wordEnd(std::size_t i) const {
    while (i < text_.size() && isWordChar(text_[i])) ++i;
    return i;
  }
  std::size_t numberEnd(std::size_t i) const {
    ++i;  // the sign or first digit
    while (i < text_.size()) {
      const char c = text_[i];
      const bool exponentSign = (c == '-' || c == '+') && (peek(i - 1) == 'e' || peek(i - 1) == 'E') &&
                                isDigit(peek(i + 1)) && (i < 2 || isDigit(peek(i - 2)) || peek(i - 2) == '.');
      if (!isWordChar(c) && c != '.' && c != '%' && !exponentSign) break;
      ++i;
    }
    return i;
  }
  Token take(Tok kind, std::size_t start, std::size_t end) {
    at_ = end;
    return {kind, text_.substr(start, end - start), start};
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

std::optional<double> parseNumber(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

// `1h30m`, `90s`, `500ms`, `2d`: one or more number-unit pairs, in seconds. Plain numbers are the
// caller's business (a threshold may be plain seconds, a `for` may not).
std::optional<double> parseDuration(std::string_view text) {
  double seconds = 0;
  bool any = false;
  while (!text.empty()) {
    std::size_t digits = 0;
    while (digits < text.size() && (isDigit(text[digits]) || text[digits] == '.')) ++digits;
    std::size_t letters = digits;
    while (letters < text.size() && std::isalpha(static_cast<unsigned char>(text[letters]))) ++letters;
    const auto number = parseNumber(text.substr(0, digits));
    const std::string_view unit = text.substr(digits, letters - digits);
    if (!number) return std::nullopt;
    double scale = 0;
    if (unit == "ms")
      scale = 0.001;
    else if (unit == "s")
      scale = 1;
    else if (unit == "m")
      scale = 60;
    else if (unit == "h")
      scale = 3600;
    else if (unit == "d")
      scale = 86400;
    else
      return std::nullopt;
    seconds += *number * scale;
    any = true;
    text.remove_prefix(letters);
  }
  if (!any) return std::nullopt;
  return seconds;
}

std::string found(const Token& token) {
  if (token.kind == Tok::kEnd) return "found the end of the rule";
  return "found '" + std::string(token.text) + "'";
}

// Reads one rule, token by token; each step says what it expected when the rule has something else.
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text), lexer_(text) { advance(); }

  Result<Rule> parse() {
    if (tok_.kind != Tok::kWord || findKpi(tok_.text) == nullptr) {
      return expected("a KPI (" + catalogueNames(false) + ") or an event (" + catalogueNames(true) + ")");
    }
    const KpiInfo& kpi = *findKpi(tok_.text);
    rule_.kpi = std::string(kpi.name);
    advance();
    if (kpi.unit == Unit::kEvent) {
      rule_.op = Op::kEvent;
      return tail(false);
    }
    LOCKSTEP_TRY(condition(kpi));
    return tail(rule_.op != Op::kIsNan);
  }

 private:
  void advance() { tok_ = lexer_.next(); }

  Error expected(const std::string& what) const { return fail(tok_, "expected " + what + ", " + found(tok_)); }
  Error fail(const Token& at, const std::string& what) const {
    return invalidArgument("alert rule '" + std::string(text_) + "': at position " + std::to_string(at.pos + 1) + ": " +
                           what);
  }

  // `OP VALUE`, or `is nan` for the loss.
  Result<void> condition(const KpiInfo& kpi) {
    const bool nanAllowed = kpi.name == "loss";
    if (nanAllowed && tok_.kind == Tok::kWord && tok_.text == "is") {
      advance();
      if (tok_.kind != Tok::kWord || tok_.text != "nan") return expected("`nan` (as in `loss is nan`)");
      rule_.op = Op::kIsNan;
      advance();
      return {};
    }
    if (tok_.kind != Tok::kOp) {
      return expected(nanAllowed ? "a comparison (<, <=, >, >=) or `is nan`" : "a comparison (<, <=, >, >=)");
    }
    rule_.op = tok_.text == "<"    ? Op::kLess
               : tok_.text == "<=" ? Op::kLessEqual
               : tok_.text == ">"  ? Op::kGreater
                                   : Op::kGreaterEqual;
    advance();
    return threshold(kpi);
  }

  Result<void> threshold(const KpiInfo& kpi) {
    const std::string_view t = tok_.kind == Tok::kNumber ? tok_.text : std::string_view{};
    std::optional<double> value;
    std::string what;
    switch (kpi.unit) {
      case Unit::kPercent:
        value = parseNumber(!t.empty() && t.back() == '%' ? t.substr(0, t.size() - 1) : t);
        what = "a percentage (30% or 30)";
        break;
      case Unit::kSeconds:
        value = parseNumber(t);
        if (!value && !t.empty() && t.front() != '-') value = parseDuration(t);
        what = "a duration (90s, 10m, 6h, 1h30m, 2d, or seconds)";
        break;
      case Unit::kMoney:
        value = parseNumber(t);
        what = "an amount of money (a plain number: " + std::string(kpi.name) + " is not a percentage)";
        break;
      case Unit::kCelsius:
        value = parseNumber(t);
        what = "a temperature in °C (a plain number)";
        break;
      default:
        value = parseNumber(t);
        what = "a number";
        break;
    }
    if (!value) return expected(what);
    rule_.value = *value;
    advance();
    return {};
  }

  // `[for DURATION] [-> ACTIONS]` and the end of the rule.
  Result<Rule> tail(bool forAllowed) {
    if (forAllowed && tok_.kind == Tok::kWord && tok_.text == "for") {
      advance();
      LOCKSTEP_TRY(forDuration());
    }
    if (tok_.kind == Tok::kArrow) {
      advance();
      LOCKSTEP_TRY(actions());
    } else {
      rule_.actions = {Action::kNotify};
    }
    if (tok_.kind != Tok::kEnd) {
      const bool forNext = forAllowed && rule_.forUs == 0;
      if (!rule_.actions.empty() && lastWasActions_) return expected("',' or the end of the rule");
      return expected(forNext ? "`for DURATION`, `-> ACTIONS` or the end of the rule"
                              : "`-> ACTIONS` or the end of the rule");
    }
    return rule_;
  }

  Result<void> forDuration() {
    const std::string_view t = tok_.kind == Tok::kNumber ? tok_.text : std::string_view{};
    const auto seconds = t.empty() || t.front() == '-' ? std::nullopt : parseDuration(t);
    const double us = seconds ? std::round(*seconds * 1e6) : 0;
    if (!seconds || us < 1 || us > static_cast<double>(std::numeric_limits<std::int64_t>::max() / 2)) {
      return expected("a positive duration (500ms, 30s, 10m, 2h)");
    }
    rule_.forUs = static_cast<std::int64_t>(us);
    advance();
    return {};
  }

  Result<void> actions() {
    lastWasActions_ = true;
    std::optional<Token> checkpoint;
    for (;;) {
      const auto action = actionOf(tok_);
      if (!action) return expected("an action (notify, stop, checkpoint, restart)");
      if (std::find(rule_.actions.begin(), rule_.actions.end(), *action) != rule_.actions.end()) {
        return expected("an action not listed yet");
      }
      if (*action == Action::kCheckpoint) checkpoint = tok_;
      rule_.actions.push_back(*action);
      advance();
      if (tok_.kind != Tok::kComma) break;
      advance();
    }
    const bool stops = std::find(rule_.actions.begin(), rule_.actions.end(), Action::kStop) != rule_.actions.end();
    if (checkpoint && !stops)
      return fail(*checkpoint, "checkpoint is only an action with stop: write `checkpoint,stop`");
    return {};
  }

  static std::optional<Action> actionOf(const Token& token) {
    return token.kind == Tok::kWord ? actionNamed(token.text) : std::nullopt;
  }

  std::string_view text_;
  Lexer lexer_;
  Token tok_;
  Rule rule_;
  bool lastWasActions_ = false;
};

std::string collapseBlanks(std::string_view text) {
  std::string out;
  bool blank = false;
  for (const char c : text) {
    if (isBlank(c)) {
      blank = true;
      continue;
    }
    if (blank && !out.empty()) out += ' ';
    blank = false;
    out += c;
  }
  return out;
}

}  // namespace

const std::vector<KpiInfo>& kpiCatalogue() { return kCatalogue; }

const KpiInfo* findKpi(std::string_view name) {
  for (const auto& kpi : kCatalogue) {
    if (kpi.name == name) return &kpi;
  }
  return nullptr;
}

std::string_view unitName(Unit unit) {
  switch (unit) {
    case Unit::kPercent:
      return "%";
    case Unit::kSeconds:
      return "s";
    case Unit::kMoney:
      return "money";
    case Unit::kCelsius:
      return "°C";
    case Unit::kValue:
      return "";
    case Unit::kEvent:
      return "event";
  }
  return "";
}

std::optional<Action> actionNamed(std::string_view name) {
  for (const Action a : kActions) {
    if (actionName(a) == name) return a;
  }
  return std::nullopt;
}

std::string_view actionName(Action action) {
  switch (action) {
    case Action::kNotify:
      return "notify";
    case Action::kStop:
      return "stop";
    case Action::kCheckpoint:
      return "checkpoint";
    case Action::kRestart:
      return "restart";
  }
  return "";
}

std::string_view opText(Op op) {
  switch (op) {
    case Op::kLess:
      return "<";
    case Op::kLessEqual:
      return "<=";
    case Op::kGreater:
      return ">";
    case Op::kGreaterEqual:
      return ">=";
    case Op::kIsNan:
      return "is nan";
    case Op::kEvent:
      return "";
  }
  return "";
}

Result<Rule> parseRule(std::string_view text) {
  if (text.size() > kMaxRuleBytes) {
    return invalidArgument("alert rule '" + std::string(text.substr(0, 60)) + "...': it is " +
                           std::to_string(text.size()) + " bytes long; the limit is " + std::to_string(kMaxRuleBytes));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(Rule rule, Parser(text).parse());
  rule.text = collapseBlanks(text);
  return rule;
}

Result<std::vector<Rule>> parseRules(const std::vector<std::string>& texts) {
  std::vector<Rule> rules;
  rules.reserve(texts.size());
  for (const auto& text : texts) {
    LOCKSTEP_ASSIGN_OR_RETURN(Rule rule, parseRule(text));
    rules.push_back(std::move(rule));
  }
  return rules;
}

bool holds(const Rule& rule, double value) {
  switch (rule.op) {
    case Op::kLess:
      return value < rule.value;
    case Op::kLessEqual:
      return value <= rule.value;
    case Op::kGreater:
      return value > rule.value;
    case Op::kGreaterEqual:
      return value >= rule.value;
    case Op::kIsNan:
      return std::isnan(value);
    case Op::kEvent:
      return false;
  }
  return false;
}

std::vector<Rule> defaultRules() {
  std::vector<Rule> rules;
  for (const char* text : {"failed", "stalled", "restarted", "finished"}) {
    // These literals are known good; a failure here is a bug in the table above.
    rules.push_back(parseRule(text).value());
  }
  return rules;
}

}  // namespace lockstep::alerts
