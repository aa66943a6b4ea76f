// Issue 46 §1: a job's KPIs, events, stall and alerts fanned in at its supervising agent (one
// connection, one frame at a time: docs/fan-in.md) equal what every one of its agents' streams
// holds. Real agents on two nodes, a real trainer job across them, lockstepctl as users run it.

#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <google/protobuf/util/message_differencer.h>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "lockstep/kpi/frame.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/stall.h"
#include "lockstep/kpi/stream.h"
#include "lockstep/v1/lockstep.pb.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

// What differs between two jobs' KPIs, field by field, as their frames' schema names the fields.
std::string differences(const kpi::JobKpis& a, const kpi::JobKpis& b) {
  v1::KpiFrame x, y;
  x.ParseFromString(kpi::encodeFrame(a));
  y.ParseFromString(kpi::encodeFrame(b));
  std::string out;
  google::protobuf::util::MessageDifferencer differ;
  differ.ReportDifferencesToString(&out);
  differ.Compare(x, y);
  return out;
}

// A job event as both paths must carry it.
using EventKey = std::tuple<std::string, JobEventKind, std::int64_t, std::string>;
EventKey keyOf(const StreamMessage& m) {
  const auto& e = std::get<JobEvent>(m.payload);
  return {m.node, e.kind, e.timeUnixUs, e.message};
}

struct FanIn : ::testing::Test {
  FanIn() { paired = ctl.pairWith(a) && ctl.pairWith(b); }

  // The agents' clients, and which of them supervises `jobId`: its first agent (docs/agent.md).
  void connect(const std::string& jobId) {
    clients.push_back(connectAuthorized(a, dir));
    clients.push_back(connectAuthorized(b, dir));
    const auto status = jobStatusOn(*clients[0], jobId);
    ASSERT_TRUE(status && !status->spec.agents.empty());
    spec = status->spec;
    const bool aFirst = spec.agents.front().node == a.name();
    supervising = clients[aFirst ? 0 : 1].get();
    other = clients[aFirst ? 1 : 0].get();
  }

  // Starts a trainer job across both nodes, `ranks` a node, and connects to its agents.
  void startJob(const std::string& jobId, const std::string& ranks, const std::string& steps,
                const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"start", "--ranks-per-agent", ranks, "--job-id", jobId, "--layers", "16,32,4",
                                      "--dataset", "synthetic:n=2048", "--steps", steps};
    args.insert(args.end(), more.begin(), more.end());
    auto run = ctl(args);
    ASSERT_EQ(run.status.exitCode, 0) << run.out << run.err;
    connect(jobId);
    ASSERT_NE(supervising, nullptr);
  }

  // The job's last frame: the supervision saw the job end and read its streams to their end.
  std::optional<FrameReply> lastFrame(const std::string& jobId) {
    std::optional<FrameReply> out;
    waitUntil(
        [&] {
          auto f = supervising->frame({jobId, 0, kMaxFrameRanks, 0}, 5s);
          if (f && f->ended) out = std::move(*f);
          return out.has_value();
        },
        30s);
    return out;
  }

  // Holds `frame` (its KPIs `fanned`) against what `all` the job's agents streamed: its KPIs at the
  // frame's moment, straggler included, and its events. Returns the streams' KPIs.
  kpi::JobKpis expectTheStreamsIn(const FrameReply& frame, const kpi::JobKpis& fanned, const std::vector<StreamMessage>& all) {
    kpi::JobTracker tracker(spec);
    kpi::StreamReader reader([&](const std::string& id) -> RecordSink* { return id == spec.jobId ? &tracker : nullptr; });
    reader.read(all);
    const kpi::JobKpis full = tracker.snapshot(frame.timeUnixUs);
    EXPECT_EQ(fanned.ranks, full.ranks);
    EXPECT_EQ(fanned.collectives, full.collectives);
    EXPECT_EQ(fanned.slowestRanks, full.slowestRanks);
    EXPECT_EQ(fanned.slowestRank, full.slowestRank) << "the straggler";
    EXPECT_TRUE(fanned == full) << "every figure of the job, exactly: " << differences(fanned, full);
    std::multiset<EventKey> streamed, framed;
    for (const auto& m : all) {
      if (std::holds_alternative<JobEvent>(m.payload) && jobOf(m.payload) == spec.jobId) streamed.insert(keyOf(m));
    }
    for (const auto& m : frame.events) framed.insert(keyOf(m));
    EXPECT_EQ(framed, streamed);
    EXPECT_EQ(frame.lastEvent, frame.events.size());
    return full;
  }

  // Everything each agent's stream holds, read to its end, in the order of the records' times (as
  // the history's replay merges them, and as a client reading every stream as it flows sees them
  // near enough): one node's whole stream before another's would leave the second's steps
  // incomplete past the engine's 2,000 open steps.
  std::vector<StreamMessage> fullStreams() {
    std::vector<StreamMessage> all;
    for (auto& c : clients) {
      for (std::uint64_t after = 0;;) {
        auto batch = c->fetch(after, 5000, 0, 5s);
        EXPECT_TRUE(batch.ok()) << batch.error().message;
        if (!batch || batch->messages.empty()) break;
        after = batch->messages.back().seq;
        all.insert(all.end(), batch->messages.begin(), batch->messages.end());
      }
    }
    std::stable_sort(all.begin(), all.end(), [](const StreamMessage& x, const StreamMessage& y) {
      return timeOf(x.payload) < timeOf(y.payload);
    });
    return all;
  }

  TempDir dir;
  AgentProcess a{dir, "node-a"}, b{dir, "node-b"};
  Ctl ctl{dir, dir.file("config")};
  bool paired = false;
  std::vector<std::unique_ptr<AgentClient>> clients;
  AgentClient* supervising = nullptr;
  AgentClient* other = nullptr;
  JobSpec spec;
};

// The last line of `watch --json` output, without its nodes (watch --fan-in reads no node's stream).
Json lastWatchLine(const std::string& out) {
  std::istringstream in(out);
  Json last;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) last = Json::parse(line);
  }
  if (last.is_object()) last.erase("nodes");
  return last;
}

TEST_F(FanIn, TheSupervisingAgentsFrameHoldsWhatEveryAgentsStreamHolds) {
  ASSERT_TRUE(paired);
  // Two ranks on each node; an alert that fires on the first reading, so that the supervising
  // agent's own events are among the job's.
  auto run = ctl({"start", "--wait", "--ranks-per-agent", "2,2", "--job-id", "fan", "--layers", "16,32,4", "--dataset",
                  "synthetic:n=2048", "--steps", "400", "--alert", "exposed_comm > 0% -> notify"});
  ASSERT_EQ(run.status.exitCode, 0) << run.out << run.err;
  connect("fan");
  ASSERT_NE(supervising, nullptr);
  ASSERT_NE(other, nullptr);

  const auto frame = lastFrame("fan");
  ASSERT_TRUE(frame.has_value()) << "no ended frame from the supervising agent";
  EXPECT_EQ(frame->state, JobState::kFinished);
  EXPECT_FALSE(frame->stall.has_value());
  const auto fanned = kpi::decodeFrame(frame->kpis);
  ASSERT_TRUE(fanned.ok()) << fanned.error().message;

  const auto all = fullStreams();
  const kpi::JobKpis full = expectTheStreamsIn(*frame, *fanned, all);
  ASSERT_EQ(full.ranks.size(), 4u);
  EXPECT_EQ(full.ranks[3].step, 400u);
  EXPECT_TRUE(std::any_of(frame->events.begin(), frame->events.end(), [](const StreamMessage& m) {
    return std::get<JobEvent>(m.payload).kind == JobEventKind::kAlertFiring;
  })) << "the alert fired, in the supervising agent's stream";

  // Frames come a bounded number of events at a time, in order.
  auto later = supervising->frame({"fan", 0, 0, frame->lastEvent - 1}, 5s);
  ASSERT_TRUE(later.ok()) << later.error().message;
  ASSERT_EQ(later->events.size(), 1u);
  EXPECT_EQ(later->events[0].seq, frame->lastEvent);
  const auto noRows = kpi::decodeFrame(later->kpis);
  ASSERT_TRUE(noRows.ok()) << noRows.error().message;
  const auto slower = std::count_if(fanned->slowestRanks.begin(), fanned->slowestRanks.end(),
                                    [](const kpi::SlowRank& s) { return s.excess > 0; });
  ASSERT_EQ(noRows->ranks.size(), static_cast<std::size_t>(slower)) << "no rows asked for: the slow ranks' alone";
  for (const auto& r : noRows->ranks) {
    EXPECT_TRUE(std::any_of(fanned->slowestRanks.begin(), fanned->slowestRanks.end(),
                            [&](const kpi::SlowRank& s) { return s.rank == r.rank && s.excess > 0; }))
        << "rank " << r.rank;
  }
  EXPECT_EQ(noRows->samplesPerSecond, fanned->samplesPerSecond) << "the job's figures, whole";

  // The agent that does not supervise the job says who does.
  auto refused = other->frame({"fan", 0, 0, 0}, 5s);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("does not supervise job fan"), std::string::npos) << refused.error().message;

  // lockstepctl watch through the frames draws what watch over every stream draws.
  auto watched = ctl({"watch", "fan", "--json"});
  auto fannedIn = ctl({"watch", "fan", "--json", "--fan-in"});
  ASSERT_EQ(watched.status.exitCode, 0) << watched.err;
  ASSERT_EQ(fannedIn.status.exitCode, 0) << fannedIn.err;
  const Json whole = lastWatchLine(watched.out);
  ASSERT_TRUE(whole.is_object()) << watched.out;
  EXPECT_EQ(lastWatchLine(fannedIn.out), whole);
  // The rows in view, chosen; the rows of the ranks slower than the median come whatever is chosen.
  auto window = ctl({"watch", "fan", "--json", "--fan-in", "--ranks", "1-1"});
  ASSERT_EQ(window.status.exitCode, 0) << window.err;
  const Json rows = lastWatchLine(window.out)["ranks"];
  std::set<std::uint32_t> shown;
  for (const auto& r : rows) shown.insert(r["rank"].get<std::uint32_t>());
  std::set<std::uint32_t> expected{1};
  for (const auto& slow : fanned->slowestRanks) {
    if (slow.excess > 0) expected.insert(slow.rank);
  }
  EXPECT_EQ(shown, expected) << rows.dump();
  EXPECT_LT(shown.size(), 4u) << "not every rank's row: " << rows.dump();
  for (const std::string bad : {"2-1", "0-1024", "a-3", "7"}) {
    auto refused = ctl({"watch", "fan", "--fan-in", "--ranks", bad});
    EXPECT_EQ(refused.status.exitCode, 2) << bad << ": " << refused.err;
    EXPECT_NE(refused.err.find("is not FROM-TO, such as 0-63 (at most 1024 ranks)"), std::string::npos) << refused.err;
  }

  // A job without rules is read for its frame only once a client asks: after its end, too late.
  ASSERT_EQ(ctl({"start", "--wait", "--ranks-per-agent", "1,1", "--job-id", "unwatched", "--layers", "16,4", "--dataset",
                 "synthetic:n=256", "--steps", "50"}).status.exitCode, 0);
  const bool aFirst = jobStatusOn(*clients[0], "unwatched")->spec.agents.front().node == a.name();
  auto tooLate = clients[aFirst ? 0 : 1]->frame({"unwatched", 0, 0, 0}, 5s);
  ASSERT_FALSE(tooLate.ok());
  EXPECT_NE(tooLate.error().message.find("ended while no client asked"), std::string::npos) << tooLate.error().message;
}

// A job without rules is read once a client asks, from the start of its agents' streams: its last
// frame holds all of the job, as a client that read every stream from the start sees it.
TEST_F(FanIn, AJobWithoutRulesIsReadFromItsStartOnceAsked) {
  ASSERT_TRUE(paired);
  ASSERT_NO_FATAL_FAILURE(startJob("fan-asked", "2,2", "3000"));
  ASSERT_TRUE(waitUntil(
      [&] {
        const auto status = jobStatusOn(*supervising, "fan-asked");
        return status && status->progress.size() == 2;
      },
      30s));
  auto first = supervising->frame({"fan-asked", 0, 0, 0}, 5s);
  ASSERT_FALSE(first.ok()) << "a frame before the job's streams were read";
  EXPECT_EQ(first.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(first.error().message.find("ask again in a moment"), std::string::npos) << first.error().message;
  const auto frame = lastFrame("fan-asked");
  ASSERT_TRUE(frame.has_value()) << "no ended frame from the supervising agent";
  const auto fanned = kpi::decodeFrame(frame->kpis);
  ASSERT_TRUE(fanned.ok()) << fanned.error().message;
  const kpi::JobKpis full = expectTheStreamsIn(*frame, *fanned, fullStreams());
  EXPECT_EQ(full.totalSamples, 3000u * 4 * 64) << "every step of every rank, from before the first ask";
}

TEST_F(FanIn, AStalledJobsFrameSaysWhatItsAgentsSay) {
  ASSERT_TRUE(paired);
  ASSERT_NO_FATAL_FAILURE(startJob("fan-stall", "1,1", "100000000", {"--stall-after-s", "2"}));
  ASSERT_TRUE(waitUntil([&] { return rankProcess("fan-stall", 1).has_value(); }, 30s));
  ASSERT_TRUE(waitUntil(
      [&] {
        const auto status = jobStatusOn(*clients[1], "fan-stall");
        return status && !status->progress.empty() && status->progress[0].step > 20;
      },
      60s));
  // Without rules the job's streams are read only once a client asks.
  ASSERT_TRUE(waitUntil([&] { return supervising->frame({"fan-stall", 0, 0, 0}, 5s).ok(); }, 30s));

  const pid_t victim = *rankProcess("fan-stall", 1);
  ASSERT_EQ(::kill(victim, SIGSTOP), 0);

  // The stall as a client that asks every agent diagnoses it, and as the frame carries it.
  const auto asAgentsSay = [&]() -> std::optional<Stall> {
    std::vector<JobStatus> statuses;
    for (auto& c : clients) {
      if (auto s = jobStatusOn(*c, "fan-stall")) statuses.push_back(std::move(*s));
    }
    std::vector<const JobStatus*> parts;
    for (const auto& s : statuses) parts.push_back(&s);
    return kpi::jobStall(parts);
  };
  std::optional<Stall> said, framed;
  const bool same = waitUntil(
      [&] {
        said = asAgentsSay();
        auto f = supervising->frame({"fan-stall", 0, 0, 0}, 5s);
        framed = f ? f->stall : std::nullopt;
        // The diagnosis in words says for how long: the two are read up to a poll apart.
        const std::regex number("[0-9]+");
        return said && framed && said->ranks == framed->ranks && said->sinceUnixUs == framed->sinceUnixUs &&
               std::regex_replace(said->message, number, "N") == std::regex_replace(framed->message, number, "N");
      },
      40s);
  ::kill(victim, SIGCONT);
  EXPECT_TRUE(same) << "agents: " << (said ? said->message : "no stall") << "; frame: " << (framed ? framed->message : "no stall");
  ASSERT_TRUE(framed.has_value());
  EXPECT_EQ(framed->ranks, std::vector<std::uint32_t>{1});
  auto f = supervising->frame({"fan-stall", 0, 0, 0}, 5s);
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(std::any_of(f->events.begin(), f->events.end(), [](const StreamMessage& m) {
    return std::get<JobEvent>(m.payload).kind == JobEventKind::kStalled;
  })) << "the stall's event, from the agents' streams";
  EXPECT_EQ(ctl({"stop", "fan-stall"}).status.exitCode, 0);
}

// The app asks for a fanned-in job's frame ten times a second: the supervising agent makes it that
// often between its polls of the job's status (three a second), and a client that names the frame
// it holds gets that one again without its KPIs, until a newer one is made. A job's last frame
// always comes whole.
TEST_F(FanIn, FramesComeTenTimesASecondAndTheOneHeldComesWithoutItsKpis) {
  ASSERT_TRUE(paired);
  ASSERT_NO_FATAL_FAILURE(startJob("fan-often", "1,1", "100000000"));
  const auto ask = [&](std::int64_t held) { return supervising->frame({"fan-often", 0, 16, 0, false, held}, 5s); };
  ASSERT_TRUE(waitUntil([&] { return ask(0).ok(); }, 30s));

  std::set<std::int64_t> moments;
  for (const auto until = std::chrono::steady_clock::now() + 2s; std::chrono::steady_clock::now() < until;) {
    if (auto f = ask(0)) moments.insert(f->timeUnixUs);
    std::this_thread::sleep_for(20ms);
  }
  // A frame a poll made at most 7 in 2 s; ten a second make about 20 (10: room for a loaded machine,
  // with two ranks training flat out beside the agents).
  EXPECT_GE(moments.size(), 10u) << "frames made in 2 s";

  // The frame held, again: without its KPIs. Asked until two answers fall between the same two frames.
  bool again = false;
  for (int i = 0; i < 50 && !again; ++i) {
    const auto whole = ask(0);
    ASSERT_TRUE(whole.ok() && !whole->kpis.empty());
    const auto held = ask(whole->timeUnixUs);
    ASSERT_TRUE(held.ok()) << held.error().message;
    again = held->timeUnixUs == whole->timeUnixUs;
    EXPECT_EQ(held->kpis.empty(), again) << "KPIs come where the frame is another than the one held";
  }
  EXPECT_TRUE(again) << "never the same frame twice in a row";

  EXPECT_EQ(ctl({"stop", "fan-often"}).status.exitCode, 0);
  std::optional<FrameReply> last;
  ASSERT_TRUE(waitUntil(
      [&] {
        auto f = ask(0);
        if (f && f->ended) last = std::move(*f);
        return last.has_value();
      },
      30s));
  const auto lastAgain = ask(last->timeUnixUs);
  ASSERT_TRUE(lastAgain.ok()) << lastAgain.error().message;
  EXPECT_FALSE(lastAgain->kpis.empty()) << "a job's last frame comes whole";
}

}  // namespace
}  // namespace lockstep::test
