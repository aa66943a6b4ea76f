#include "lockstep/alerts/book.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <optional>

namespace lockstep::alerts {
namespace {

using kpi::JobKpis;
using kpi::Maybe;

constexpr std::int64_t kMinuteUs = 60'000'000;
// One throughput reading per 5 s at most: the baseline is a median over minutes, and evaluating
// more often must not let a burst of readings outweigh the rest.
constexpr std::int64_t kBaselineSpacingUs = 5'000'000;
constexpr std::size_t kMaxListed = 8;          // ranks or nodes named in an alert's text
constexpr std::size_t kMaxMessageBytes = 300;  // of a failure's or a stall's message in the text

std::string firstLine(const std::string& text) { return clipUtf8(text.substr(0, text.find('\n')), kMaxMessageBytes); }

std::string fixed(double value, const char* format) {
  char out[64];
  std::snprintf(out, sizeof out, format, value);
  return out;
}

// "6h05m", "12m30s", "45s": how people read an ETA.
std::string durationText(double seconds) {
  if (!(seconds >= 0) || seconds > 1e12) return fixed(seconds, "%.0fs");
  const auto s = static_cast<long long>(std::llround(seconds));
  char out[64];
  if (s >= 86400)
    std::snprintf(out, sizeof out, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
  else if (s >= 3600)
    std::snprintf(out, sizeof out, "%lldh%02lldm", s / 3600, s % 3600 / 60);
  else if (s >= 60)
    std::snprintf(out, sizeof out, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(out, sizeof out, "%llds", s);
  return out;
}

std::string valueText(double value, Unit unit) {
  if (std::isnan(value)) return "nan";
  switch (unit) {
    case Unit::kPercent:
      return fixed(value, "%.1f%%");
    case Unit::kSeconds:
      return durationText(value);
    case Unit::kMoney:
      return fixed(value, "%.2f");
    case Unit::kCelsius:
      return fixed(value, "%.0f°C");
    default:
      return fixed(value, "%.4g");
  }
}

// "0-3, 5, 7-9", the first kMaxListed groups and how many more.
std::string rankList(std::vector<std::uint32_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  std::size_t groups = 0;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (groups++ == kMaxListed) return out + " and " + std::to_string(ranks.size() - i) + " more";
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string nodeList(const std::vector<std::string>& nodes) {
  std::string out;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (i == kMaxListed) return out + " and " + std::to_string(nodes.size() - i) + " more";
    out += (i == 0 ? "" : ", ") + nodes[i];
  }
  return out;
}

void addNode(std::vector<std::string>& nodes, const std::string& node) {
  if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
}

bool notifies(const Rule& rule) { return has(rule.actions, Action::kNotify); }

// What one rule reads from the KPIs at one moment: the value, and what it is about.
struct Reading {
  Maybe value;
  std::vector<std::uint32_t> ranks;
  std::vector<std::string> nodes;
  std::string cause;
  std::string detail;  // appended to the value in the alert's text
};

// Per-GPU or per-node figures, for node-scoped KPIs: the rule holds if any one of them does, so
// the value shown is the extreme in the rule's direction (the hottest GPU for `>`, the fullest
// disk for `disk_free <`), and the nodes named are those where the rule holds.
struct Extreme {
  const Rule& rule;
  Reading reading;
  void add(const std::string& node, double value) {
    const bool below = rule.op == Op::kLess || rule.op == Op::kLessEqual;
    if (!reading.value || (below ? value < *reading.value : value > *reading.value)) reading.value = value;
    if (holds(rule, value)) addNode(reading.nodes, node);
  }
  Reading done() {
    if (!reading.nodes.empty()) reading.detail = " on " + nodeList(reading.nodes);
    return std::move(reading);
  }
};

std::string rankNode(const JobKpis& k, std::uint32_t rank) {
  for (const auto& r : k.ranks) {
    if (r.rank == rank && !r.node.empty()) return r.node;
  }
  for (const auto& s : k.slowestRanks) {
    if (s.rank == rank && !s.node.empty()) return s.node;
  }
  return {};
}

// "rank 1 on node-a", with the straggler's cause ("data wait") when the KPI engine knows it.
void nameStraggler(const JobKpis& k, Reading& r, std::string& who) {
  if (!k.slowestRank) return;
  const std::uint32_t rank = *k.slowestRank;
  const std::string node = rankNode(k, rank);
  r.ranks = {rank};
  if (!node.empty()) r.nodes = {node};
  if (k.slowestCause != kpi::SlowCause::kUnknown) r.cause = std::string(kpi::slowCauseName(k.slowestCause));
  who = "rank " + std::to_string(rank) + (node.empty() ? "" : " on " + node);
}

Reading gpuUtil(const Rule& rule, const JobKpis& k, const NodeFacts&) {
  Reading r;
  double sum = 0;
  std::size_t n = 0;
  for (const auto& g : k.gpus) {
    if (!g.utilizationPct) continue;
    sum += *g.utilizationPct;
    ++n;
    if (holds(rule, *g.utilizationPct)) addNode(r.nodes, g.node);
  }
  if (n == 0) return {};
  r.value = sum / static_cast<double>(n);
  if (!r.nodes.empty()) r.detail = " (GPUs on " + nodeList(r.nodes) + ")";
  return r;
}

Reading exposedComm(const Rule&, const JobKpis& k, const NodeFacts&) {
  Reading r;
  if (!k.commOverhead) return r;
  r.value = *k.commOverhead * 100;
  std::vector<std::uint32_t> ranks;
  for (const auto& rank : k.ranks) {
    if (rank.commOverhead) ranks.push_back(rank.rank);
  }
  if (!ranks.empty()) r.detail = " (ranks " + rankList(ranks) + ")";
  std::string who;
  nameStraggler(k, r, who);
  if (!who.empty()) r.detail += "; straggler " + who + (r.cause.empty() ? "" : " (" + r.cause + ")");
  return r;
}

Reading stragglerWait(const Rule&, const JobKpis& k, const NodeFacts&) {
  Reading r;
  if (!k.stragglerWaitShare || !k.commOverhead) return r;
  r.value = *k.stragglerWaitShare * *k.commOverhead * 100;
  std::string who;
  nameStraggler(k, r, who);
  if (!who.empty()) r.detail = ": " + who + " is the straggler" + (r.cause.empty() ? "" : " (" + r.cause + ")");
  return r;
}

// The job's MFU as a percentage (docs/kpis.md, MFU), naming the ranks where the rule holds.
Reading mfu(const Rule& rule, const JobKpis& k, const NodeFacts&) {
  Reading r;
  if (!k.mfu) return r;
  r.value = *k.mfu * 100;
  for (const auto& rank : k.ranks) {
    if (!rank.mfu || !holds(rule, *rank.mfu * 100)) continue;
    r.ranks.push_back(rank.rank);
    if (!rank.node.empty()) addNode(r.nodes, rank.node);
  }
  if (!r.ranks.empty()) r.detail = " (ranks " + rankList(r.ranks) + " on " + nodeList(r.nodes) + ")";
  return r;
}

// The global loss, or the ranks' mean before the first global loss; for `loss is nan`, NaN as soon
// as any rank's loss is, naming those ranks.
Reading loss(const Rule& rule, const JobKpis& k, const NodeFacts&) {
  Reading r;
  double sum = 0;
  std::size_t n = 0;
  for (const auto& rank : k.ranks) {
    if (rule.op == Op::kIsNan && rank.lossIsNan) r.ranks.push_back(rank.rank);
    if (!rank.loss) continue;
    sum += *rank.loss;
    ++n;
  }
  if (k.lastGlobalLoss)
    r.value = *k.lastGlobalLoss;
  else if (n > 0)
    r.value = sum / static_cast<double>(n);
  if (!r.ranks.empty()) {
    r.value = std::numeric_limits<double>::quiet_NaN();
    r.detail = " on ranks " + rankList(r.ranks);
    for (const auto rank : r.ranks) {
      const std::string node = rankNode(k, rank);
      if (!node.empty()) addNode(r.nodes, node);
    }
  }
  return r;
}

Reading gpuMemory(const Rule& rule, const JobKpis& k, const NodeFacts& facts) {
  Extreme e{rule, {}};
  for (const auto& g : k.gpus) {
    const auto total = facts.gpuMemoryTotalBytes.find({g.node, g.index});
    if (!g.memoryUsedBytes || total == facts.gpuMemoryTotalBytes.end() || total->second == 0) continue;
    e.add(g.node, *g.memoryUsedBytes / static_cast<double>(total->second) * 100);
  }
  return e.done();
}

Reading gpuTemperature(const Rule& rule, const JobKpis& k, const NodeFacts&) {
  Extreme e{rule, {}};
  for (const auto& g : k.gpus) {
    if (g.temperatureC) e.add(g.node, *g.temperatureC);
  }
  return e.done();
}

Reading diskFree(const Rule& rule, const JobKpis&, const NodeFacts& facts) {
  Extreme e{rule, {}};
  for (const auto& [node, pct] : facts.diskFreePct) e.add(node, pct);
  return e.done();
}

Reading plain(Maybe value) { return Reading{value, {}, {}, {}, {}}; }

}  // namespace

struct AlertBook::Impl {
  enum class Phase { kInactive, kPending, kFiring };

  // One rule's state. `current` is what active() shows: the last change, its value kept fresh.
  struct Slot {
    Rule rule;
    Unit unit = Unit::kValue;
    Phase phase = Phase::kInactive;
    Alert current;
    std::deque<std::pair<std::int64_t, double>> history;
  };

  // A stall seen and not yet ended: its alert waits for the stalled rank's stacks, or for
  // evidenceWaitUs, then fires with what came.
  struct Stall {
    std::optional<std::uint32_t> rank;
    std::int64_t startUs = 0;
    std::string diagnosis;
    std::vector<JobEvent> evidence;
    bool fired = false;
  };

  std::string jobId;
  std::vector<Rule> rules;
  Options options;
  std::vector<Slot> slots;
  std::vector<Alert> outbox;                             // changes from events, returned by the next evaluate()
  std::deque<std::int64_t> notified;                     // times of the notified changes, the last minute's
  std::deque<std::pair<std::int64_t, double>> baseline;  // samples/s readings for throughput_drop
  std::map<std::uint32_t, std::string> rankNodes;        // from the last KPIs, to place stalled ranks
  std::optional<Stall> stall;
  bool ended = false;

  Impl(std::string job, std::vector<Rule> r, Options o) : jobId(std::move(job)), rules(std::move(r)), options(o) {
    for (const auto& rule : rules) {
      const KpiInfo* info = findKpi(rule.kpi);
      slots.push_back(Slot{rule, info != nullptr ? info->unit : Unit::kValue, Phase::kInactive, {}, {}});
    }
  }

  // ---- changes of state ----

  Alert base(const Slot& slot, State state, std::int64_t startedAtUs, std::int64_t nowUs) const {
    Alert a;
    a.jobId = jobId;
    a.rule = slot.rule.text;
    a.kpi = slot.rule.kpi;
    a.state = state;
    a.unit = std::string(unitName(slot.unit));
    a.startedAtUs = startedAtUs;
    a.timeUs = nowUs;
    a.actions = slot.rule.actions;
    a.history.assign(slot.history.begin(), slot.history.end());
    return a;
  }

  // Whether a firing or resolved change is notified: the rule must ask for it, and the job must not
  // have had maxNotificationsPerMinute notified changes in the last minute.
  void decideNotify(const Rule& rule, Alert& a) {
    a.notify = false;
    if (a.state == State::kPending) {
      a.notNotifiedWhy = "pending: alerts are notified when they fire";
      return;
    }
    if (!notifies(rule)) {
      a.notNotifiedWhy = "the rule does not notify";
      return;
    }
    while (!notified.empty() && notified.front() <= a.timeUs - kMinuteUs) notified.pop_front();
    if (notified.size() >= options.maxNotificationsPerMinute) {
      a.notNotifiedWhy =
          "more than " + std::to_string(options.maxNotificationsPerMinute) + " notifications for this job in a minute";
      return;
    }
    notified.push_back(a.timeUs);
    a.notify = true;
  }

  void emit(Slot& slot, Alert a, std::vector<Alert>& out) {
    // A receiver that never heard it fire is not told it resolved.
    const bool firingUnheard = a.state == State::kResolved && slot.phase == Phase::kFiring && !slot.current.notify;
    decideNotify(slot.rule, a);
    if (firingUnheard && a.notify) {
      notified.pop_back();
      a.notify = false;
      a.notNotifiedWhy = "its firing was not notified: " + slot.current.notNotifiedWhy;
    }
    slot.phase = a.state == State::kPending  ? Phase::kPending
                 : a.state == State::kFiring ? Phase::kFiring
                                             : Phase::kInactive;
    slot.current = a;
    out.push_back(std::move(a));
  }

  // ---- KPI rules ----

  Reading read(const Slot& slot, const JobKpis& k, const NodeFacts& facts) const {
    const Rule& rule = slot.rule;
    const std::string& name = rule.kpi;
    if (name == "gpu_util") return gpuUtil(rule, k, facts);
    if (name == "exposed_comm") return exposedComm(rule, k, facts);
    if (name == "throughput_drop") return throughputDrop(k);
    if (name == "straggler_wait") return stragglerWait(rule, k, facts);
    if (name == "mfu") return mfu(rule, k, facts);
    if (name == "loss") return loss(rule, k, facts);
    if (name == "cost") return plain(k.costSoFar);
    if (name == "projected_cost") return plain(k.costProjected);
    if (name == "eta") return plain(k.etaSeconds);
    if (name == "gpu_memory") return gpuMemory(rule, k, facts);
    if (name == "gpu_temperature") return gpuTemperature(rule, k, facts);
    if (name == "disk_free") return diskFree(rule, k, facts);
    return {};  // events: not read from the KPIs
  }

  // The job's own pace: frozen while a drop is pending or firing, so that a long drop does not
  // become the pace it is measured against (and resolve with nothing recovered).
  void noteThroughput(const JobKpis& k, std::int64_t nowUs) {
    const bool dropping = std::any_of(slots.begin(), slots.end(), [](const Slot& s) {
      const bool aboveIsBad = s.rule.op == Op::kGreater || s.rule.op == Op::kGreaterEqual;
      return s.rule.kpi == "throughput_drop" && aboveIsBad && s.phase != Phase::kInactive;
    });
    if (dropping) return;
    while (!baseline.empty() && baseline.front().first <= nowUs - options.baselineUs) baseline.pop_front();
    if (!k.samplesPerSecond || !std::isfinite(*k.samplesPerSecond)) return;
    if (!baseline.empty() && nowUs - baseline.back().first < kBaselineSpacingUs) return;
    baseline.emplace_back(nowUs, *k.samplesPerSecond);
  }

  Reading throughputDrop(const JobKpis& k) const {
    if (!k.samplesPerSecond || baseline.size() < std::max<std::size_t>(1, options.minBaselineReadings)) return {};
    std::vector<double> values;
    for (const auto& [t, v] : baseline) values.push_back(v);
    const std::size_t mid = values.size() / 2;
    std::nth_element(values.begin(), values.begin() + static_cast<long>(mid), values.end());
    double median = values[mid];
    if (values.size() % 2 == 0)
      median = (median + *std::max_element(values.begin(), values.begin() + static_cast<long>(mid))) / 2;
    if (!(median > 0)) return {};
    Reading r;
    r.value = std::max(0.0, (median - *k.samplesPerSecond) / median * 100);
    r.detail =
        " (" + fixed(*k.samplesPerSecond, "%.1f") + " samples/s against a median of " + fixed(median, "%.1f") + ")";
    return r;
  }

  std::string text(const Slot& slot, std::string_view state, const Reading& r) const {
    const std::string value = r.value ? valueText(*r.value, slot.unit) : "unknown";
    return "job " + jobId + ": " + slot.rule.text + " " + std::string(state) + ": " + value + r.detail;
  }

  void remember(Slot& slot, const Reading& r, std::int64_t nowUs) {
    if (!r.value) return;
    slot.history.emplace_back(nowUs, *r.value);
    while (slot.history.size() > kMaxHistoryPoints) slot.history.pop_front();
  }

  Alert withReading(const Slot& slot, State state, const Reading& r, std::int64_t startedAtUs,
                    std::int64_t nowUs) const {
    Alert a = base(slot, state, startedAtUs, nowUs);
    a.value = r.value;
    a.ranks = r.ranks;
    a.nodes = r.nodes;
    a.cause = r.cause;
    a.text = text(slot, state == State::kPending ? "is pending" : "is firing", r);
    return a;
  }

  // inactive -> pending -> firing -> resolved (inactive); a pending that stops holding goes back to
  // inactive without a word: nothing was notified.
  void step(Slot& slot, const Reading& r, std::int64_t nowUs, std::vector<Alert>& out) {
    remember(slot, r, nowUs);
    const bool holding = r.value && holds(slot.rule, *r.value);
    if (!holding) {
      if (slot.phase == Phase::kFiring) resolve(slot, r, nowUs, r.value ? "" : "no longer measured", out);
      slot.phase = Phase::kInactive;
      return;
    }
    if (slot.phase == Phase::kInactive) {
      if (slot.rule.forUs > 0) return emit(slot, withReading(slot, State::kPending, r, nowUs, nowUs), out);
      return emit(slot, withReading(slot, State::kFiring, r, nowUs, nowUs), out);
    }
    const std::int64_t startedAtUs = slot.current.startedAtUs;
    if (slot.phase == Phase::kPending && nowUs - startedAtUs >= slot.rule.forUs) {
      return emit(slot, withReading(slot, State::kFiring, r, startedAtUs, nowUs), out);
    }
    // Still pending, or firing: no new change, but active() shows the latest reading.
    slot.current.value = r.value;
    slot.current.history.assign(slot.history.begin(), slot.history.end());
  }

  // Resolved keeps what the firing was about (its ranks, nodes, cause), so receivers match the two.
  void resolve(Slot& slot, const Reading& r, std::int64_t nowUs, const std::string& why, std::vector<Alert>& out) {
    Alert a = base(slot, State::kResolved, slot.current.startedAtUs, nowUs);
    a.value = r.value;
    a.ranks = slot.current.ranks;
    a.nodes = slot.current.nodes;
    a.cause = slot.current.cause;
    a.evidence = slot.current.evidence;
    const std::string value = r.value ? valueText(*r.value, slot.unit) : "";
    a.text = "job " + jobId + ": " + slot.rule.text + " resolved: " + (why.empty() ? value : why);
    emit(slot, std::move(a), out);
  }

  // ---- event rules ----

  void fireEvent(Slot& slot, std::int64_t timeUs, std::string text, std::string evidence) {
    Alert a = base(slot, State::kFiring, timeUs, timeUs);
    a.text = std::move(text);
    a.evidence = clipUtf8(std::move(evidence), kMaxEvidenceBytes);
    emit(slot, std::move(a), outbox);
  }

  void onStalled(const JobEvent& e) {
    // The agent's event says "stalled: <diagnosis>"; the alert's text says "stalled" already.
    std::string_view diagnosis = e.message;
    if (diagnosis.starts_with("stalled: ")) diagnosis.remove_prefix(9);
    // Each node's agent reports the stall as its own ranks show it: the node whose rank is behind
    // names it, the others only their ranks waiting. One stall at a time, about the rank behind.
    if (stall) {
      if (!stall->fired && !stall->rank && e.rank) {
        stall->rank = e.rank;
        stall->diagnosis = std::string(diagnosis);
        for (const auto& ev : stall->evidence) {
          if (ev.rank == stall->rank) return fireStall(ev.timeUnixUs);
        }
      }
      return;
    }
    stall = Stall{e.rank, e.timeUnixUs, std::string(diagnosis), {}, false};
    for (auto& slot : slots) {
      if (slot.rule.kpi != "stalled") continue;
      Alert a = base(slot, State::kPending, e.timeUnixUs, e.timeUnixUs);
      if (e.rank) a.ranks = {*e.rank};
      a.text = stallText("is pending");
      a.evidence = clipUtf8(e.message, kMaxEvidenceBytes);
      emit(slot, std::move(a), outbox);
    }
  }

  std::string stallText(std::string_view state) const {
    std::string text = "job " + jobId + ": stalled " + std::string(state);
    if (stall->rank) text += ": rank " + std::to_string(*stall->rank) + " is behind";
    const std::string diagnosis = firstLine(stall->diagnosis);
    if (!diagnosis.empty()) text += (stall->rank ? "; " : ": ") + diagnosis;
    return text;
  }

  void onEvidence(const JobEvent& e) {
    if (!stall || !e.rank) return;
    stall->evidence.push_back(e);
    if (stall->rank && *e.rank == *stall->rank) fireStall(e.timeUnixUs);
  }

  // The stall's alert with the diagnosis and each rank's state and stacks, stalled rank first.
  void fireStall(std::int64_t nowUs) {
    if (stall->fired) return;
    stall->fired = true;
    std::string evidence = stall->diagnosis;
    // What it is about: the rank behind, not those that wait for it (every rank's evidence comes).
    std::vector<std::uint32_t> ranks;
    if (stall->rank) ranks.push_back(*stall->rank);
    auto stacks = stall->evidence;  // the rank behind first: clipping keeps its stacks
    std::stable_partition(stacks.begin(), stacks.end(), [&](const JobEvent& e) { return e.rank == stall->rank; });
    for (const auto& e : stacks) {
      if (!stall->rank && std::find(ranks.begin(), ranks.end(), *e.rank) == ranks.end()) ranks.push_back(*e.rank);
      evidence += "\n\nrank " + std::to_string(*e.rank) + ": " + e.message;
      if (!e.logTail.empty()) evidence += "\n" + e.logTail;
    }
    for (auto& slot : slots) {
      if (slot.rule.kpi != "stalled" || slot.phase != Phase::kPending) continue;
      Alert a = base(slot, State::kFiring, stall->startUs, nowUs);
      a.ranks = ranks;
      for (const auto rank : ranks) {
        const auto node = rankNodes.find(rank);
        if (node != rankNodes.end()) addNode(a.nodes, node->second);
      }
      a.evidence = clipUtf8(evidence, kMaxEvidenceBytes);
      a.text = stallText("is firing");
      emit(slot, std::move(a), outbox);
    }
  }

  // Progress moved again: a firing stall resolves; one still waiting for its evidence was never
  // notified, and goes back to inactive without a word.
  void onStallEnded(const JobEvent& e) {
    if (!stall) return;
    for (auto& slot : slots) {
      if (slot.rule.kpi != "stalled") continue;
      if (slot.phase == Phase::kFiring) resolve(slot, {}, e.timeUnixUs, "progress moved again", outbox);
      slot.phase = Phase::kInactive;
    }
    stall.reset();
  }

  void fireNamed(std::string_view kpiName, std::int64_t timeUs, const std::string& text, const std::string& evidence) {
    for (auto& slot : slots) {
      if (slot.rule.kpi == kpiName) fireEvent(slot, timeUs, text, evidence);
    }
  }

  // Once the job ended nothing is measured any more: alerts on its KPIs and its stall resolve.
  void endWatching(std::int64_t nowUs) {
    for (auto& slot : slots) {
      const bool measured = slot.unit != Unit::kEvent || slot.rule.kpi == "stalled";
      if (!measured) continue;
      if (slot.phase == Phase::kFiring) resolve(slot, {}, nowUs, "the job ended", outbox);
      slot.phase = Phase::kInactive;
    }
    stall.reset();
  }
};

AlertBook::AlertBook(std::string jobId, std::vector<Rule> rules, Options options)
    : impl_(std::make_unique<Impl>(std::move(jobId), std::move(rules), options)) {}

AlertBook::~AlertBook() = default;

void AlertBook::onEvent(const JobEvent& event) {
  if (impl_->ended) return;
  switch (event.kind) {
    case JobEventKind::kStalled:
      return impl_->onStalled(event);
    case JobEventKind::kRankEvidence:
      return impl_->onEvidence(event);
    case JobEventKind::kStallEnded:
      return impl_->onStallEnded(event);
    default:
      return;
  }
}

void AlertBook::onEnded(JobState state, const std::string& message, std::int64_t nowUs) {
  if (impl_->ended || !jobStateEnded(state)) return;
  impl_->endWatching(nowUs);
  impl_->ended = true;
  const std::string& job = impl_->jobId;
  const std::string line = firstLine(message);
  if (state == JobState::kFailed) {
    impl_->fireNamed("failed", nowUs, "job " + job + " failed" + (line.empty() ? "" : ": " + line), message);
  } else if (state == JobState::kFinished) {
    impl_->fireNamed("finished", nowUs, "job " + job + " finished" + (line.empty() ? "" : ": " + line), message);
  }
}

void AlertBook::onRestarted(const std::string& why, std::int64_t nowUs) {
  // A restart after an end (the supervisor restarting a failed job) watches the job again.
  impl_->ended = false;
  const std::string line = firstLine(why);
  impl_->fireNamed("restarted", nowUs, "job " + impl_->jobId + " restarted" + (line.empty() ? "" : ": " + line), why);
}

std::vector<Alert> AlertBook::evaluate(const kpi::JobKpis& kpis, const NodeFacts& facts, std::int64_t nowUs) {
  Impl& m = *impl_;
  std::vector<Alert> out = std::move(m.outbox);
  m.outbox.clear();
  if (m.ended) return out;
  for (const auto& rank : kpis.ranks) {
    if (!rank.node.empty()) m.rankNodes[rank.rank] = rank.node;
  }
  if (m.stall && m.stall->startUs + m.options.evidenceWaitUs <= nowUs) {
    m.fireStall(nowUs);
    out.insert(out.end(), m.outbox.begin(), m.outbox.end());
    m.outbox.clear();
  }
  m.noteThroughput(kpis, nowUs);
  for (auto& slot : m.slots) {
    if (slot.unit == Unit::kEvent) continue;
    m.step(slot, m.read(slot, kpis, facts), nowUs, out);
  }
  return out;
}

std::vector<Alert> AlertBook::active() const {
  std::vector<Alert> out;
  for (const auto& slot : impl_->slots) {
    if (slot.phase != Impl::Phase::kInactive) out.push_back(slot.current);
  }
  return out;
}

const std::vector<Rule>& AlertBook::rules() const { return impl_->rules; }

}  // namespace lockstep::alerts
