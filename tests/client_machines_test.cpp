// Issue 15: the launcher and the supervisor as plain state machines, the one implementation that
// lockstepctl and the app both drive. Events and a fake clock in, actions out.

#include <gtest/gtest.h>

#include <csignal>

#include "lockstep/client/elastic.h"
#include "lockstep/client/frames.h"
#include "lockstep/client/launcher.h"
#include "lockstep/client/supervisor.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using Kind = Supervisor::Action::Kind;

JobSpec placedOn(const std::vector<std::string>& nodes, std::uint32_t maxRestarts = 0) {
  JobSpec spec;
  spec.jobId = "j";
  spec.layers = {8, 2};
  spec.batchPerRank = 32;
  spec.steps = 100;
  spec.maxRestarts = maxRestarts;
  spec.worldSize = static_cast<std::uint32_t>(nodes.size() * 2);
  for (std::uint32_t r = 0; r < spec.worldSize; ++r) spec.ranks.push_back({r, nodes[r / 2], r % 2, std::nullopt});
  spec.rendezvousHost = "10.0.0.1";
  return spec;
}

TEST(Launcher, RankZerosNodeFirstThenTheOthersWithItsStore) {
  Launcher l(placedOn({"a", "b", "c"}));
  auto first = l.next();
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].node, "a");
  EXPECT_TRUE(first[0].storeSecret.empty());
  EXPECT_TRUE(l.next().empty()) << "the others wait for rank 0's store";
  l.started("a", StartJobReply{"j", 5123, "secret"});
  auto rest = l.next();
  ASSERT_EQ(rest.size(), 2u);
  for (const auto& s : rest) {
    EXPECT_EQ(s.spec.rendezvousPort, 5123u);
    EXPECT_EQ(s.storeSecret, "secret");
  }
  EXPECT_FALSE(l.finished());
  l.started("b", {});
  l.started("c", {});
  EXPECT_TRUE(l.ok());
  EXPECT_TRUE(l.toStop().empty());
  EXPECT_TRUE(l.next().empty());
}

TEST(Launcher, AFailedPartStopsTheStartedOnesAndOneThatDidNotAnswer) {
  Launcher l(placedOn({"a", "b", "c"}));
  l.next();
  l.started("a", StartJobReply{"j", 5123, "s"});
  l.next();
  l.failed("b", Error{ErrorCode::kTimeout, "no answer in 10 s"});
  EXPECT_FALSE(l.finished()) << "c's answer is still awaited";
  l.started("c", {});
  ASSERT_TRUE(l.finished());
  EXPECT_FALSE(l.ok());
  EXPECT_NE(l.error()->message.find("starting job j on b; stopping the parts already started"), std::string::npos)
      << l.error()->message;
  auto stop = l.toStop();
  std::sort(stop.begin(), stop.end());
  EXPECT_EQ(stop, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(l.toStop().empty()) << "handed out once";
}

TEST(Launcher, ARefusedFirstPartStartsNothing) {
  Launcher l(placedOn({"a", "b"}));
  l.next();
  l.failed("a", invalidArgument("bad spec"));
  EXPECT_TRUE(l.finished());
  EXPECT_TRUE(l.toStop().empty());
  EXPECT_TRUE(l.next().empty());
}

EndedPart part(const std::string& node, JobState state, std::vector<RankStatus> ranks = {}) {
  return {node, node + ":7700", std::move(ranks), false, state};
}
RankStatus rank(std::uint32_t r, JobState state, std::optional<int> code, std::optional<int> signal = {}) {
  RankStatus s;
  s.rank = r;
  s.state = state;
  s.exitCode = code;
  s.signal = signal;
  return s;
}

TEST(Supervisor, AFailedJobWithoutRestartsIsStoppedAtOnceAndEndsFailed) {
  const auto t0 = Supervisor::Clock::time_point{};
  Supervisor s(placedOn({"a", "b"}));
  EXPECT_EQ(s.observe({part("a", JobState::kRunning), part("b", JobState::kRunning)}, t0).kind, Kind::kWait);
  const auto failing = std::vector<EndedPart>{part("a", JobState::kFailed, {rank(0, JobState::kFailed, 1)}),
                                              part("b", JobState::kRunning)};
  EXPECT_EQ(s.observe(failing, t0 + 1s).kind, Kind::kStop);
  EXPECT_EQ(s.observe(failing, t0 + 2s).kind, Kind::kWait) << "one stop per attempt";
  const auto ended = s.observe({failing[0], part("b", JobState::kStopped, {rank(2, JobState::kStopped, 143)})}, t0 + 3s);
  ASSERT_EQ(ended.kind, Kind::kEnd);
  EXPECT_EQ(ended.state, JobState::kFailed);
  EXPECT_NE(ended.message.find("rank 0 on a exited with code 1"), std::string::npos) << ended.message;
}

TEST(Supervisor, AJobARuleStoppedEndsStoppedAndIsNotRestartedWhenARankFailsAsItsPeersGo) {
  const auto t0 = Supervisor::Clock::time_point{};
  Supervisor s(placedOn({"a", "b"}, 2));  // it may restart twice
  EXPECT_EQ(s.observe({part("a", JobState::kRunning), part("b", JobState::kRunning)}, t0).kind, Kind::kWait);
  s.stopAsked("alert rule 'cost >= 40 -> notify,checkpoint,stop' fired");
  const auto going = std::vector<EndedPart>{part("a", JobState::kStopped, {rank(0, JobState::kStopped, 143)}),
                                            part("b", JobState::kFailed, {rank(1, JobState::kFailed, 1)})};
  EXPECT_EQ(s.observe({going[0], part("b", JobState::kRunning)}, t0 + 1s).kind, Kind::kWait) << "no second stop";
  const auto ended = s.observe(going, t0 + 20s);
  ASSERT_EQ(ended.kind, Kind::kEnd) << "not a restart: " << ended.message;
  EXPECT_EQ(ended.state, JobState::kStopped);
  EXPECT_NE(ended.message.find("cost >= 40"), std::string::npos) << ended.message;
}

// A user's stop that comes while the job is to restart (the restart's agents refuse it): the job ends
// stopped, as asked, not failed because its restart did not start.
TEST(Supervisor, AStopAskedWhileTheJobIsToRestartEndsItStopped) {
  const auto t0 = Supervisor::Clock::time_point{};
  Supervisor s(placedOn({"a", "b"}, 2));
  const auto lost = std::vector<EndedPart>{part("a", JobState::kStopped, {rank(0, JobState::kStopped, 143)}),
                                           part("b", JobState::kFailed, {rank(2, JobState::kFailed, 1)})};
  ASSERT_EQ(s.observe(lost, t0).kind, Kind::kRestart);
  s.stopAsked("stopped on request");
  const auto ended = s.restartFailed("job j was stopped by a user on a: it is not restarted");
  ASSERT_EQ(ended.kind, Kind::kEnd);
  EXPECT_EQ(ended.state, JobState::kStopped);
  EXPECT_EQ(ended.message, "stopped on request");
  EXPECT_EQ(s.attempts().back(), "not restarted: stopped on request");
}

TEST(Supervisor, ALostRankIsRestartedAfterTheGraceWithTheRanksLeftUntilNoRestartsRemain) {
  const auto t0 = Supervisor::Clock::time_point{};
  JobSpec spec = placedOn({"a", "b"}, 1);
  spec.batchPerRank = 48;  // a global batch of 192, which 3 ranks can share
  Supervisor s(spec);
  const auto failing = std::vector<EndedPart>{
      part("a", JobState::kFailed, {rank(0, JobState::kFailed, {}, SIGKILL), rank(1, JobState::kFailed, 3)}),
      part("b", JobState::kRunning)};
  EXPECT_EQ(s.observe(failing, t0).kind, Kind::kWait);
  EXPECT_EQ(s.observe(failing, t0 + 9s).kind, Kind::kWait) << "the ranks left get 10 s to end by themselves";
  EXPECT_EQ(s.observe(failing, t0 + 10s).kind, Kind::kStop);
  const auto restart = s.observe(
      {failing[0], part("b", JobState::kFailed, {rank(2, JobState::kFailed, 3), rank(3, JobState::kFailed, 3)})}, t0 + 11s);
  ASSERT_EQ(restart.kind, Kind::kRestart) << restart.message;
  EXPECT_EQ(restart.plan.next.attempt, 1u);
  EXPECT_EQ(restart.plan.next.batchPerRank, 64u) << "the global batch kept";
  EXPECT_EQ(restart.plan.ranksPerNode,
            (std::vector<std::pair<std::string, std::uint32_t>>{{"a", 1}, {"b", 2}}));
  EXPECT_NE(restart.message.find("rank 0 on a killed by signal 9"), std::string::npos) << restart.message;
  EXPECT_EQ(s.observe(failing, t0 + 12s).kind, Kind::kWait) << "nothing while the restart is launched";

  JobSpec next = restart.plan.next;
  next.worldSize = 3;
  s.restarted(next);
  const auto ofAttempt1 = [](EndedPart p) {
    p.attempt = 1;
    return p;
  };
  EXPECT_EQ(s.observe({ofAttempt1(part("a", JobState::kRunning)), ofAttempt1(part("b", JobState::kRunning))}, t0 + 20s).kind,
            Kind::kWait);
  const auto last = s.observe({ofAttempt1(part("a", JobState::kFailed, {rank(0, JobState::kFailed, 1)})),
                               ofAttempt1(part("b", JobState::kStopped, {rank(1, JobState::kStopped, 143)}))},
                              t0 + 30s);
  ASSERT_EQ(last.kind, Kind::kEnd);
  EXPECT_NE(last.message.find("no restarts left (1 allowed)"), std::string::npos) << last.message;
  ASSERT_EQ(s.attempts().size(), 3u);
  EXPECT_EQ(s.attempts()[2], "not restarted: no restarts left (1 allowed)");
}

// Trainer ranks stopped at a vote no agent was asked for (SIGTERM from outside): a job that may
// restart does; once it may not, it ends stopped, as a job without restarts does, not failed.
TEST(Supervisor, AJobStoppedFromOutsideWithNoRestartsLeftEndsStopped) {
  const auto t0 = Supervisor::Clock::time_point{};
  Supervisor s(placedOn({"a", "b"}, 1));
  const auto stopped = [](std::uint32_t attempt) {
    std::vector<EndedPart> parts{part("a", JobState::kStopped, {rank(0, JobState::kStopped, 143)}),
                                 part("b", JobState::kStopped, {rank(2, JobState::kStopped, 143)})};
    for (auto& p : parts) p.attempt = attempt;
    return parts;
  };
  const auto restart = s.observe(stopped(0), t0);
  ASSERT_EQ(restart.kind, Kind::kRestart) << restart.message;
  JobSpec next = restart.plan.next;
  s.restarted(next);
  const auto ended = s.observe(stopped(next.attempt), t0 + 10s);
  ASSERT_EQ(ended.kind, Kind::kEnd);
  EXPECT_EQ(ended.state, JobState::kStopped) << ended.message;
  EXPECT_NE(ended.message.find("not restarted: no restarts left (1 allowed)"), std::string::npos) << ended.message;
}

TEST(Supervisor, ALostNodeIsNotWaitedForAndItsRanksAreLeftOut) {
  const auto t0 = Supervisor::Clock::time_point{};
  Supervisor s(placedOn({"a", "b"}, 2));
  EndedPart lost{"b", "b:7700", {}, true, JobState::kRunning};
  EXPECT_EQ(s.observe({part("a", JobState::kRunning), lost}, t0).kind, Kind::kWait) << "a lost agent alone is no failure";
  const auto restart =
      s.observe({part("a", JobState::kFailed, {rank(0, JobState::kFailed, 3), rank(1, JobState::kFailed, 3)}), lost}, t0 + 1s);
  ASSERT_EQ(restart.kind, Kind::kRestart) << restart.message;
  EXPECT_EQ(restart.plan.ranksPerNode, (std::vector<std::pair<std::string, std::uint32_t>>{{"a", 2}}));
  EXPECT_NE(restart.message.find("node b (agent b:7700) stopped answering"), std::string::npos) << restart.message;
  const auto failed = s.restartFailed("agent a refused: no free GPUs");
  EXPECT_EQ(failed.kind, Kind::kEnd);
  EXPECT_EQ(failed.state, JobState::kFailed);
}

// Found in review: with every agent lost nothing said the job ended, and it was followed forever.
TEST(Supervisor, EveryAgentLostEndsTheJobFailed) {
  const auto t0 = Supervisor::Clock::time_point{};
  Supervisor s(placedOn({"a", "b"}));
  const auto end = s.observe({EndedPart{"a", "a:7700", {}, true}, EndedPart{"b", "b:7700", {}, true}}, t0);
  ASSERT_EQ(end.kind, Kind::kEnd);
  EXPECT_EQ(end.state, JobState::kFailed);
  EXPECT_NE(end.message.find("node a (agent a:7700) stopped answering"), std::string::npos) << end.message;
}

// Found in review: a node the restart left out still reports the earlier attempt as failed; it
// made the new attempt look failed, which was stopped 10 s later.
TEST(Supervisor, AnEarlierAttemptsPartIsHistory) {
  const auto t0 = Supervisor::Clock::time_point{};
  JobSpec next = placedOn({"a"}, 2);
  next.attempt = 1;
  Supervisor s(next);
  EndedPart stale = part("b", JobState::kFailed, {rank(2, JobState::kFailed, {}, SIGKILL)});
  stale.attempt = 0;
  EndedPart current = part("a", JobState::kRunning);
  current.attempt = 1;
  EXPECT_EQ(s.observe({current, stale}, t0).kind, Kind::kWait);
  EXPECT_EQ(s.observe({current, stale}, t0 + 30s).kind, Kind::kWait) << "the running attempt was stopped";
  current.state = JobState::kFinished;
  EXPECT_EQ(s.observe({current, stale}, t0 + 40s).state, JobState::kFinished);
}

TEST(Supervisor, AFinishedJobEndsAndAnInterruptStopsARunningOne) {
  Supervisor done(placedOn({"a"}));
  const auto end = done.observe({part("a", JobState::kFinished)}, {});
  EXPECT_EQ(end.kind, Kind::kEnd);
  EXPECT_EQ(end.state, JobState::kFinished);
  Supervisor running(placedOn({"a"}));
  EXPECT_EQ(running.interrupt({part("a", JobState::kRunning)}).kind, Kind::kStop);
  EXPECT_EQ(running.interrupt({part("a", JobState::kStopped)}).kind, Kind::kEnd);
}

// What a supervising agent may start on another node: a restart of the same job, no other program.
TEST(Elastic, ARestartDiffersOnlyInWhatARestartChanges) {
  const JobSpec ended = placedOn({"a", "b"}, 2);
  const std::vector<RankStatus> survived = {{0, 0, std::nullopt, 10, JobState::kFailed, 3, std::nullopt, false},
                                            {1, 1, std::nullopt, 11, JobState::kFailed, 3, std::nullopt, false}};
  RestartPlan plan = planRestart(ended, {{"a", "10.0.0.1:7700", survived, false, JobState::kFailed, 0},
                                         {"b", "10.0.0.2:7700", {}, true}});
  ASSERT_TRUE(plan.refusal.empty()) << plan.refusal;
  JobSpec next = plan.next;
  next.ranks = {{0, "a", 0, std::nullopt}, {1, "a", 1, std::nullopt}};
  next.worldSize = 2;
  next.rendezvousPort = 29500;
  EXPECT_TRUE(isRestartOf(next, ended));
  EXPECT_FALSE(isRestartOf(ended, ended)) << "the same attempt is no restart";
  JobSpec skipped = next;
  skipped.attempt = 2;
  EXPECT_FALSE(isRestartOf(skipped, ended)) << "an attempt skipped";
  JobSpec last = ended;
  last.attempt = 2;  // of 2 allowed
  JobSpec beyond = next;
  beyond.attempt = 3;
  EXPECT_FALSE(isRestartOf(beyond, last)) << "past max_restarts";
  JobSpec more = next;
  more.ranks.push_back({2, "a", 2, std::nullopt});
  more.worldSize = 3;
  EXPECT_FALSE(isRestartOf(more, ended)) << "more ranks on a node than the job had there";
  JobSpec none = next;
  none.ranks.clear();
  EXPECT_FALSE(isRestartOf(none, ended)) << "no placements: every rank on the receiving node";
  JobSpec elsewhere = next;
  elsewhere.rendezvousHost = "attacker.example.org";
  EXPECT_FALSE(isRestartOf(elsewhere, ended)) << "a rendezvous off the job's nodes";
  JobSpec gpuJob = ended;
  gpuJob.backend = Backend::kCuda;
  for (auto& r : gpuJob.ranks) r.gpuIndex = r.localRank;
  JobSpec otherGpu = next;
  otherGpu.backend = Backend::kCuda;
  otherGpu.ranks = {{0, "a", 0, 0u}, {1, "a", 1, 7u}};
  EXPECT_FALSE(isRestartOf(otherGpu, gpuJob)) << "a GPU the job did not have";
  otherGpu.ranks[1].gpuIndex = 1u;
  EXPECT_TRUE(isRestartOf(otherGpu, gpuJob));
  JobSpec otherSteps = next;
  otherSteps.steps = 1000000;
  EXPECT_FALSE(isRestartOf(otherSteps, ended));
  JobSpec otherProgram = next;
  otherProgram.command = CommandSpec{{"/bin/sh", "-c", "id"}, "/", {}};
  EXPECT_FALSE(isRestartOf(otherProgram, ended));
  JobSpec otherSupervisor = next;
  otherSupervisor.agents = {{"a", "10.0.0.9:7700", std::string(40, 'x')}};
  EXPECT_FALSE(isRestartOf(otherSupervisor, ended));
}

}  // namespace
}  // namespace lockstep

// Issue 46 §1: following a job's frames, a client asks for the events after the last that came,
// at most kMaxFrameEvents at a time, until it has them all; numbers that fall start it again.
namespace lockstep {
namespace {
FrameReply frameOf(std::uint64_t first, std::uint64_t last, std::uint64_t lastEvent) {
  FrameReply f;
  f.jobId = "big";
  f.lastEvent = lastEvent;
  for (std::uint64_t seq = first; seq != 0 && seq <= last; ++seq) f.events.push_back({seq, "node-a", JobEvent{}});
  return f;
}
}  // namespace

TEST(FrameCursor, AsksForTheEventsAfterTheLastThatCameUntilItHasThemAll) {
  FrameCursor cursor;
  // 300 events held, 256 sent: the rest come with the next frame, not skipped.
  ASSERT_TRUE(cursor.take(frameOf(1, kMaxFrameEvents, 300)));
  EXPECT_EQ(cursor.eventsAfter, kMaxFrameEvents);
  EXPECT_FALSE(cursor.complete(frameOf(1, kMaxFrameEvents, 300)));
  ASSERT_TRUE(cursor.take(frameOf(257, 300, 300)));
  EXPECT_EQ(cursor.eventsAfter, 300u);
  EXPECT_TRUE(cursor.complete(frameOf(257, 300, 300)));
  // Nothing new: it stays.
  ASSERT_TRUE(cursor.take(frameOf(0, 0, 300)));
  EXPECT_EQ(cursor.eventsAfter, 300u);
  // Another agent took the job over and numbers its events from 1: read them from the first again.
  EXPECT_FALSE(cursor.take(frameOf(0, 0, 12)));
  EXPECT_EQ(cursor.eventsAfter, 0u);
  ASSERT_TRUE(cursor.take(frameOf(1, 12, 12)));
  EXPECT_TRUE(cursor.complete(frameOf(1, 12, 12)));
}

}  // namespace lockstep
