// Issue 35: a job's trace. Two agents, one whose clock is 3 s ahead (a test knob: it stamps its
// hellos and everything it streams 3 s late), rank 1 computing 8x slower: the trace lockstepctl
// writes parses as Chrome trace JSON, has a process per rank, boxes whose durations are the step
// reports', rank 1's compute the longest in its steps, and both nodes on one clock within the
// offset's stated uncertainty.

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "lockstep/history/history.h"
#include "lockstep/present/present.h"
#include "lockstep/report/report.h"
#include "lockstep/report/trace.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using Json = nlohmann::json;
constexpr std::int64_t kShiftUs = 3'000'000;

std::string gunzip(const std::string& path) {
  gzFile in = gzopen(path.c_str(), "rb");
  if (in == nullptr) return "";
  std::string text;
  char buffer[1 << 16];
  for (int n; (n = gzread(in, buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  gzclose(in);
  return text;
}

struct Box {
  std::string phase;
  std::int64_t start, duration;
};

TEST(Trace, AStragglersComputeIsLongestAndBothNodesAreOnOneClock) {
  TempDir dir;
  TwoNodes nodes(dir, {{"LOCKSTEP_TEST_SLOWDOWN", "1:8"}}, kShiftUs);  // 8x: its lead holds when the machine is loaded
  auto& [a, b] = nodes;
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(a));
  ASSERT_TRUE(ctl.pairWith(b));
  auto done = ctl({"start", "--ranks", "4", "--ranks-per-agent", "2,2", "--wait", "--job-id", "traced", "--layers",
                   "256,512,10", "--dataset", "synthetic:n=4096,dim=256,classes=10", "--steps", "60", "--bucket-mb", "1",
                   "--checkpoint-dir", dir.file("ckpt"), "--checkpoint-every", "20"});
  ASSERT_EQ(done.status.exitCode, 0) << done.out << done.err;

  auto traced = ctl({"trace", "traced", "--out", dir.file("traced.json.gz"), "--json"});
  ASSERT_EQ(traced.status.exitCode, 0) << traced.out << traced.err;
  const Json said = Json::parse(traced.out);
  EXPECT_EQ(said["ranks"], 4);
  const Json trace = Json::parse(gunzip(dir.file("traced.json.gz")));
  ASSERT_TRUE(trace["traceEvents"].is_array());
  EXPECT_TRUE(trace["baseTimeNanoseconds"].is_number_integer());

  // A process per rank, named; every box of every step.
  std::map<int, std::string> processes;
  std::map<int, int> rankOf;                                         // pid -> its boxes' rank
  std::map<std::pair<int, std::uint64_t>, std::vector<Box>> boxes;  // (rank, step)
  std::map<int, std::set<std::uint64_t>> checkpointsAfter;           // rank -> steps
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes[e["pid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X" && e["cat"] == "phase") {  // the trainer's checkpoints, on their own track
      EXPECT_EQ(e["name"], "checkpoint");
      EXPECT_EQ(e["tid"], 2);
      checkpointsAfter[e["args"]["rank"].get<int>()].insert(e["args"]["after_step"].get<std::uint64_t>());
    } else if (e["ph"] == "X" && e["cat"] == "step") {
      const int rank = e["args"]["rank"].get<int>();
      rankOf[e["pid"].get<int>()] = rank;
      boxes[{rank, e["args"]["step"].get<std::uint64_t>()}].push_back(
          {e["name"], e["ts"].get<std::int64_t>(), e["dur"].get<std::int64_t>()});
    }
  }
  ASSERT_EQ(processes.size(), 4u);
  // Rank 0 writes the checkpoints, and reports the time each held it.
  EXPECT_EQ(checkpointsAfter, (std::map<int, std::set<std::uint64_t>>{{0, {20, 40, 60}}}));
  std::map<std::string, int> perNode;
  for (const auto& [pid, name] : processes) {
    EXPECT_EQ(name.rfind("rank " + std::to_string(rankOf[pid]) + " (node-", 0), 0u) << name;
    ++perNode[name.substr(name.find('(') + 1, 6)];
  }
  EXPECT_EQ(perNode, (std::map<std::string, int>{{"node-a", 2}, {"node-b", 2}}));
  // The job's events where they happened: rank 0's bucket plan on its lane, the end across the trace.
  int plans = 0, finished = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "i") continue;
    if (e["name"] == "note" && e["s"] == "p" && rankOf[e["pid"].get<int>()] == 0 &&
        e["args"]["message"].get<std::string>().rfind("buckets: ", 0) == 0) {
      ++plans;
    }
    finished += e["name"] == "finished" && e["s"] == "g";
    EXPECT_GE(e["ts"].get<std::int64_t>(), 0) << e.dump();
  }
  EXPECT_EQ(plans, 1);
  EXPECT_GE(finished, 1);

  // The boxes are what the ranks reported.
  auto history = history::History::open(ctl.historyPath());
  ASSERT_TRUE(history) << history.error().message;
  std::size_t reports = 0;
  std::int64_t firstEnd = INT64_MAX, lastEnd = 0;  // node-a's, whose clock is true
  ASSERT_TRUE(history->replay("traced", [&](const StreamMessage& m) {
    const auto* r = std::get_if<StepReport>(&m.payload);
    if (r == nullptr) return;
    ++reports;
    if (m.node == "node-a") firstEnd = std::min(firstEnd, r->timeUnixUs), lastEnd = std::max(lastEnd, r->timeUnixUs);
    const auto& mine = boxes[{static_cast<int>(r->rank), r->step}];
    std::map<std::string, std::int64_t> byPhase;
    for (const auto& box : mine) byPhase[box.phase] += box.duration;
    EXPECT_EQ(byPhase["data"], r->dataTimeUs.value_or(0)) << r->rank << "/" << r->step;
    // The optimizer is cut from the end of compute: the trainer times it.
    ASSERT_TRUE(r->optimizerTimeUs) << r->rank << "/" << r->step;
    EXPECT_EQ(byPhase["optimizer"], *r->optimizerTimeUs) << r->rank << "/" << r->step;
    EXPECT_EQ(byPhase["compute"] + byPhase["optimizer"], *r->computeTimeUs) << r->rank << "/" << r->step;
    EXPECT_EQ(byPhase["communication"], *r->exposedCommTimeUs) << r->rank << "/" << r->step;
  }));
  EXPECT_EQ(reports, 240u);

  // Rank 1's compute (its forward and backward box and its optimizer's) is the longest of each step;
  // node-b's lanes are not 3 s ahead of node-a's.
  int longest = 0, steps = 0;
  std::vector<std::int64_t> apart;
  for (std::uint64_t step = 6; step <= 60; ++step) {  // past the first steps' warm-up
    std::map<int, std::int64_t> compute, end;
    for (int rank = 0; rank < 4; ++rank) {
      for (const auto& box : boxes[{rank, step}]) {
        if (box.phase == "compute" || box.phase == "optimizer") compute[rank] += box.duration;
        end[rank] = std::max(end[rank], box.start + box.duration);
      }
    }
    ++steps;
    longest += std::max_element(compute.begin(), compute.end(), [](auto& x, auto& y) { return x.second < y.second; })->first == 1;
    apart.push_back(std::abs(end[2] - end[0]));
  }
  EXPECT_GE(longest, steps * 9 / 10) << longest << " of " << steps;
  std::sort(apart.begin(), apart.end());
  EXPECT_LT(apart[apart.size() / 2], 200'000) << "median µs between node-a's and node-b's step ends";

  // The offsets measured are within their stated uncertainty of the truth.
  for (const auto& [node, truth] : {std::pair{"node-a", std::int64_t{0}}, std::pair{"node-b", kShiftUs}}) {
    const auto& c = said["clock_offsets"][node];
    ASSERT_TRUE(c.is_object()) << traced.out;
    EXPECT_LE(std::abs(c["offset_us"].get<std::int64_t>() - truth), c["uncertainty_us"].get<std::int64_t>()) << node;
    EXPECT_LT(c["uncertainty_us"].get<std::int64_t>(), 100'000) << node;
  }

  // A range that holds no step says so; an unknown job too; a bad time is refused.
  auto empty = ctl({"trace", "traced", "--from", "2h", "--out", dir.file("none.json")});
  EXPECT_EQ(empty.status.exitCode, 2) << empty.err;
  EXPECT_NE(empty.err.find("no step in that time range"), std::string::npos) << empty.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("none.json")));
  EXPECT_EQ(ctl({"trace", "nope", "--out", dir.file("n.json")}).status.exitCode, 1);
  for (const char* wrong : {"soon", "1h30", "5x", "-3s", "1e300h", "nan"}) {
    auto bad = ctl({"trace", "traced", "--from", wrong, "--out", dir.file("n.json")});
    EXPECT_EQ(bad.status.exitCode, 2) << wrong;
    EXPECT_NE(bad.err.find(std::string("--from ") + wrong + ": give a time"), std::string::npos) << bad.err;
  }
  // A part of it, to halfway through its steps (a time into the job), in plain JSON.
  const auto job = history->job("traced");
  ASSERT_TRUE(job);
  const std::int64_t halfway = (firstEnd + (lastEnd - firstEnd) / 2 - job->startedUnixUs) / 1000;
  auto part = ctl({"trace", "traced", "--from", "0s", "--to", std::to_string(halfway) + "ms", "--out", dir.file("part.json")});
  ASSERT_EQ(part.status.exitCode, 0) << part.err;
  EXPECT_LT(Json::parse(readText(dir.file("part.json")))["traceEvents"].size(), trace["traceEvents"].size());
}

// Issue 42: a job of 2 ranks and one step whose collectives are an all-gather per layer, each
// layer's reduce-scatter overlapping the next all-gather (another stream); rank 1 waits on its
// reduce-scatters' last 4 ms.
constexpr std::int64_t kT0 = 1'800'000'000'000'000;

void recordFsdpJob(history::History& history) {
  JobStatus status;
  status.spec = smallJob("fsdp", 2, 10);
  for (std::uint32_t r = 0; r < 2; ++r) status.spec.ranks.push_back(RankPlacement{r, "node-a", r, r});
  status.state = JobState::kRunning;
  status.startedUnixUs = kT0;
  ASSERT_TRUE(history.recordJob("node-a", status));
  std::vector<StreamMessage> messages;
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    StepReport r;
    r.jobId = "fsdp";
    r.rank = rank;
    r.step = 1;
    r.samples = 8;
    r.timeUnixUs = kT0 + 100'000;
    r.stepTimeUs = 100'000;
    r.dataTimeUs = 10'000;
    r.computeTimeUs = 80'000;
    r.exposedCommTimeUs = 10'000;
    for (int layer = 0; layer < 3; ++layer) {
      const std::int64_t at = kT0 + 10'000 + layer * 20'000;
      r.collectiveSpans.push_back({CollectiveKind::kAllGather, at, 15'000, 0, 8u << 20});
      r.collectiveSpans.push_back({CollectiveKind::kReduceScatter, at + 10'000, 15'000, rank == 1 ? 4'000 : 0, 16u << 20});
    }
    messages.push_back({rank + 1, "node-a", r});
  }
  ASSERT_TRUE(history.recordMessages(messages));
}

// Every collective a rank reported, on its lane at the time it ran (its node's clock moved onto
// the trace's), named by its kind, with its bytes and its exposed part.
TEST(Trace, EachCollectiveIsAnEventOnItsRanksLane) {
  TempDir dir;
  auto history = history::History::open(dir.file("history.db"));
  ASSERT_TRUE(history) << history.error().message;
  recordFsdpJob(*history);
  const std::string path = dir.file("fsdp.json");
  const auto written = report::writeTrace(*history, "fsdp", {}, path);
  ASSERT_TRUE(written) << written.error().message;
  const Json trace = Json::parse(readText(path));
  std::map<int, std::vector<Json>> collectivesOf;  // pid
  std::map<std::pair<int, int>, std::string> threadName;
  std::int64_t stepStart = INT64_MAX;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") threadName[{e["pid"].get<int>(), e["tid"].get<int>()}] = e["args"]["name"];
    if (e["ph"] == "X" && e["cat"] == "collective") collectivesOf[e["pid"].get<int>()].push_back(e);
    if (e["ph"] == "X" && e["cat"] == "step") stepStart = std::min(stepStart, e["ts"].get<std::int64_t>());
  }
  ASSERT_EQ(collectivesOf.size(), 2u) << "a lane each";
  for (const auto& [pid, events] : collectivesOf) {
    ASSERT_EQ(events.size(), 6u) << pid;
    std::map<std::string, int> byName;
    std::set<int> tracks;
    for (const auto& e : events) {
      ++byName[e["name"].get<std::string>()];
      tracks.insert(e["tid"].get<int>());
      EXPECT_EQ(e["args"]["rank"], pid - 1);
      EXPECT_EQ(e["args"]["step"], 1);
      EXPECT_EQ(e["dur"], 15'000);
      EXPECT_EQ(e["args"]["bytes"], e["name"] == "all_gather" ? 8u << 20 : 16u << 20);
      EXPECT_EQ(e["args"]["exposed_us"], e["name"] == "reduce_scatter" && pid == 2 ? 4'000 : 0) << e.dump();
    }
    EXPECT_EQ(byName, (std::map<std::string, int>{{"all_gather", 3}, {"reduce_scatter", 3}}));
    EXPECT_EQ(tracks.size(), 2u) << "overlapping collectives that do not nest take two tracks";
    for (const int tid : tracks) EXPECT_EQ((threadName[{pid, tid}].rfind("collectives", 0)), 0u) << tid;
    // The first all-gather began 10 ms into the step.
    std::int64_t first = INT64_MAX;
    for (const auto& e : events) first = std::min(first, e["ts"].get<std::int64_t>());
    EXPECT_EQ(first - stepStart, 10'000);
  }
}

// And over their lanes in the report's timeline figure: outlined, labelled where wide enough (up to
// the next one), where rank 1 waited on them filled.
TEST(Trace, TheReportsTimelineDrawsTheCollectives) {
  TempDir dir;
  auto history = history::History::open(dir.file("history.db"));
  ASSERT_TRUE(history) << history.error().message;
  recordFsdpJob(*history);
  const std::string path = dir.file("fsdp.html");
  const auto written = report::write(*history, "fsdp", report::Format::kHtml, path, kT0 + 1'000'000);
  ASSERT_TRUE(written) << written.error().message;
  const std::string page = readText(path);
  const auto at = page.find("id=\"chart-timeline\"");
  ASSERT_NE(at, std::string::npos);
  const std::string figure = page.substr(at, page.find("</figure>", at) - at);
  if (const char* keep = std::getenv("LOCKSTEP_COLLECTIVES_FIGURE")) std::ofstream(keep) << figure.substr(figure.find("<svg"));
  const std::string color(present::phaseColor(kpi::Phase::kCollective));
  EXPECT_NE(figure.find(">all-ga"), std::string::npos) << "labelled, up to the reduce-scatter that overlaps it";
  EXPECT_NE(figure.find("fill=\"none\" stroke=\"" + color + "\""), std::string::npos) << "outlined";
  EXPECT_NE(figure.find(">collective (filled: exposed)<"), std::string::npos) << "in the legend";
  // Rank 1's lane (the second) has bars as tall as the lane where it waited; rank 0's has none.
  std::size_t filled = 0;
  for (std::size_t i = figure.find("fill=\"" + color + "\""); i != std::string::npos; i = figure.find("fill=\"" + color + "\"", i + 1)) ++filled;
  EXPECT_GE(filled, 6u + 3u) << "a strip along each lane's top where they ran, and rank 1's 3 waits";
}

}  // namespace
}  // namespace lockstep::test
