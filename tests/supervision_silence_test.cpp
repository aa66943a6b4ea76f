// Issue 46 §1: a supervising agent whose job's agents fall silent (a rack lost at once). Its polls
// wait for the silent agents together, so the job's nodes are lost in about three polls' timeouts
// whatever their number. Before, each poll connected to each silent agent anew, one after another
// with a 5 s hello each: six silent nodes held every poll 30 s, and the job was known lost after
// more than a minute. And a read of the job's streams (ten a second while a client asks for its
// frame) that a node leaves unanswered counts as that node's miss, as a status poll's does: else
// the read's 5 s and the next poll's 5 s are two waits for one miss.
//
// The job's agents are stand-ins in this process (real CURVE sockets on loopback) that answer the
// hello, the job's status and its stream (empty) until told to fall silent; the supervision is the
// agent's own.

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "alerts/alert_desk.h"
#include "base/log.h"
#include "jobs/supervision.h"
#include "lockstep/common/clock.h"
#include "lockstep/kpi/frame.h"
#include "lockstep/net/zmq_util.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/job_list.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string nodeName(std::size_t n) { return "n" + std::to_string(n); }

// `nodes` agents, each running one rank of `spec`'s job, served by one thread.
class StandIns {
 public:
  StandIns(std::size_t nodes, const CurveKeyPair& keys, JobSpec& spec) : zap_(context_), asked_(nodes), fetched_(nodes) {
    for (std::size_t n = 0; n < nodes; ++n) {
      auto& s = sockets_.emplace_back(context_, zmq::socket_type::router);
      if (auto made = makeCurveServer(s, keys); !made) throw std::runtime_error(made.error().message);
      s.set(zmq::sockopt::linger, 0);
      s.bind("tcp://127.0.0.1:*");
      const std::string endpoint = s.get(zmq::sockopt::last_endpoint);
      spec.agents.push_back({nodeName(n), endpoint.substr(endpoint.find("//") + 2), keys.publicKey});
      spec.ranks.push_back({static_cast<std::uint32_t>(n), nodeName(n), 0, std::nullopt});
    }
    jobId_ = spec.jobId;
    serving_ = std::thread([this] { serve(); });
  }
  ~StandIns() {
    stop_ = true;
    serving_.join();
  }

  // Every node stops answering from the next read of the streams on (node 0's fetch, asked first).
  void fallSilent() { armed_ = true; }
  void fallSilent(std::size_t node) { silentNode_ = node; }
  std::optional<Clock::time_point> silentSince() const {
    return silent_ ? std::optional<Clock::time_point>(silentAt_.load()) : std::nullopt;
  }
  // How many times each node's agent has been asked for the job's status, and for its stream.
  std::size_t leastAsked() const { return least(asked_); }
  std::size_t leastFetched() const { return least(fetched_); }

 private:
  static std::size_t least(const std::vector<std::atomic<std::size_t>>& counts) {
    std::size_t least = SIZE_MAX;
    for (const auto& c : counts) least = std::min<std::size_t>(least, c);
    return least;
  }

  void serve() {
    std::vector<zmq::pollitem_t> items;
    for (auto& s : sockets_) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({zap_.socket().handle(), 0, ZMQ_POLLIN, 0});
    while (!stop_) {
      zmq::poll(items.data(), items.size(), 50ms);
      if (items.back().revents & ZMQ_POLLIN) zap_.handleOne([](const std::string&) { return true; });
      for (std::size_t n = 0; n < sockets_.size(); ++n) {
        if (items[n].revents & ZMQ_POLLIN) take(n);
      }
    }
  }

  void take(std::size_t n) {
    auto frames = receiveMultipart(sockets_[n], 2);
    if (!frames || frames->size() != 2 || silent_ || silentNode_ == n) return;
    auto request = decodeRequest((*frames)[1].to_string_view());
    if (!request) return;
    if (armed_ && n == 0 && std::holds_alternative<FetchRequest>(request->body)) {
      silent_ = true;
      silentAt_ = Clock::now();
      return;
    }
    const std::string bytes = encode(Reply{request->requestId, answer(n, request->body)});
    sockets_[n].send((*frames)[0], zmq::send_flags::sndmore);
    sockets_[n].send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  }

  decltype(Reply::body) answer(std::size_t n, const decltype(Request::body)& request) {
    if (std::holds_alternative<HelloRequest>(request)) {
      NodeHello h;
      h.agentVersion = "stand-in";
      h.nodeName = nodeName(n);
      h.host = "127.0.0.1";
      h.instanceId = 1;
      h.timeUnixUs = unixMicrosNow();
      return h;
    }
    if (std::holds_alternative<ListJobsRequest>(request)) {
      ++asked_[n];
      JobStatus st;
      st.spec.jobId = jobId_;
      omitSpec(st);  // the supervision names the attempt it holds
      st.state = JobState::kRunning;
      st.ranks.push_back({static_cast<std::uint32_t>(n), 0, std::nullopt, 1000 + static_cast<std::uint32_t>(n),
                          JobState::kRunning, std::nullopt, std::nullopt, false});
      return JobsReply{{std::move(st)}};
    }
    if (const auto* fetch = std::get_if<FetchRequest>(&request)) {
      ++fetched_[n];
      return streamOf(n, fetch->afterSeq);
    }
    return ErrorReply{ErrorCode::kInvalidArgument, "the stand-in answers hello, list jobs and fetch only"};
  }

  // Each node's stream: its rank's first step, and a process sample of it at 40 % of a core, which
  // the job's heatmap shows as the node's block (a job without GPUs).
  FetchReply streamOf(std::size_t n, std::uint64_t afterSeq) const {
    const auto rank = static_cast<std::uint32_t>(n);
    const std::int64_t now = unixMicrosNow();
    StepReport step;
    step.jobId = jobId_;
    step.rank = rank;
    step.worldSize = static_cast<std::uint32_t>(sockets_.size());
    step.step = 1;
    step.samples = 32;
    step.stepTimeUs = 100'000;
    step.timeUnixUs = now;
    const ProcessSample sample{jobId_, rank, 1000 + rank, now, 40.0f, std::nullopt};
    FetchReply reply{1, 1, 2, {}, 1};
    if (afterSeq < 1) reply.messages.push_back({1, nodeName(n), step});
    if (afterSeq < 2) reply.messages.push_back({2, nodeName(n), sample});
    return reply;
  }

  zmq::context_t context_;
  ZapHandler zap_;
  std::deque<zmq::socket_t> sockets_;
  std::vector<std::atomic<std::size_t>> asked_, fetched_;
  std::string jobId_;
  std::atomic<bool> armed_{false}, silent_{false}, stop_{false};
  std::atomic<Clock::time_point> silentAt_{};
  std::atomic<std::size_t> silentNode_{SIZE_MAX};
  std::thread serving_;
};

TEST(SupervisionSilence, AgentsFallingSilentTogetherAreLostTogether) {
  TempDir dir;
  auto keys = generateKeyPair();
  ASSERT_TRUE(keys.ok());
  JobSpec spec = commandJob("rack", 6, {"/bin/true"}, dir.path().string());
  spec.maxRestarts = 0;
  StandIns standIns(6, *keys, spec);

  const std::string logPath = dir.file("agent.log");
  agent::Log log(logPath);
  agent::AlertDesk desk({}, log);
  agent::Supervisions supervisions(nodeName(0), *keys, desk, log);
  supervisions.supervise(spec);
  // A client watches the job's frame all along: its streams are read ten times a second.
  bool framed = false;
  const auto watching = [&](const std::function<bool()>& until, std::chrono::seconds timeout) {
    return waitUntil([&] {
      framed = supervisions.frameOf({"rack", 0, 0, 0}).ok();
      return until();
    }, timeout);
  };
  ASSERT_TRUE(watching([&] { return framed && standIns.leastAsked() >= 2; }, 20s))
      << "no frame, or the supervision never polled every node:\n" << readText(logPath);
  ASSERT_EQ(supervisions.of("rack").state, SupervisionState::kFollowing);

  // Every node falls silent at a read: the job is failed once each is lost, three misses in a row.
  standIns.fallSilent();
  ASSERT_TRUE(watching([&] { return standIns.silentSince().has_value(); }, 5s)) << "no read of the streams";
  ASSERT_TRUE(watching([&] { return supervisions.of("rack").state == SupervisionState::kEnded; }, 90s));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - *standIns.silentSince());
  // Three misses of one 5 s timeout each (the read's, then two polls' hellos, 300 ms or less apart)
  // are about 15.5 s. The read's miss not counted took about 21 s (the poll after it waited 5 s
  // more); one connection at a time, more than a minute.
  EXPECT_LT(took.count(), 19'000) << "6 silent nodes were lost after " << took.count() << " ms";
  EXPECT_EQ(supervisions.of("rack").outcome, JobState::kFailed);

  // Each silent node is said once, not once a poll.
  std::ifstream in(logPath);
  std::stringstream text;
  text << in.rdbuf();
  for (std::size_t n = 0; n < 6; ++n) {
    const std::string said = "cannot reach node " + nodeName(n) + "'s agent";
    const auto first = text.str().find(said);
    EXPECT_NE(first, std::string::npos) << text.str();
    EXPECT_EQ(text.str().find(said, first + 1), std::string::npos) << text.str();
  }
}

// A job with alert rules is read once a poll (about three times a second) for them; ten times a
// second only while a client watches its frame, and again once a poll when none has for 2 s.
TEST(SupervisionSilence, AJobIsReadTenTimesASecondOnlyWhileItsFrameIsWatched) {
  TempDir dir;
  auto keys = generateKeyPair();
  ASSERT_TRUE(keys.ok());
  JobSpec spec = commandJob("ruled", 2, {"/bin/true"}, dir.path().string());
  spec.alertRules = {"exposed_comm > 50% -> notify"};
  StandIns standIns(2, *keys, spec);
  agent::Log log(dir.file("agent.log"));
  agent::AlertDesk desk({}, log);
  agent::Supervisions supervisions(nodeName(0), *keys, desk, log);
  supervisions.supervise(spec);
  ASSERT_TRUE(waitUntil([&] { return standIns.leastFetched() >= 2; }, 20s)) << "its rules' reads never came";

  const auto fetchesIn2s = [&](bool watching) {
    const std::size_t before = standIns.leastFetched();
    for (const auto until = Clock::now() + 2s; Clock::now() < until; std::this_thread::sleep_for(50ms)) {
      if (watching) (void)supervisions.frameOf({"ruled", 0, 0, 0});
    }
    return standIns.leastFetched() - before;
  };
  EXPECT_LE(fetchesIn2s(false), 8u) << "read for its rules alone: a read a poll, about 7 in 2 s";
  EXPECT_GE(fetchesIn2s(true), 12u) << "watched: about 20 in 2 s";
  std::this_thread::sleep_for(2500ms);  // no client asked for 2 s: back to a read a poll
  EXPECT_LE(fetchesIn2s(false), 8u);
}

// The heatmap of a fanned-in job is its nodes' blocks (kpi::nodeBlocks): a node whose agent falls
// silent goes blank once a read finds it so, rather than keep its last reading's colour for good.
TEST(SupervisionSilence, ASilentNodesHeatmapRowGoesBlank) {
  TempDir dir;
  auto keys = generateKeyPair();
  ASSERT_TRUE(keys.ok());
  JobSpec spec = commandJob("blank", 2, {"/bin/true"}, dir.path().string());
  StandIns standIns(2, *keys, spec);
  agent::Log log(dir.file("agent.log"));
  agent::AlertDesk desk({}, log);
  agent::Supervisions supervisions(nodeName(0), *keys, desk, log);
  supervisions.supervise(spec);
  std::vector<kpi::NodeBlock> blocks;
  std::vector<kpi::RankKpis> ranks;
  const auto blocksUntil = [&](const std::function<bool()>& until) {
    return waitUntil([&] {
      auto frame = supervisions.frameOf({"blank", 0, 2, 0, true});
      auto k = frame && !frame->kpis.empty() ? kpi::decodeFrame(frame->kpis) : Result<kpi::JobKpis>(Error{});
      if (k) blocks = k->nodeBlocks, ranks = k->ranks;
      return k && blocks.size() == 2 && ranks.size() == 2 && until();
    }, 30s);
  };
  ASSERT_TRUE(blocksUntil([&] { return blocks[0].leastPct && blocks[1].leastPct; })) << "no block with its reading";
  EXPECT_EQ(*blocks[1].leastPct, 40.0f);
  EXPECT_TRUE(ranks[1].cpuPct.has_value());

  standIns.fallSilent(1);
  ASSERT_TRUE(blocksUntil([&] { return !blocks[1].leastPct; })) << "n1 is silent, and its row keeps its last reading";
  EXPECT_EQ(blocks[1].firstNode, "n1");
  EXPECT_TRUE(blocks[0].leastPct.has_value()) << "n0 answers: its row keeps its colour";
  EXPECT_FALSE(ranks[1].cpuPct.has_value()) << "n1's rank row keeps its last CPU reading";
  EXPECT_TRUE(ranks[0].cpuPct.has_value());
  EXPECT_EQ(ranks[1].step, 1u) << "what its steps said stays";
}

}  // namespace
}  // namespace lockstep::test
