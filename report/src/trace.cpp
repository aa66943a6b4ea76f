// The trace export (trace.h): Chrome trace event JSON, streamed to a temporary file (gzip when
// the name ends in .gz) and renamed into place once whole.

#include "lockstep/report/trace.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "lockstep/alerts/alert.h"
#include "lockstep/protocol/names.h"

namespace lockstep::report {
namespace {

using Json = nlohmann::json;

constexpr int kStepThread = 1;
constexpr int kPhaseThread = 2;  // the phases a program named: tracks of their own, from this one on
// A rank's collectives: tracks of their own from this one on (far past the phases' few), since
// they overlap its steps' boxes (and may overlap each other: another stream's).
constexpr int kCollectiveThread = 1000;
constexpr std::uint32_t kFirstGpuProcess = 1'000'000;  // ranks' processes count from 1

// Names come from agents and programs: bytes that are not UTF-8 become U+FFFD, never an exception.
std::string text(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

struct NodeEvent {
  std::string node;
  JobEvent event;
};

// The job's records in range: its steps into `timeline`, its GPUs' samples into `gpus`, its events
// into `events`.
Result<void> collect(const history::History& history, const history::JobRecord& job, const TimeRange& range,
                     kpi::Timeline& timeline, std::vector<std::pair<std::string, GpuSample>>* gpus,
                     std::vector<NodeEvent>* events = nullptr) {
  LOCKSTEP_ASSIGN_OR_RETURN(const auto clocks, history.clocks(job));
  for (const auto& [node, clock] : clocks) timeline.setClock(node, clock);
  return history.replay(
      job.spec.jobId,
      [&](const StreamMessage& m) {
        const std::int64_t offset = timeline.offsetOf(m.node);
        if (const auto* step = std::get_if<StepReport>(&m.payload)) {
          if (range.overlaps(step->timeUnixUs - step->stepTimeUs - offset, step->timeUnixUs - offset)) timeline.add(*step, m.node);
        } else if (const auto* phase = std::get_if<PhaseReport>(&m.payload)) {
          if (range.overlaps(phase->startUs() - offset, phase->timeUnixUs - offset)) timeline.add(*phase, m.node);
        } else if (const auto* gpu = std::get_if<GpuSample>(&m.payload); gpu && gpus != nullptr) {
          if (range.overlaps(gpu->timeUnixUs - offset, gpu->timeUnixUs - offset)) gpus->emplace_back(m.node, *gpu);
        } else if (const auto* event = std::get_if<JobEvent>(&m.payload); event && events != nullptr) {
          if (range.overlaps(event->timeUnixUs - offset, event->timeUnixUs - offset)) events->push_back({m.node, *event});
        }
      },
      false);
}

// Where the JSON goes: a temporary file beside the target, compressed or not.
class Sink {
 public:
  static Result<Sink> open(const std::string& path) {
    Sink s;
    s.path_ = path;
    s.temp_ = path + ".part";
    if (path.ends_with(".gz")) {
      s.gz_ = gzopen(s.temp_.c_str(), "wb6");
      if (s.gz_ == nullptr) return errnoError("cannot write " + s.temp_, errno);
    } else if ((s.file_ = std::fopen(s.temp_.c_str(), "wb")) == nullptr) {
      return errnoError("cannot write " + s.temp_, errno);
    }
    return s;
  }
  Sink() = default;
  Sink(Sink&& o) noexcept { *this = std::move(o); }
  Sink& operator=(Sink&& o) noexcept {
    std::swap(path_, o.path_), std::swap(temp_, o.temp_), std::swap(gz_, o.gz_), std::swap(file_, o.file_);
    std::swap(failed_, o.failed_);
    return *this;
  }
  ~Sink() {
    if (gz_ != nullptr || file_ != nullptr) {
      close();
      std::remove(temp_.c_str());  // not finished: nothing is left
    }
  }

  void write(std::string_view text) {
    if (gz_ != nullptr) {
      failed_ = failed_ || gzwrite(gz_, text.data(), static_cast<unsigned>(text.size())) != static_cast<int>(text.size());
    } else {
      failed_ = failed_ || std::fwrite(text.data(), 1, text.size(), file_) != text.size();
    }
  }
  Result<void> finish() {
    const bool closed = close();
    if (failed_ || !closed || std::rename(temp_.c_str(), path_.c_str()) != 0) {
      std::remove(temp_.c_str());
      return Error{ErrorCode::kIo, "cannot write " + path_ + " (is the disk full?)"};
    }
    return {};
  }

 private:
  bool close() {
    bool ok = true;
    if (gz_ != nullptr) ok = gzclose(gz_) == Z_OK;
    if (file_ != nullptr) ok = std::fclose(file_) == 0;
    gz_ = nullptr;
    file_ = nullptr;
    return ok;
  }
  std::string path_, temp_;
  gzFile gz_ = nullptr;
  std::FILE* file_ = nullptr;
  bool failed_ = false;
};

class TraceWriter {
 public:
  TraceWriter(Sink& sink, std::int64_t baseUs) : sink_(sink), baseUs_(baseUs) {}

  void metadata(std::uint32_t pid, const char* what, const Json& args, std::optional<int> tid = std::nullopt) {
    Json e = {{"ph", "M"}, {"pid", pid}, {"name", what}, {"args", args}};
    if (tid) e["tid"] = *tid;
    event(e);
  }
  void complete(std::uint32_t pid, int tid, std::string_view name, std::int64_t startUs, std::int64_t durationUs, const Json& args) {
    const char* cat = tid == kStepThread ? "step" : tid >= kCollectiveThread ? "collective" : "phase";
    event({{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"cat", cat}, {"name", name}, {"ts", startUs - baseUs_}, {"dur", durationUs},
           {"args", args}});
  }
  // An instant event: on a process ("p") or across the whole trace ("g").
  void instant(std::optional<std::uint32_t> pid, std::string_view name, std::int64_t atUs, const Json& args,
               std::string_view cat = {}) {
    Json e = {{"ph", "i"}, {"s", pid ? "p" : "g"}, {"pid", pid.value_or(0)}, {"tid", kStepThread}, {"name", name},
              {"ts", atUs - baseUs_}, {"args", args}};
    if (!cat.empty()) e["cat"] = cat;
    event(e);
  }
  void counter(std::uint32_t pid, const std::string& name, std::int64_t atUs, double value) {
    event({{"ph", "C"}, {"pid", pid}, {"name", name}, {"ts", atUs - baseUs_}, {"args", {{"value", value}}}});
  }
  std::size_t events() const { return events_; }

 private:
  void event(const Json& e) {
    sink_.write(events_++ == 0 ? "\n" : ",\n");
    sink_.write(text(e));
  }
  Sink& sink_;
  std::int64_t baseUs_;
  std::size_t events_ = 0;
};

// The measured clocks, as otherData.clock_offsets (TraceSummary::clocksJson).
Json clocksOf(const TraceSummary& summary) {
  Json out = Json::object();
  for (const auto& [node, c] : summary.clocks) out[node] = {{"offset_us", c.offsetUs}, {"uncertainty_us", c.uncertaintyUs}};
  return out;
}

// Each box's track (0 on), as Perfetto stacks a thread's boxes: nested ones share one; one that
// overlaps another without nesting (another thread's or stream's) takes the next. As (box, track),
// by start, an outer box before the ones it holds: the order to write them in.
std::vector<std::pair<std::size_t, int>> tracksOf(const std::vector<kpi::Box>& boxes) {
  const auto endOf = [](const kpi::Box& b) { return b.startUs + b.durationUs; };
  std::vector<std::size_t> order(boxes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = boxes[a];
    const auto& y = boxes[b];
    return x.startUs != y.startUs ? x.startUs < y.startUs : endOf(x) > endOf(y);  // outer first
  });
  std::vector<std::vector<std::int64_t>> open;  // per track, the ends of its boxes still open, innermost last
  std::vector<std::pair<std::size_t, int>> tracks;
  for (const std::size_t i : order) {
    const auto& box = boxes[i];
    std::size_t t = 0;
    for (; t < open.size(); ++t) {
      auto& ends = open[t];
      while (!ends.empty() && ends.back() <= box.startUs) ends.pop_back();
      if (ends.empty() || ends.back() >= endOf(box)) break;
    }
    if (t == open.size()) open.emplace_back();
    open[t].push_back(endOf(box));
    tracks.emplace_back(i, static_cast<int>(t));
  }
  return tracks;
}

// Names a lane's tracks from `first` on as it comes to them ("phases", "phases 2", ...).
class TrackNames {
 public:
  TrackNames(TraceWriter& out, std::uint32_t pid, int first, std::string name) : out_(out), pid_(pid), first_(first), name_(std::move(name)) {}
  int operator()(int track) {
    while (named_ < track) {  // tracks first come in order
      ++named_;
      out_.metadata(pid_, "thread_name", {{"name", named_ == 0 ? name_ : name_ + " " + std::to_string(named_ + 1)}}, first_ + named_);
    }
    return first_ + track;
  }

 private:
  TraceWriter& out_;
  std::uint32_t pid_;
  int first_;
  std::string name_;
  int named_ = -1;
};

void writePhases(TraceWriter& out, std::uint32_t pid, const kpi::Timeline::Lane& lane, std::int64_t offset) {
  std::vector<kpi::Box> boxes;
  for (const auto& phase : lane.phases) boxes.push_back(kpi::boxOf(phase, offset));
  TrackNames tid(out, pid, kPhaseThread, "phases");
  for (const auto& [i, track] : tracksOf(boxes)) {
    const auto& phase = lane.phases[i];
    out.complete(pid, tid(track), phase.name, boxes[i].startUs, boxes[i].durationUs,
                 {{"rank", lane.rank}, {"after_step", phase.step}, {"attempt", phase.attempt}});
  }
}

// Each collective of the lane's steps, named by its kind ("all_gather").
void writeCollectives(TraceWriter& out, std::uint32_t pid, const kpi::Timeline::Lane& lane, std::int64_t offset) {
  std::vector<kpi::CollectiveBox> collectives;
  std::vector<const kpi::TimelineStep*> stepOf;
  for (const auto& step : lane.steps) {
    for (const auto& c : kpi::collectiveBoxesOf(step, offset)) collectives.push_back(c), stepOf.push_back(&step);
  }
  std::vector<kpi::Box> boxes;
  for (const auto& c : collectives) boxes.push_back(c.box);
  TrackNames tid(out, pid, kCollectiveThread, "collectives");
  for (const auto& [i, track] : tracksOf(boxes)) {
    const auto& c = collectives[i];
    out.complete(pid, tid(track), nameOf(c.kind), c.box.startUs, c.box.durationUs,
                 {{"rank", lane.rank}, {"step", stepOf[i]->step}, {"attempt", stepOf[i]->attempt}, {"bytes", c.bytes},
                  {"exposed_us", c.exposedUs}});
  }
}

// A process per lane (a rank, or a rank that a restart moved: one per node it ran on), numbered
// and sorted in the lanes' order: by node, then rank. Returns each lane's process.
std::map<std::pair<std::string, std::uint32_t>, std::uint32_t> writeRanks(TraceWriter& out, const kpi::Timeline& timeline) {
  std::map<std::pair<std::string, std::uint32_t>, std::uint32_t> pids;
  std::uint32_t pid = 0;
  for (const auto* lane : timeline.lanes()) {
    pids[{lane->node, lane->rank}] = ++pid;
    out.metadata(pid, "process_name", {{"name", "rank " + std::to_string(lane->rank) + " (" + lane->node + ")"}});
    out.metadata(pid, "process_sort_index", {{"sort_index", pid}});
    out.metadata(pid, "thread_name", {{"name", "steps"}}, kStepThread);
    const std::int64_t offset = timeline.offsetOf(lane->node);
    for (const auto& step : lane->steps) {
      const Json args = {{"rank", lane->rank},  {"step", step.step},       {"attempt", step.attempt},
                         {"samples", step.samples}, {"step_us", step.stepUs}};
      for (const auto& box : kpi::boxesOf(step, offset)) {
        out.complete(pid, kStepThread, kpi::phaseName(box.phase), box.startUs, box.durationUs, args);
      }
      if (step.stepUs > 0) out.counter(pid, "samples/s", step.endUs - offset, step.samples * 1e6 / static_cast<double>(step.stepUs));
    }
    writePhases(out, pid, *lane, offset);
    writeCollectives(out, pid, *lane, offset);
  }
  return pids;
}

// An alert's change (docs/alerts.md) across the trace, named by its rule: the job's supervising
// agent raised it about the whole job, whatever ranks it names, on that agent's clock.
void writeAlert(TraceWriter& out, const alerts::Alert& a, std::int64_t atUs) {
  const Json json = Json::parse(alerts::alertJson(a), nullptr, false);  // its one JSON: NaN as "nan"
  Json args = {{"state", alerts::stateName(a.state)},
               {"value", json.is_object() ? json.value("value", Json()) : Json()},
               {"unit", a.unit},
               {"text", a.text}};
  if (!a.ranks.empty()) args["ranks"] = a.ranks;
  if (!a.nodes.empty()) args["nodes"] = a.nodes;
  if (!a.cause.empty()) args["cause"] = a.cause;
  out.instant(std::nullopt, a.rule, atUs, args, "alert");
}

// The job's events where they happened: a rank's on its lane (a stall's evidence carries its
// stacks in `log_tail`), the job's across the trace; an alert's change as the alert.
void writeEvents(TraceWriter& out, const kpi::Timeline& timeline,
                 const std::map<std::pair<std::string, std::uint32_t>, std::uint32_t>& pids, const std::vector<NodeEvent>& events) {
  for (const auto& [node, e] : events) {
    if (const auto alert = alerts::alertOf(e)) {
      writeAlert(out, *alert, e.timeUnixUs - timeline.offsetOf(node));
      continue;
    }
    std::optional<std::uint32_t> pid;
    if (e.rank) {
      if (const auto it = pids.find({node, *e.rank}); it != pids.end()) pid = it->second;
    }
    Json args = {{"message", e.message}};
    if (e.rank) args["rank"] = *e.rank;
    if (e.step) args["step"] = *e.step;
    if (e.exitCode) args["exit_code"] = *e.exitCode;
    if (e.signal) args["signal"] = *e.signal;
    if (!e.logTail.empty()) args["log_tail"] = e.logTail;
    out.instant(pid, jobEventKindName(e.kind), e.timeUnixUs - timeline.offsetOf(node), args);
  }
}

void writeGpus(TraceWriter& out, const kpi::Timeline& timeline, const std::vector<std::pair<std::string, GpuSample>>& gpus) {
  std::map<std::string, std::uint32_t, NaturalLess> pids;
  for (const auto& [node, sample] : gpus) pids.emplace(node, 0);
  std::uint32_t next = kFirstGpuProcess;
  for (auto& [node, pid] : pids) {
    pid = next++;
    out.metadata(pid, "process_name", {{"name", node + " GPUs"}});
    out.metadata(pid, "process_sort_index", {{"sort_index", pid}});
  }
  for (const auto& [node, s] : gpus) {
    if (s.utilizationPct) {
      out.counter(pids[node], "GPU " + std::to_string(s.gpuIndex) + " utilization %", s.timeUnixUs - timeline.offsetOf(node),
                  *s.utilizationPct);
    }
  }
}

}  // namespace

std::string TraceSummary::clocksJson() const { return text(clocksOf(*this)); }

Result<kpi::Timeline> loadTimeline(const history::History& history, const history::JobRecord& job, const TimeRange& range,
                                   std::size_t collectivesPerRank) {
  kpi::Timeline timeline(0, collectivesPerRank);
  LOCKSTEP_TRY(collect(history, job, range, timeline, nullptr));
  return timeline;
}

Result<TraceSummary> writeTrace(const history::History& history, const std::string& jobId, const TimeRange& range,
                                const std::string& path) {
  LOCKSTEP_ASSIGN_OR_RETURN(const auto job, history.job(jobId));
  kpi::Timeline timeline;
  std::vector<std::pair<std::string, GpuSample>> gpus;
  std::vector<NodeEvent> events;
  LOCKSTEP_TRY(collect(history, job, range, timeline, &gpus, &events));
  if (timeline.laneCount() == 0) {
    return invalidArgument("job " + jobId + " has no step" + (range.fromUnixUs || range.toUnixUs ? " in that time range" : "") +
                           " in the history: nothing to trace");
  }
  TraceSummary summary;
  summary.ranks = timeline.laneCount();
  for (const auto& part : job.parts) {
    if (const auto it = timeline.clocks().find(part.node); it != timeline.clocks().end()) {
      summary.clocks[part.node] = it->second;
    } else {
      summary.unmeasured.push_back(part.node);
    }
  }
  const Json clocks = clocksOf(summary);
  std::int64_t base = timeline.span().first;  // or a GPU sample or event before the first step
  for (const auto& [node, s] : gpus) base = std::min(base, s.timeUnixUs - timeline.offsetOf(node));
  for (const auto& [node, e] : events) base = std::min(base, e.timeUnixUs - timeline.offsetOf(node));
  LOCKSTEP_ASSIGN_OR_RETURN(Sink sink, Sink::open(path));
  sink.write(R"({"displayTimeUnit":"ms","baseTimeNanoseconds":)" + std::to_string(base * 1000) + R"(,"otherData":)" +
             text(Json{{"job_id", jobId}, {"job_name", job.spec.name}, {"producer", "lockstep"},
                       {"clock_offsets", clocks}, {"clocks_not_measured", summary.unmeasured}}) +
             R"(,"traceEvents":[)");
  TraceWriter out(sink, base);
  const auto pids = writeRanks(out, timeline);
  writeGpus(out, timeline, gpus);
  writeEvents(out, timeline, pids, events);
  sink.write("\n]}\n");
  summary.events = out.events();
  LOCKSTEP_TRY(sink.finish());
  return summary;
}

}  // namespace lockstep::report
