// lockstepctl's job history commands: history, report, compare; and the recorder that start --wait
// and watch feed.

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ctl.h"
#include "ctl_flags.h"
#include "lockstep/present/present.h"
#include "lockstep/common/clock.h"
#include "lockstep/report/report.h"
#include "lockstep/report/trace.h"
#ifdef LOCKSTEP_HAVE_PDF
#include "lockstep/report/report_pdf.h"
#endif

namespace lockstep::ctl {
namespace {

using Json = nlohmann::ordered_json;

Result<history::History> openHistory(const Globals& g) {
  if (g.historyPath.empty()) return invalidArgument("--no-history: there is no history to read");
  return history::History::open(g.historyPath);
}



Result<JobState> parseState(const std::string& name) {
  for (JobState s : {JobState::kStarting, JobState::kRunning, JobState::kFinished, JobState::kFailed, JobState::kStopped}) {
    if (jobStateName(s) == name) return s;
  }
  return invalidArgument("--state " + name + ": use starting, running, finished, failed or stopped");
}

Result<std::int64_t> parseDate(const std::string& text) {
  std::tm tm{};
  const char* end = strptime(text.c_str(), "%Y-%m-%d", &tm);
  if (!end || *end != '\0') return invalidArgument("--since " + text + ": give a date as YYYY-MM-DD");
  tm.tm_isdst = -1;
  return static_cast<std::int64_t>(std::mktime(&tm)) * 1'000'000;
}

Json recordJson(const history::JobRecord& r) {
  Json nodes = Json::array();
  for (const auto& p : r.parts) nodes.push_back(p.node);
  Json j = {{"job_id", r.spec.jobId},
            {"name", r.spec.name},
            {"state", std::string(jobStateName(r.state))},
            {"owner", r.owner},
            {"message", r.message},
            {"started_unix_us", r.startedUnixUs},
            {"ended_unix_us", r.endedUnixUs ? Json(r.endedUnixUs) : Json(nullptr)},
            {"world_size", r.spec.worldSize},
            {"nodes", nodes},
            {"step_reports", r.stepReports}};
  if (r.finalKpis) {
    const kpi::JobKpis& k = *r.finalKpis;
    j["kpis"] = {{"steps", k.step},
                 {"elapsed_s", k.elapsedSeconds},
                 {"samples_per_s", jsonFigure(present::jobThroughput(k, true))},  // what the job delivered
                 {"end_samples_per_s", jsonFigure(k.samplesPerSecond)},          // over its last 10 s
                 {"scaling_efficiency", jsonFigure(k.scalingEfficiency)},
                 {"comm_overhead", jsonFigure(k.commOverhead)},
                 {"gpu_utilization_pct", jsonFigure(k.gpuUtilizationPct)},
                 {"time_to_convergence_s", jsonFigure(k.timeToConvergenceSeconds)},
                 {"cost", r.spec.prices.anySet()
                              ? jsonFigure(k.costSoFar) : Json(nullptr)},
                 {"currency", r.spec.prices.currency}};
  } else {
    j["kpis"] = nullptr;
  }
  return j;
}

int listJobs(const Globals& g, const std::vector<std::string>& args) {
  history::Filter filter;
  std::optional<std::string> state, since;
  std::optional<std::uint32_t> limit;
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl history [--search TEXT] [--state STATE] [--since YYYY-MM-DD] [--limit N]")
                           .text("--search", &filter.text)
                           .text("--state", &state)
                           .text("--since", &since)
                           .whole("--limit", &limit, 1, 1u << 30)
                           .parse(args));
  if (state) {
    auto s = parseState(*state);
    if (!s) return fail(s.error());
    filter.state = *s;
  }
  if (since) {
    auto t = parseDate(*since);
    if (!t) return fail(t.error());
    filter.sinceUnixUs = *t;
  }
  if (limit) filter.limit = *limit;
  auto h = openHistory(g);
  if (!h) return fail(h.error());
  auto jobs = h->jobs(filter);
  if (!jobs) return fail(jobs.error());
  if (g.json) {
    Json all = Json::array();
    for (const auto& r : *jobs) all.push_back(recordJson(r));
    std::printf("%s\n", all.dump().c_str());
    return kOk;
  }
  if (jobs->empty()) {
    std::printf("no jobs in %s%s\n", h->path().c_str(), filter.text.empty() && !filter.state ? "" : " match");
    return kOk;
  }
  std::printf("%-28s %-16s %-9s %-12s %-19s %9s %5s %11s %6s %6s %12s\n", "JOB", "NAME", "STATE", "OWNER", "STARTED",
              "DURATION", "RANKS", "SAMPLES/S", "EFF", "COMM", "COST");
  for (const auto& r : *jobs) {
    const kpi::JobKpis* k = r.finalKpis ? &*r.finalKpis : nullptr;
    const double elapsed = r.endedUnixUs && r.startedUnixUs ? static_cast<double>(r.endedUnixUs - r.startedUnixUs) / 1e6
                                                            : static_cast<double>(unixMicrosNow() - r.startedUnixUs) / 1e6;
    const Prices& prices = r.spec.prices;
    const std::string unknown(present::kUnknown);
    const std::string cost = prices.anySet() && k && k->costSoFar ? present::money(*k->costSoFar, prices.currency) : unknown;
    // Final KPIs exist once a job ended: its throughput is what it delivered, start to end.
    std::printf("%-28s %-16.16s %-9s %-12s %s %s %5u %s %s %s %s\n", r.spec.jobId.c_str(), r.spec.name.c_str(),
                std::string(jobStateName(r.state)).c_str(), r.owner.c_str(), column(timeText(r.startedUnixUs), -19).c_str(),
                column(r.startedUnixUs ? present::duration(elapsed) : unknown, 9).c_str(), r.spec.worldSize,
                column(k ? present::figure(present::jobThroughput(*k, true), 0) : unknown, 11).c_str(),
                column(k ? present::percent(k->scalingEfficiency, 0) : unknown, 6).c_str(),
                column(k ? present::percent(k->commOverhead, 1) : unknown, 6).c_str(), column(cost, 12).c_str());
  }
  return kOk;
}

}  // namespace

// ---- recording ----

Recorder::Recorder(const Globals& g) : timeout_(g.timeout) {
  if (g.historyPath.empty()) return;
  auto h = history::History::open(g.historyPath);
  if (!h) {
    failed(h.error());
    return;
  }
  history_ = std::move(*h);
}

void Recorder::failed(const Error& e) {
  std::fprintf(stderr, "lockstepctl: not recording this job in the history: %s\n", e.message.c_str());
  history_.reset();
}

void Recorder::part(const NodeHello& node, const JobStatus& status) {
  if (!history_) return;
  if (nodes_.insert(node.nodeName).second) {
    if (auto r = history_->recordNode(node); !r) return failed(r.error());
  }
  if (auto r = history_->recordJob(node.nodeName, status); !r) failed(r.error());
}

void Recorder::clock(AgentClient& agent) {
  if (!history_) return;
  const auto now = std::chrono::steady_clock::now();
  auto& next = nextClock_[agent.hello().nodeName];
  if (now < next) return;
  next = now + kClockEvery;
  // An agent too old to say its time is left out: its records keep the time it stamped.
  if (auto offset = agent.measureClock(kClockExchanges, timeout_)) {
    if (auto r = history_->recordClock(agent.hello().nodeName, *offset); !r) failed(r.error());
  }
}

void Recorder::messages(const std::vector<StreamMessage>& batch) {
  if (!history_) return;
  if (auto r = history_->recordMessages(batch); !r) failed(r.error());
}

void Recorder::finish() {
  if (!history_) return;
  if (auto r = history_->refreshFinalKpis(); !r) failed(r.error());
}

// ---- commands ----

int cmdHistory(const Globals& g, const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "delete") {
    std::vector<std::string> jobs;
    LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl history delete JOB...")
                             .arguments(&jobs, 1, Flags::kAny)
                             .parse({args.begin() + 1, args.end()}));
    auto h = openHistory(g);
    if (!h) return fail(h.error());
    for (const auto& job : jobs) {
      if (auto removed = h->remove(job); !removed) return fail(removed.error());
      if (!g.json) std::printf("deleted %s\n", job.c_str());
    }
    return kOk;
  }
  if (!args.empty() && args[0] == "compact") {
    LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl history compact").parse({args.begin() + 1, args.end()}));
    auto h = openHistory(g);
    if (!h) return fail(h.error());
    auto stats = h->compact(unixMicrosNow());
    if (!stats) return fail(stats.error());
    std::printf("GPU samples: %llu -> %llu rows; process samples: %llu -> %llu rows\n",
                static_cast<unsigned long long>(stats->gpuRowsBefore), static_cast<unsigned long long>(stats->gpuRowsAfter),
                static_cast<unsigned long long>(stats->processRowsBefore),
                static_cast<unsigned long long>(stats->processRowsAfter));
    return kOk;
  }
  return listJobs(g, args);
}

int cmdReport(const Globals& g, const std::vector<std::string>& args) {
  const char* usage = "usage: lockstepctl report JOB [--format csv|json|html|pdf] --out FILE";
  std::vector<std::string> job;
  std::string out;
  std::optional<std::string> formatName;
  std::optional<report::Format> format;
  LOCKSTEP_TRY_OR_FAIL(Flags(usage).text("--out", &out).text("--format", &formatName).arguments(&job, 1).parse(args));
  if (out.empty()) return fail(invalidArgument(std::string("--out is missing; ") + usage));
  if (formatName) {
    auto f = report::parseFormat(*formatName);
    if (!f) return fail(f.error());
    format = *f;
  }
  const std::string& jobId = job[0];
  if (!format) format = report::formatOfPath(out);
  if (!format) return fail(invalidArgument("report: say --format csv|json|html|pdf (" + out + " has no known extension)"));
  auto h = openHistory(g);
  if (!h) return fail(h.error());
  Result<void> written;
  if (*format == report::Format::kPdf) {
#ifdef LOCKSTEP_HAVE_PDF
    written = report::writePdf(*h, jobId, out, unixMicrosNow());
#else
    written = Error{ErrorCode::kFailedPrecondition, "this lockstepctl was built without Qt, which writes PDFs: "
                                                    "use --format html, or a build with the desktop app"};
#endif
  } else {
    written = report::write(*h, jobId, *format, out, unixMicrosNow());
  }
  if (!written) return fail(written.error());
  if (g.json) {
    Json files = Json::array({out});
    if (*format == report::Format::kCsv) files.push_back(report::gpuCsvPath(out));
    std::printf("%s\n", Json{{"job_id", jobId}, {"format", std::string(report::formatName(*format))}, {"files", files}}.dump().c_str());
  } else {
    std::printf("wrote %s%s\n", out.c_str(), *format == report::Format::kCsv ? (" and " + report::gpuCsvPath(out)).c_str() : "");
  }
  return kOk;
}

namespace {

// --from/--to: a time of day as YYYY-MM-DDTHH:MM:SS (local), or a time into the job: 90, 90s, 5m,
// 1h30m, 1500ms.
Result<std::int64_t> parseTraceTime(const std::string& flag, const std::string& text, std::int64_t jobStartUs) {
  const auto wrong = [&] {
    return invalidArgument(flag + " " + text + ": give a time into the job (90s, 5m, 1h30m) or YYYY-MM-DDTHH:MM:SS");
  };
  if (text.find('T') != std::string::npos) {
    std::tm tm{};
    const char* end = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
    if (!end || *end != '\0') return wrong();
    tm.tm_isdst = -1;
    const std::time_t t = std::mktime(&tm);
    if (t == static_cast<std::time_t>(-1)) return wrong();
    return static_cast<std::int64_t>(t) * 1'000'000;
  }
  constexpr double kLongestUs = 3650.0 * 24 * 3600e6;  // ten years into a job
  double us = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t used = 0;
    double number = 0;
    try {
      number = std::stod(text.substr(at), &used);
    } catch (const std::exception&) {
      return wrong();
    }
    at += used;
    std::string unit;
    while (at < text.size() && std::isalpha(static_cast<unsigned char>(text[at]))) unit += text[at++];
    // A bare number is seconds, alone: "1h30" is not guessed at.
    const double scale = unit == "h" ? 3600e6 : unit == "m" ? 60e6 : unit == "s" || (unit.empty() && used == text.size()) ? 1e6
                       : unit == "ms" ? 1e3 : -1;
    if (scale < 0 || number < 0 || !std::isfinite(number)) return wrong();
    us += number * scale;
    if (us > kLongestUs) return wrong();
  }
  if (text.empty()) return wrong();
  return jobStartUs + static_cast<std::int64_t>(us);
}

}  // namespace

int cmdTrace(const Globals& g, const std::vector<std::string>& args) {
  const char* usage = "usage: lockstepctl trace JOB [--from T] [--to T] --out FILE.json[.gz]";
  std::vector<std::string> job;
  std::string out;
  std::optional<std::string> from, to;
  LOCKSTEP_TRY_OR_FAIL(Flags(usage).text("--out", &out).text("--from", &from).text("--to", &to).arguments(&job, 1).parse(args));
  if (out.empty()) return fail(invalidArgument(std::string("--out is missing; ") + usage));
  auto h = openHistory(g);
  if (!h) return fail(h.error());
  auto record = h->job(job[0]);
  if (!record) return fail(record.error());
  report::TimeRange range;
  for (auto [flag, text, into] : {std::tuple{"--from", &from, &range.fromUnixUs}, std::tuple{"--to", &to, &range.toUnixUs}}) {
    if (!*text) continue;
    auto t = parseTraceTime(flag, **text, record->startedUnixUs);
    if (!t) return fail(t.error());
    *into = *t;
  }
  if (range.fromUnixUs && range.toUnixUs && *range.toUnixUs <= *range.fromUnixUs) {
    return fail(invalidArgument("--to " + *to + " is not after --from " + *from));
  }
  auto summary = report::writeTrace(*h, job[0], range, out);
  if (!summary) return fail(summary.error());
  if (g.json) {
    const Json clocks = Json::parse(summary->clocksJson());
    std::printf("%s\n", Json{{"job_id", job[0]}, {"file", out}, {"ranks", summary->ranks}, {"events", summary->events},
                              {"clock_offsets", clocks}, {"clocks_not_measured", summary->unmeasured}}.dump().c_str());
    return kOk;
  }
  std::printf("wrote %s: %zu ranks, %zu events (open it in https://ui.perfetto.dev or chrome://tracing)\n", out.c_str(),
              summary->ranks, summary->events);
  for (const auto& [node, c] : summary->clocks) {
    std::printf("  %s: clock %+.3f ms from this machine's, ± %.3f ms\n", node.c_str(), c.offsetUs / 1e3, c.uncertaintyUs / 1e3);
  }
  for (const auto& node : summary->unmeasured) std::printf("  %s: clock not measured; its times are as it stamped them\n", node.c_str());
  return kOk;
}

int cmdCompare(const Globals& g, const std::vector<std::string>& argv) {
  std::vector<std::string> args;
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl compare JOB JOB...").arguments(&args, 2, Flags::kAny).parse(argv));
  auto h = openHistory(g);
  if (!h) return fail(h.error());
  std::vector<history::JobRecord> jobs;
  for (const auto& id : args) {
    auto r = h->job(id);
    if (!r) return fail(r.error());
    jobs.push_back(std::move(*r));
  }
  const report::Comparison c = report::compare(jobs);
  // The projection's line (docs/kpis.md), where the jobs' steps and all-reduce allow one.
  const report::Series* projected = nullptr;
  for (std::size_t i = 0; c.throughput && i < c.throughput->series.size(); ++i) {
    if (c.throughput->series[i].name == report::kProjectedSeries) projected = &c.throughput->series[i];
  }
  if (g.json) {
    Json rows = Json::array();
    for (const auto& row : c.kpis.rows) rows.push_back(row);
    Json out = {{"header", c.kpis.header}, {"rows", rows}, {"scaling_note", c.scalingNote}, {"advice", c.advice}};
    for (const auto* chart : {&c.throughput, &c.efficiency}) {
      if (!*chart) continue;
      Json points = Json::array();
      for (const auto& p : (*chart)->series.at(0).points) points.push_back({p.x, p.y});
      out[(*chart)->id] = points;
    }
    if (projected) {
      Json points = Json::array();
      for (const auto& p : projected->points) points.push_back({p.x, p.y});
      out["projected_scaling"] = points;
    }
    std::printf("%s\n", out.dump().c_str());
    return kOk;
  }
  std::vector<std::size_t> widths(c.kpis.header.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (std::size_t i = 0; i < row.size() && i < widths.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  };
  widen(c.kpis.header);
  for (const auto& row : c.kpis.rows) widen(row);
  auto print = [&](const std::vector<std::string>& row) {
    for (std::size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      std::printf(i == 0 ? "%-*s" : "  %*s", static_cast<int>(widths[i]), row[i].c_str());
    }
    std::printf("\n");
  };
  print(c.kpis.header);
  for (const auto& row : c.kpis.rows) print(row);
  if (!c.advice.empty()) std::printf("\n");
  for (const auto& line : c.advice) std::printf("%s\n", line.c_str());
  if (c.throughput && c.efficiency) {
    std::printf("\nscaling (%s):\n%6s %12s %11s\n", c.scalingNote.c_str(), "RANKS", "SAMPLES/S", "EFFICIENCY");
    const auto& t = c.throughput->series.at(0).points;
    const auto& e = c.efficiency->series.at(0).points;
    for (std::size_t i = 0; i < t.size() && i < e.size(); ++i) {
      std::printf("%6.0f %12.0f %10.0f%%\n", t[i].x, t[i].y, e[i].y);
    }
    if (projected) {
      std::printf("\nprojected (docs/kpis.md):\n%6s %12s\n", "RANKS", "SAMPLES/S");
      for (const auto& p : projected->points) std::printf("%6.0f %12.0f\n", p.x, p.y);
    }
  } else if (!c.scalingNote.empty()) {
    std::printf("\n%s\n", c.scalingNote.c_str());
  }
  return kOk;
}

}  // namespace lockstep::ctl
