// Issue 45 through agents: a --sync parameter-server job of the built-in trainer on two nodes (two
// real agents on loopback, a rank on each; the server is a thread of rank 0's process, or with
// --ps-ranks 2 a part on each). Losing a server's rank fails the job naming it, or restarts it from
// the server's last checkpoint with --max-restarts; a rank that stands still makes its peer wait in its push or pull, and the stall
// names which.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <string>

#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

struct PsAgents : ::testing::Test {
  void SetUp() override {
    ASSERT_TRUE(ctl.pairWith(nodes.a));
    ASSERT_TRUE(ctl.pairWith(nodes.b));
  }
  void TearDown() override {
    for (const auto& id : started) (void)ctl({"stop", id, "--grace-ms", "1000"}, 30s);
  }

  // `lockstepctl start --wait` of a two-rank parameter-server job, a rank on each agent, with
  // `flags` after the common ones; `meanwhile` runs here while it goes. Returns lockstepctl's result.
  ProcessResult run(const std::string& id, const std::vector<std::string>& flags, const std::function<void()>& meanwhile) {
    started.push_back(id);
    const auto args = join({"start", "--wait", "--job-id", id, "--ranks", "2", "--ranks-per-agent", "1,1", "--sync",
                            "parameter-server", "--layers", "32,64,4", "--batch-per-rank", "8"},
                           flags);
    auto going = std::async(std::launch::async, [this, args] { return ctl(args, 150s); });
    meanwhile();
    if (going.wait_for(120s) != std::future_status::ready) (void)ctl({"stop", id, "--grace-ms", "1000"}, 30s);
    return going.get();
  }
  Json status(const std::string& id) const {
    const auto r = ctl({"--json", "status", id}, 30s);
    return r.status.exitCode == 0 ? Json::parse(r.out, nullptr, false) : Json();
  }
  // The node rank `rank` of job `id` runs on, by the agent that started its process ("" when none runs).
  std::string nodeOfRank(const std::string& id, std::uint32_t rank) const {
    if (rankProcess(id, rank, nodes.a.stateDir())) return nodes.a.name();
    if (rankProcess(id, rank, nodes.b.stateDir())) return nodes.b.name();
    return "";
  }
  // Once the server has checkpointed step `step`, SIGKILLs rank `rank`'s process (which holds the
  // server, or a part of it); returns its node.
  std::string killServerAfter(const std::string& id, const std::string& checkpoints, std::uint64_t step,
                              std::uint32_t rank = 0) const {
    if (!waitUntil([&] { return hasCheckpointFrom(checkpoints, step); }, 90s)) return "";
    const std::string node = nodeOfRank(id, rank);
    const auto victim = rankProcess(id, rank);
    if (!victim || node.empty()) return "";
    ::kill(*victim, SIGKILL);
    return node;
  }

  TempDir dir;
  TwoNodes nodes{dir, {}, 0};
  Ctl ctl{dir, dir.file("config")};
  std::vector<std::string> started;
};

std::string allMessages(const std::vector<JobEvent>& events) {
  std::string out;
  for (const auto& e : events) out += std::string(jobEventKindName(e.kind)) + ": " + e.message + "\n";
  return out;
}

TEST_F(PsAgents, AKilledServerRankFailsTheJobNamingIt) {
  const std::string ckpt = dir.file("ckpt");
  std::string node;
  const auto done = run("ps-lost", {"--steps", "10000000", "--checkpoint-dir", ckpt, "--checkpoint-every", "100"},
                        [&] { node = killServerAfter("ps-lost", ckpt, 200); });
  ASSERT_FALSE(node.empty()) << "rank 0 never checkpointed step 200, or was not found: " << done.out << done.err;
  EXPECT_EQ(done.status.exitCode, 5) << done.out << done.err;
  EXPECT_TRUE(waitUntil([] { return processesOfJob("ps-lost").empty(); }, 30s)) << "the other rank is not left waiting";
  // "job ps-lost: failed: rank 0 exited with signal 9 (Killed), in pull #408 of step 204; rank 1
  // exited with exit code 3, in push #407 of step 204": the server's rank first, where it was; its
  // peer saw the server go (exit 3: a peer was lost) instead of waiting in its pull.
  EXPECT_NE(done.out.find("job ps-lost: failed: rank 0 exited with signal 9"), std::string::npos) << done.out;
  EXPECT_EQ(done.out.find("restart 1"), std::string::npos) << "no restarts were allowed: " << done.out;
  const Json s = status("ps-lost");
  EXPECT_EQ(s.value("state", ""), "failed") << s.dump(2);
  EXPECT_EQ(rankOf(s, 0)["node"], node) << s.dump(2);
  EXPECT_EQ(rankOf(s, 0)["signal"], SIGKILL) << s.dump(2);

  const auto all = ctl.events("ps-lost");
  const auto exited = std::find_if(all.begin(), all.end(), [](const JobEvent& e) {
    return e.kind == JobEventKind::kRankExited && e.rank == 0u && e.signal == SIGKILL;
  });
  EXPECT_NE(exited, all.end()) << allMessages(all);
  const auto failed = std::find_if(all.begin(), all.end(), [](const JobEvent& e) { return e.kind == JobEventKind::kFailed; });
  ASSERT_NE(failed, all.end()) << allMessages(all);
  EXPECT_NE(failed->message.find("rank 0"), std::string::npos) << allMessages(all);
}

// --ps-ranks 2: a part of the server on each node. Part 0 writes the checkpoints with part 1's range
// sent across; losing part 1's rank fails the job naming it, and rank 0 does not wait for it.
TEST_F(PsAgents, SplitOverBothNodesALostPartsRankFailsTheJobNamingIt) {
  const std::string ckpt = dir.file("ckpt");
  std::string node;
  const auto done = run("ps-split", {"--ps-ranks", "2", "--steps", "10000000", "--checkpoint-dir", ckpt,
                                     "--checkpoint-every", "100"},
                        [&] { node = killServerAfter("ps-split", ckpt, 200, 1); });
  ASSERT_FALSE(node.empty()) << "the split server never checkpointed step 200: " << done.out << done.err;
  EXPECT_EQ(done.status.exitCode, 5) << done.out << done.err;
  EXPECT_TRUE(waitUntil([] { return processesOfJob("ps-split").empty(); }, 30s)) << "rank 0 is not left waiting";
  // The failed part's words first; rank 0's part, stopped because of it, only says that after.
  EXPECT_NE(done.out.find("job ps-split: failed: rank 1 exited with signal 9"), std::string::npos) << done.out;
  const Json s = status("ps-split");
  EXPECT_EQ(rankOf(s, 1)["node"], node) << s.dump(2);
}

TEST_F(PsAgents, WithMaxRestartsALostServerRankRestartsFromItsLastCheckpointAndFinishes) {
  const std::string ckpt = dir.file("ckpt");
  std::string node;
  const auto done = run("ps-restart",
                        {"--steps", "3000", "--checkpoint-dir", ckpt, "--checkpoint-every", "100", "--max-restarts", "1"},
                        [&] { node = killServerAfter("ps-restart", ckpt, 200); });
  ASSERT_FALSE(node.empty()) << "rank 0 never checkpointed step 200, or was not found: " << done.out << done.err;
  EXPECT_EQ(done.status.exitCode, 0) << done.out << done.err;
  EXPECT_NE(done.out.find("rank 0 on " + node + " killed by signal 9"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("restart 1 of 1"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("from the last checkpoint"), std::string::npos) << done.out;
  // The job is the newest attempt's: finished, though the part the restart left behind failed.
  EXPECT_NE(done.out.find("job ps-restart: finished"), std::string::npos) << done.out;
  EXPECT_EQ(status("ps-restart").value("state", ""), "finished") << status("ps-restart").dump(2);

  const auto all = ctl.events("ps-restart");
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const JobEvent& e) {
    return e.kind == JobEventKind::kStarted && e.message.find("rank 0") != std::string::npos;
  })) << "the restart says why: " << allMessages(all);
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const JobEvent& e) { return e.kind == JobEventKind::kFinished; }))
      << allMessages(all);

  // The second attempt resumed at one of the server's checkpoints (not from step 0) and ran to the
  // end; its steps, like the first's, pushed and pulled (what the timeline and the KPIs read).
  const auto steps = ctl.steps("ps-restart");
  std::uint64_t firstResumed = ~0ull, last = 0;
  bool pushed = false, pulled = false;
  for (const auto& r : steps) {
    for (const auto& c : r.collectives) {
      pushed = pushed || (c.kind == CollectiveKind::kPush && c.count > 0);
      pulled = pulled || (c.kind == CollectiveKind::kPull && c.count > 0);
    }
    if (r.attempt != 1) continue;
    firstResumed = std::min(firstResumed, r.step);
    last = std::max(last, r.step);
  }
  ASSERT_NE(firstResumed, ~0ull) << "no step of attempt 1 in the history";
  EXPECT_GE(firstResumed - 1, 200u);
  EXPECT_EQ((firstResumed - 1) % 100, 0u) << "resumed at a checkpoint: " << firstResumed;
  EXPECT_EQ(last, 3000u);
  EXPECT_TRUE(pushed && pulled) << "step reports carry push and pull";
}

TEST_F(PsAgents, ARankStoppedBySigstopLeavesItsPeerWaitingInAPushOrPullAndTheStallSaysWhich) {
  Json stalled, waiting;
  std::vector<std::uint32_t> behind;
  const auto done = run("ps-stall", {"--steps", "10000000", "--stall-after-s", "2"}, [&] {
    pid_t pid = 0;
    ASSERT_TRUE(waitUntil([&] {
      // A status taken while the rank starts may lack its figures yet (null): not there yet, not a failure.
      const Json r = rankOf(status("ps-stall"), 1);
      if (!r.is_object() || !r.value("pid", Json()).is_number() || !r.contains("progress")) return false;
      const Json step = r["progress"].value("step", Json());
      if (!step.is_number() || step.get<int>() < 20) return false;
      pid = r["pid"].get<pid_t>();
      return true;
    }, 60s)) << status("ps-stall").dump(2);
    ASSERT_EQ(::kill(pid, SIGSTOP), 0);
    waitUntil([&] {
      const Json s = status("ps-stall");
      if (s.is_object() && s.contains("stall")) stalled = s;
      return stalled.is_object();
    }, 30s);
    // Each agent judges its own rank: let rank 0's (the waiting rank's) pass its allowance too.
    waitUntil([&] {
      const Json r = rankOf(status("ps-stall"), 0);
      if (!r.is_object() || !r.contains("progress")) return false;
      const Json still = r["progress"].value("still_ms", Json()), allowance = r["progress"].value("allowance_ms", Json());
      return still.is_number() && allowance.is_number() && still.get<std::int64_t>() > allowance.get<std::int64_t>() + 3000;
    }, 30s);
    ::kill(pid, SIGCONT);
    (void)ctl({"stop", "ps-stall", "--grace-ms", "1000"}, 30s);
  });
  EXPECT_EQ(done.status.exitCode, 6) << "stopped by a user: " << done.out << done.err;
  ASSERT_TRUE(stalled.is_object()) << "no stall within 30 s of SIGSTOP: " << status("ps-stall").dump(2);

  // The whole job's view (both agents' parts): rank 1 is behind, rank 0 waits for the server, in
  // its push or its pull (where rank 1 stopped decides which: a push waits while the server cannot
  // take it).
  EXPECT_EQ(stalled["stall"]["ranks"], Json::array({1})) << stalled.dump(2);
  const Json zero = rankOf(stalled, 0);
  ASSERT_TRUE(zero.is_object() && zero.contains("progress")) << stalled.dump(2);
  EXPECT_EQ(zero["progress"]["in_collective"], true) << stalled.dump(2);
  const std::string where = zero["progress"]["where"];
  const std::string phase = where.substr(0, where.find(" #"));
  EXPECT_TRUE(phase == "push" || phase == "pull") << where;
  const std::string message = stalled["stall"]["message"];
  EXPECT_NE(message.find("rank 1 did not reach " + phase + " #"), std::string::npos) << message;
  EXPECT_NE(message.find("which rank 0 waits in"), std::string::npos) << message;
  EXPECT_EQ(rankOf(stalled, 1)["progress"]["process_state"], "stopped by a signal") << stalled.dump(2);

  // Rank 0's agent sees only its own rank, waiting: its stall event names the phase it waits in.
  const auto all = ctl.events("ps-stall");
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](const JobEvent& e) {
    return e.kind == JobEventKind::kStalled && e.message.find("every rank here waits in " + phase + " #") != std::string::npos;
  })) << phase << "\n" << allMessages(all);
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const JobEvent& e) {
    return e.kind == JobEventKind::kStalled && e.rank == 1u && e.message.find("rank 1") != std::string::npos;
  })) << "rank 1's agent names it: " << allMessages(all);
}

// Which kind fits: the same workload run through the agents as all-reduce, with the optimizer
// sharded, and with the parameter server split over both nodes; `lockstepctl compare` of the three
// from the history says which to use and what each trades.
TEST_F(PsAgents, CompareOfOneWorkloadUnderThreeKindsRecommendsOneAndSaysWhy) {
  const std::vector<std::string> workload = {"--ranks", "2", "--ranks-per-agent", "1,1", "--layers", "32,64,4",
                                             "--batch-per-rank", "8", "--steps", "300", "--optimizer", "adamw"};
  const std::vector<std::pair<std::string, std::vector<std::string>>> kinds = {
      {"kind-allreduce", {}}, {"kind-sharded", {"--shard", "optimizer"}},
      {"kind-split", {"--sync", "parameter-server", "--ps-ranks", "2"}}};
  for (const auto& [id, flags] : kinds) {
    started.push_back(id);
    const auto done = ctl(join(join({"start", "--wait", "--job-id", id}, workload), flags), 150s);
    ASSERT_EQ(done.status.exitCode, 0) << id << ": " << done.out << done.err;
  }
  const auto text = ctl({"compare", "kind-allreduce", "kind-sharded", "kind-split"}, 30s);
  ASSERT_EQ(text.status.exitCode, 0) << text.err;
  EXPECT_NE(text.out.find("Recommended: "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("all-reduce, sharded"), std::string::npos) << "the kinds are named: " << text.out;
  EXPECT_NE(text.out.find("parameter server split over 2 ranks"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("less optimizer state per rank"), std::string::npos) << "the sharded run's trade: " << text.out;
  const auto compared = ctl({"compare", "kind-allreduce", "kind-sharded", "kind-split", "--json"}, 30s);
  ASSERT_EQ(compared.status.exitCode, 0) << compared.err;
  const Json c = Json::parse(compared.out, nullptr, false);
  ASSERT_TRUE(c.is_object() && c.contains("advice")) << compared.out;
  EXPECT_FALSE(c["advice"].empty()) << compared.out;
}

}  // namespace
}  // namespace lockstep::test
