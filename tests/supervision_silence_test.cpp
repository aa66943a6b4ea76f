// Issue 46 §1: a supervising agent whose job's agents fall silent (a rack lost at once). Its polls
// wait for the silent agents together, so the job's nodes are lost in about three polls' timeouts
// whatever their number. Before, each poll connected to each silent agent anew, one after another
// with a 5 s hello each: six silent nodes held every poll 30 s, and the job was known lost after
// more than a minute.
//
// The job's agents are stand-ins in this process (real CURVE sockets on loopback) that answer the
// hello and the job's status until told to fall silent; the supervision is the agent's own.

#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <fstream>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "alerts/alert_desk.h"
#include "base/log.h"
#include "jobs/supervision.h"
#include "lockstep/common/clock.h"
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
  StandIns(std::size_t nodes, const CurveKeyPair& keys, JobSpec& spec) : zap_(context_), asked_(nodes) {
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

  void fallSilent() { silent_ = true; }
  // How many times each node's agent has been asked for the job's status.
  std::size_t leastAsked() const {
    std::size_t least = SIZE_MAX;
    for (const auto& a : asked_) least = std::min<std::size_t>(least, a);
    return least;
  }

 private:
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
    if (!frames || frames->size() != 2 || silent_) return;
    auto request = decodeRequest((*frames)[1].to_string_view());
    if (!request) return;
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
    return ErrorReply{ErrorCode::kInvalidArgument, "the stand-in answers hello and list jobs only"};
  }

  zmq::context_t context_;
  ZapHandler zap_;
  std::deque<zmq::socket_t> sockets_;
  std::vector<std::atomic<std::size_t>> asked_;
  std::string jobId_;
  std::atomic<bool> silent_{false}, stop_{false};
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
  ASSERT_TRUE(waitUntil([&] { return standIns.leastAsked() >= 2; }, 20s)) << "the supervision never polled every node:\n" << readText(logPath);
  ASSERT_EQ(supervisions.of("rack").state, SupervisionState::kFollowing);

  // Every node falls silent: the job is failed once each is lost, three polls in a row unanswered.
  standIns.fallSilent();
  const auto silentAt = Clock::now();
  ASSERT_TRUE(waitUntil([&] { return supervisions.of("rack").state == SupervisionState::kEnded; }, 90s));
  const auto took = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - silentAt);
  // Three polls of one 5 s timeout each (and 300 ms apart) are about 16 s; one connection at a time
  // took 5 s + 2 × 6 × 5 s = 65 s. 40 s leaves a loaded machine room either way.
  EXPECT_LT(took.count(), 40) << "6 silent nodes were lost after " << took.count() << " s";
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

}  // namespace
}  // namespace lockstep::test
