// lockstepctl watch: a job's ranks, live.

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ctl.h"
#include "ctl_flags.h"
#include "lockstep/alerts/alert.h"
#include "lockstep/common/clock.h"
#include "lockstep/client/frames.h"
#include "lockstep/kpi/frame.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/stream.h"
#include "lockstep/present/present.h"
#include "lockstep/protocol/names.h"

namespace lockstep::ctl {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The job's events as watch shows them: one line each, and the alerts firing now, by rule
// (docs/alerts.md).
class EventLog {
 public:
  void add(const std::string& node, const JobEvent& e) {
    lines_.push_back(timeText(e.timeUnixUs) + " " + node + ": " + e.message);
    if (auto alert = alerts::alertOf(e); alert && !alerts::isInstant(alert->kpi)) {
      if (alert->state == alerts::State::kFiring) firing_[alert->rule] = std::move(*alert);
      else firing_.erase(alert->rule);
    }
  }
  const std::vector<std::string>& lines() const { return lines_; }
  const std::map<std::string, alerts::Alert>& firing() const { return firing_; }

 private:
  std::vector<std::string> lines_;
  std::map<std::string, alerts::Alert> firing_;
};

// What watch keeps of the job, read from its agents' streams by the one stream reader
// (kpi/stream.h): the KPI engine's view of the job (the dashboard's figures), its recent events,
// and its nodes' own figures (their network).
class WatchState : public RecordSink {
 public:
  WatchState(const JobSpec& spec, const std::string& historyPath)
      : tracker_(spec, history::liveTrackerSettings(historyPath, spec)),
        reader_([this](const std::string& jobId) -> RecordSink* { return jobId == tracker_.spec().jobId ? this : nullptr; },
                kpi::kNewestOnly) {}

  void read(const std::vector<StreamMessage>& messages) { reader_.read(messages); }

  void onEvent(const std::string& node, const JobEvent& e) override {
    tracker_.onEvent(node, e);
    events_.add(node, e);
  }
  void onStep(const std::string& node, const StepReport& r) override { tracker_.onStep(node, r); }
  void onProcess(const std::string& node, const ProcessSample& p) override { tracker_.onProcess(node, p); }
  void onGpu(const std::string& node, const GpuSample& g) override { tracker_.onGpu(node, g); }

  const kpi::JobTracker& tracker() const { return tracker_; }
  const EventLog& events() const { return events_; }
  const kpi::StreamReader& reader() const { return reader_; }

 private:
  kpi::JobTracker tracker_;
  EventLog events_;
  kpi::StreamReader reader_;
};

// What one drawing shows: the job's KPIs, its events, and its nodes' network where watch reads
// their streams (none through --fan-in).
struct View {
  const kpi::JobKpis& k;
  const EventLog& events;
  const kpi::StreamReader* reader = nullptr;
};

// The utilization of the GPU a rank was placed on, as the KPI engine last saw it.
kpi::Maybe gpuOf(const kpi::JobKpis& k, const JobSpec& spec, const kpi::RankKpis& r) {
  for (const auto& p : spec.ranks) {
    if (p.rank != r.rank || !p.gpuIndex) continue;
    for (const auto& g : k.gpus) {
      if (g.node == r.node && g.index == *p.gpuIndex) return g.utilizationPct;
    }
  }
  return std::nullopt;
}

// Each node's interfaces, busiest first: what the job's traffic (and anything else on the node) does.
Json nodesJson(const kpi::StreamReader& reader) {
  Json out = Json::array();
  for (const auto& [name, node] : reader.nodes()) {
    Json interfaces = Json::array();
    for (const auto& r : node.snapshot().interfaces) {
      interfaces.push_back({{"interface", r.interface},
                            {"rx_bytes_per_s", r.rxBytesPerSecond},
                            {"tx_bytes_per_s", r.txBytesPerSecond},
                            {"link_bits_per_s", r.linkBitsPerSecond ? Json(*r.linkBitsPerSecond) : Json(nullptr)},
                            {"link_use", r.linkUse ? Json(*r.linkUse) : Json(nullptr)},
                            {"new_errors", r.newErrors}});
    }
    out.push_back({{"node", name}, {"interfaces", interfaces}});
  }
  return out;
}

// "node a: eth0 ↓1.20 Gb/s ↑800 Mb/s of 25 Gb/s (4.8%)", the busiest interface of each node; at
// most kNodeLines nodes (the busiest, in natural order), the rest counted (--json has them all).
constexpr std::size_t kNodeLines = 8;
std::string nodesText(const kpi::StreamReader& reader) {
  std::vector<std::pair<std::string, std::vector<kpi::NetRate>>> nodes;
  for (const auto& [name, node] : reader.nodes()) {
    auto interfaces = node.snapshot().interfaces;
    if (!interfaces.empty()) nodes.emplace_back(name, std::move(interfaces));
  }
  const std::size_t all = nodes.size();
  if (all > kNodeLines) {
    std::stable_sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) {
      return kpi::busiest(a.second.front()) > kpi::busiest(b.second.front());
    });
    nodes.resize(kNodeLines);
    std::stable_sort(nodes.begin(), nodes.end(), [](const auto& a, const auto& b) { return naturalLess(a.first, b.first); });
  }
  std::string out;
  for (const auto& [name, interfaces] : nodes) {
    out += "node " + name + ": " + present::networkRate(interfaces.front());
    if (interfaces.size() > 1) out += " (+" + std::to_string(interfaces.size() - 1) + " more)";
    out += "\n";
  }
  if (all > nodes.size()) out += "(+" + std::to_string(all - nodes.size()) + " quieter nodes: --json lists them all)\n";
  return out;
}

// Each kind of collective over the window (docs/kpis.md), in kCollectiveKindNames' order.
Json collectivesJson(const std::vector<kpi::CollectiveKpis>& kinds) {
  Json out = Json::array();
  for (const auto& c : kinds) {
    out.push_back({{"kind", std::string(nameOf(c.kind))},
                   {"per_step", jsonFigure(c.perStep)},
                   {"time_share", jsonFigure(c.timeShare)},
                   {"exposed_share", jsonFigure(c.exposedShare)},
                   {"bytes_per_step", jsonFigure(c.bytesPerStep)},
                   {"bus_bandwidth_bytes_per_s", jsonFigure(c.busBandwidth)}});
  }
  return out;
}

// The communication figure and what it is made of: "31.0% (bus 9.5 GB/s; all-gather 25.0% ·
// reduce-scatter 6.0%)"; the split only where a kind other than all-reduce shares it.
std::string communicationText(const kpi::JobKpis& k) {
  std::string text = present::percent(k.commOverhead) + " (bus " + present::bandwidth(k.busBandwidth);
  const bool others = std::any_of(k.collectives.begin(), k.collectives.end(),
                                  [](const kpi::CollectiveKpis& c) { return c.kind != CollectiveKind::kAllReduce; });
  const std::string split = others ? present::collectiveSplit(k.collectives) : "";
  return text + (split.empty() ? "" : "; " + split) + ")";
}

// A figure's words, null where nothing was said.
Json textOrNull(const std::string& text) { return text.empty() ? Json(nullptr) : Json(text); }

// Model FLOPs utilization (docs/kpis.md, MFU), a job's or a rank's: null where unknown.
template <class Kpis>
void addFlops(Json& out, const Kpis& k) {
  out["model_flops_utilization"] = jsonFigure(k.mfu);
  out["model_flops_per_second"] = jsonFigure(k.modelFlopsPerSecond);
  out["peak_flops"] = jsonFigure(k.peakFlops);
}

Json renderWatch(const View& v, const JobSpec& spec, JobState state, bool json, bool tty, const std::optional<Stall>& stall,
                 const Supervision& supervision = {}) {
  const bool ended = jobStateEnded(state);
  const kpi::JobKpis& k = v.k;
  Json ranks = Json::array();
  std::string table;
  char line[400];
  std::snprintf(line, sizeof line, "%-5s %-14s %8s %6s %10s %11s %8s %11s %6s %9s %6s %6s\n", "RANK", "NODE", "STEP",
                "EPOCH", "LOSS", "SAMPLES/S", "COMM", "BUS BW", "CPU", "RSS", "GPU", "MFU");
  table += line;
  for (const auto& r : k.ranks) {
    const kpi::Maybe gpu = gpuOf(k, spec, r);
    ranks.push_back({{"rank", r.rank},
                     {"node", r.node},
                     {"step", r.step},
                     {"epoch", r.epoch},
                     {"loss", jsonFigure(r.loss)},
                     {"samples_per_s", jsonFigure(r.samplesPerSecond)},
                     {"comm_overhead_pct", jsonFigure(r.commOverhead, 100)},
                     {"alg_bandwidth_bytes_per_s", jsonFigure(r.algBandwidth)},
                     {"bus_bandwidth_bytes_per_s", jsonFigure(r.busBandwidth)},
                     {"cpu_pct", jsonFigure(r.cpuPct)},
                     {"rss_bytes", jsonFigure(r.rssBytes)},
                     {"gpu_util_pct", jsonFigure(gpu)}});
    addFlops(ranks.back(), r);
    std::snprintf(line, sizeof line, "%-5u %-14s %8llu %6u %s %s %s %s %s %s %s %s\n", r.rank, r.node.c_str(),
                  static_cast<unsigned long long>(r.step), r.epoch, column(present::figure(r.loss, 4), 10).c_str(),
                  column(present::figure(r.samplesPerSecond, 0), 11).c_str(),
                  column(present::percent(r.commOverhead, 1), 8).c_str(), column(present::bandwidth(r.busBandwidth), 11).c_str(),
                  column(present::figure(r.cpuPct, 0, "%"), 6).c_str(),
                  column(r.rssBytes ? present::bytes(*r.rssBytes) : std::string(present::kUnknown), 9).c_str(),
                  column(present::figure(gpu, 0, "%"), 6).c_str(), column(present::percent(r.mfu, 0), 6).c_str());
    table += line;
  }
  Json nodes = v.reader ? nodesJson(*v.reader) : Json::array();
  const std::string nodeLines = v.reader ? nodesText(*v.reader) : "";
  const std::string stateName(jobStateWord(supervision, state));
  const kpi::Maybe throughput = present::jobThroughput(k, ended);
  Json snapshot = {{"job_id", spec.jobId},
                   {"state", std::string(jobStateName(state))},
                   {"restarting", restarting(supervision)},
                   {"samples_per_s", jsonFigure(throughput)},
                   {"comm_overhead", jsonFigure(k.commOverhead)},
                   {"alg_bandwidth_bytes_per_s", jsonFigure(k.algBandwidth)},
                   {"bus_bandwidth_bytes_per_s", jsonFigure(k.busBandwidth)},
                   {"collectives", collectivesJson(k.collectives)},
                   {"scaling_efficiency", jsonFigure(k.scalingEfficiency)},
                   {"load_imbalance", jsonFigure(k.loadImbalance)},
                   {"slowest_rank", k.slowestRank ? Json(*k.slowestRank) : Json(nullptr)},
                   {"param_bytes_per_rank", jsonFigure(k.paramBytesPerRank)},
                   {"grad_bytes_per_rank", jsonFigure(k.gradBytesPerRank)},
                   {"optimizer_state_bytes_per_rank", jsonFigure(k.optimizerStateBytesPerRank)},
                   {"staleness_mean", jsonFigure(k.stalenessMean)},
                   {"staleness_p99", jsonFigure(k.stalenessP99)}};
  addFlops(snapshot, k);
  snapshot["flops_basis"] = textOrNull(k.flopsBasis);
  snapshot["peak_basis"] = textOrNull(k.peakBasis);
  snapshot["ranks"] = ranks;
  snapshot["nodes"] = nodes;
  Json firing = Json::array();
  for (const auto& [rule, alert] : v.events.firing()) firing.push_back(Json::parse(alerts::alertJson(alert)));
  snapshot["alerts"] = firing;
  if (stall) snapshot["stall"] = Json{{"since_unix_us", stall->sinceUnixUs}, {"message", stall->message}, {"ranks", stall->ranks}};
  if (json) {
    std::printf("%s\n", snapshot.dump().c_str());
  } else {
    if (tty) std::printf("\033[H\033[J");
    std::printf("job %s: %s, %s samples/s (%s); communication %s, scaling %s, imbalance %s\n%s",
                spec.jobId.c_str(), stateName.c_str(), present::figure(throughput, 0).c_str(),
                std::string(present::jobThroughputMeaning(ended)).c_str(), communicationText(k).c_str(),
                present::percent(k.scalingEfficiency, 0).c_str(), present::figure(k.loadImbalance, 2, "×").c_str(),
                table.c_str());
    if (k.ranks.size() < k.worldSize) std::printf("(%zu of the job's %u ranks shown)\n", k.ranks.size(), k.worldSize);
    if (const std::string state = present::modelStateText(k); !state.empty()) std::printf("holds: %s\n", state.c_str());
    if (const std::string mfu = present::mfuText(k); !mfu.empty()) {
      const std::string basis = present::mfuBasisText(k);
      std::printf("MFU: %s%s\n", mfu.c_str(), basis.empty() ? "" : (" (" + basis + ")").c_str());
    }
    if (stall) std::printf("%s\n", stallText(*stall).c_str());
    for (const auto& [rule, alert] : v.events.firing()) std::printf("ALERT %s\n", alert.text.c_str());
    std::printf("%s", nodeLines.c_str());
    const auto& events = v.events.lines();
    const std::size_t shown = std::min<std::size_t>(events.size(), 5);
    for (std::size_t i = events.size() - shown; i < events.size(); ++i) std::printf("  %s\n", events[i].c_str());
    if (!tty) std::printf("\n");
  }
  std::fflush(stdout);
  return snapshot;
}

// The rows --fan-in asks for unless --ranks says which: the first ranks (the job's figures, its
// slowest ranks and its collectives cover them all).
constexpr std::uint32_t kFannedInRows = 64;

// --ranks FROM-TO: the ranks whose rows a frame brings, at most kMaxFrameRanks of them.
Result<std::pair<std::uint32_t, std::uint32_t>> rowsOf(const std::string& text) {
  const auto dash = text.find('-');
  const Error bad{ErrorCode::kInvalidArgument, "--ranks: '" + text + "' is not FROM-TO, such as 0-63 (at most " +
                                                   std::to_string(kMaxFrameRanks) + " ranks)"};
  if (dash == std::string::npos) return bad;
  auto from = parseWhole("--ranks", text.substr(0, dash), 0, 0xFFFFFFFEu);
  auto to = parseWhole("--ranks", text.substr(dash + 1), 0, 0xFFFFFFFEu);
  if (!from || !to || *to < *from || *to - *from >= kMaxFrameRanks) return bad;
  return std::pair{*from, *to - *from + 1};
}

// Sleeps `d`, or less when interrupted.
void nap(Clock::duration d) {
  for (const auto until = Clock::now() + d; Clock::now() < until && g_interrupted.load() == 0;) {
    std::this_thread::sleep_for(milliseconds(50));
  }
}

// The job's frame, and the agent that answered it: the one supervising the job, its first agent or
// its second once that took over (the only two that may). One that answers UNAVAILABLE (it begins
// to read the job's streams, or stands by to take over) is asked again for up to kUnavailableWait
// from its first such answer: longer than a takeover (3 missed polls of 5 s) and a catch-up.
constexpr auto kUnavailableWait = std::chrono::seconds(60);
Result<std::pair<AgentClient*, FrameReply>> supervisingFrame(const std::vector<Part>& parts, const FrameRequest& ask,
                                                             std::chrono::milliseconds timeout) {
  const auto& agents = parts.front().status.spec.agents;
  std::vector<AgentClient*> mayAnswer;
  for (std::size_t i = 0; i < std::min<std::size_t>(agents.size(), 2); ++i) {
    for (const auto& p : parts) {
      if (p.agent->hello().nodeName == agents[i].node) mayAnswer.push_back(p.agent);
    }
  }
  if (mayAnswer.empty()) {
    return Error{ErrorCode::kNotFound, "neither of job " + ask.jobId + "'s first two agents answered: watch it without --fan-in"};
  }
  std::optional<Clock::time_point> until;
  std::optional<Error> why;  // the first agent's, else the second's
  while (g_interrupted.load() == 0) {
    bool unavailable = false;
    why.reset();
    for (AgentClient* agent : mayAnswer) {
      if (g_interrupted.load() != 0) break;
      auto frame = agent->frame(ask, timeout);
      if (frame) return std::pair{agent, std::move(*frame)};
      unavailable = unavailable || frame.error().code == ErrorCode::kUnavailable;
      if (!why) why = frame.error();
    }
    if (!unavailable) break;
    if (!until) until = Clock::now() + kUnavailableWait;
    if (Clock::now() >= *until) break;
    nap(milliseconds(300));
  }
  const Error e = why.value_or(Error{ErrorCode::kCancelled, "interrupted"});
  return e.withContext("job " + ask.jobId + "'s supervising agent gave no frame; watch it without --fan-in");
}

// --fan-in: once a second, the job's KPIs as its supervising agent computed them from every one of
// its agents' streams, over that one connection (docs/fan-in.md), instead of every agent's stream.
// When the supervising agent stops answering, the frame is looked for among the job's agents
// again (its standby takes over) and the events are read anew from the first: another agent
// numbers them its own way.
int watchFannedIn(const Globals& g, const std::vector<Part>& parts, std::pair<std::uint32_t, std::uint32_t> rows, bool tty) {
  const JobSpec& spec = parts.front().status.spec;
  FrameRequest ask{spec.jobId, rows.first, rows.second, 0};
  AgentClient* supervising = nullptr;
  Result<FrameReply> frame = Error{ErrorCode::kUnavailable, "not asked yet"};
  EventLog events;
  FrameCursor cursor;
  while (g_interrupted.load() == 0) {
    if (!frame) {
      events = EventLog{};
      cursor = {};
      ask.eventsAfter = 0;
      auto found = supervisingFrame(parts, ask, g.timeout);
      if (!found) return g_interrupted.load() != 0 ? kOk : fail(found.error());
      supervising = found->first;
      frame = std::move(found->second);
    }
    if (!cursor.take(*frame)) {  // the agent numbers its events anew (it started again)
      frame = Error{ErrorCode::kUnavailable, "numbered anew"};
      continue;
    }
    for (const auto& e : frame->events) events.add(e.node, std::get<JobEvent>(e.payload));
    ask.eventsAfter = cursor.eventsAfter;
    if (frame->events.empty() || cursor.complete(*frame)) {  // else more than one frame holds
      auto k = kpi::decodeFrame(frame->kpis);
      if (!k) return fail(k.error().withContext("job " + spec.jobId + "'s frame from its supervising agent"));
      renderWatch(View{*k, events}, spec, frame->state, g.json, tty, frame->stall);
      if (frame->ended) return exitForState(frame->state);
      nap(std::chrono::seconds(1));
    }
    frame = supervising->frame(ask, g.timeout);
  }
  return kOk;
}

}  // namespace

int cmdWatch(const Globals& g, const std::vector<std::string>& argv) {
  std::vector<std::string> args;
  bool fanIn = false;
  std::string ranks;
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl watch JOB [--fan-in [--ranks FROM-TO]]")
                           .on("--fan-in", &fanIn)
                           .text("--ranks", &ranks)
                           .arguments(&args, 1)
                           .parse(argv));
  std::pair<std::uint32_t, std::uint32_t> rows{0, kFannedInRows};
  if (!ranks.empty()) {
    if (!fanIn) return fail(Error{ErrorCode::kInvalidArgument, "--ranks chooses the rows of --fan-in: give both"});
    auto chosen = rowsOf(ranks);
    if (!chosen) return fail(chosen.error());
    rows = *chosen;
  }
  const std::string jobId = args[0];
  auto agents = connectAgentsFor(g, jobId);
  if (!agents) return fail(agents.error());
  auto parts = findJob(*agents, jobId, g.timeout);
  if (!parts) return fail(parts.error());
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  if (fanIn) return watchFannedIn(g, *parts, rows, tty);
  WatchState w(parts->front().status.spec, g.historyPath);
  Recorder recorder(g);
  // Recording: everything the agents still hold of the job. Else their last few thousand
  // messages, so that a running job shows its recent past at once.
  std::map<AgentClient*, std::uint64_t> lastSeq;
  for (const auto& p : *parts) {
    recorder.part(p.agent->hello(), p.status);
    recorder.clock(*p.agent);
    const std::uint64_t last = p.agent->hello().lastSeq;
    lastSeq[p.agent] = !g.historyPath.empty() || last < 20000 ? 0 : last - 20000;
  }
  auto nextRender = Clock::now();
  while (g_interrupted.load() == 0) {
    for (auto& [agent, seq] : lastSeq) {
      auto batch = agent->fetch(seq, 5000, 200, g.timeout);
      if (!batch && g_interrupted.load() != 0) return kOk;  // Ctrl-C during the long poll
      if (!batch) return fail(batch.error());
      w.read(batch->messages);
      recorder.messages(batch->messages);
      if (!batch->messages.empty()) seq = batch->messages.back().seq;
    }
    if (Clock::now() < nextRender) continue;
    nextRender = Clock::now() + std::chrono::seconds(1);
    auto now = findJob(*agents, jobId, g.timeout);
    if (!now) return fail(now.error());
    for (const auto& p : *now) {
      recorder.part(p.agent->hello(), p.status);
      recorder.clock(*p.agent);
    }
    const JobState state = overall(*now);
    const kpi::JobKpis k = w.tracker().snapshot(jobStateEnded(state) ? w.tracker().lastReportUnixUs() : unixMicrosNow());
    renderWatch(View{k, w.events(), &w.reader()}, parts->front().status.spec, state, g.json, tty, stallOf(*now),
                supervisionOf(*now));
    // Parts that all ended under a supervision that goes on are a job about to restart, or to be judged.
    if (jobOver(*now)) {
      drain(lastSeq, recorder, g.timeout);
      recorder.finish();
      if (!g.json) printJob(g, jobId, *now);
      return exitForState(state);
    }
  }
  return kOk;
}

}  // namespace lockstep::ctl
