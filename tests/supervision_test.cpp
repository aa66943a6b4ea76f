// Issue 15: supervision on the node side. Rank 0's agent supervises a job (agent/src/jobs/supervision.h):
// it stops a failed job's other parts and restarts it with no client connected, reaching the
// other agents with its node key, which they let list, stop and restart that job and nothing else.

#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <optional>

#include "lockstep/client/launch.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;

JobSpec sleepJob(const TempDir& dir, const std::string& jobId, const std::string& node) {
  JobSpec spec = commandJob(jobId, 1, {"/bin/sleep", "600"}, dir.path().string());
  spec.ranks = {RankPlacement{0, node, 0, std::nullopt}};
  return spec;
}

std::optional<JobStatus> jobOn(AgentClient& client, const std::string& jobId) {
  auto jobs = client.listJobs(5s);
  if (!jobs) return std::nullopt;
  for (const auto& j : jobs->jobs) {
    if (j.spec.jobId == jobId) return j;
  }
  return std::nullopt;
}

bool endedOn(AgentClient& client, const std::string& jobId) {
  return waitUntil([&] {
    auto j = jobOn(client, jobId);
    return j && jobStateEnded(j->state);
  }, 20s);
}

void expectRefused(const Result<void>& r, const std::string& what) {
  ASSERT_FALSE(r.ok()) << what;
  EXPECT_EQ(r.error().code, ErrorCode::kPermissionDenied) << what << ": " << r.error().message;
}

template <typename T>
Result<void> asVoid(const Result<T>& r) {
  if (!r) return r.error();
  return {};
}

// A job of two ranks, rank 0 on node-a (which runs no agent here: its key is `nodeA`, its first
// agent and so its supervisor) and rank 1 on `agent`'s node, node-b; up to 3 restarts.
JobSpec supervisedFromNodeA(const TempDir& dir, const std::string& jobId, const AgentProcess& agent, const ClientKeys& nodeA) {
  JobSpec spec = sleepJob(dir, jobId, "node-b");
  spec.worldSize = 2;
  spec.maxRestarts = 3;
  spec.ranks = {RankPlacement{0, "node-a", 0, std::nullopt}, RankPlacement{1, "node-b", 0, std::nullopt}};
  spec.rendezvousHost = "127.0.0.1";
  spec.rendezvousPort = 1;
  spec.agents = {{"node-a", "127.0.0.1:1", nodeA.keys.publicKey}, {"node-b", agent.address().text(), agent.publicKey()}};
  return spec;
}

TEST(Supervision, ASupervisingAgentsKeyMayOnlyListStopRestartAndReadItsJob) {
  TempDir dir;
  AgentProcess agent(dir, "node-b");
  ClientKeys alice(dir, "alice"), nodeA(dir, "node-a"), stranger(dir, "stranger");
  agent.authorize(alice.keys.publicKey);
  auto user = connectTo(agent, alice);
  // A job whose first agent (its supervisor) is node-a's, and a job of alice's alone.
  const JobSpec spec = supervisedFromNodeA(dir, "delegated", agent, nodeA);
  ASSERT_TRUE(user->startJob(spec, "", 10s).ok());
  ASSERT_TRUE(user->startJob(sleepJob(dir, "alices", "node-b"), "", 10s).ok());

  EXPECT_FALSE(AgentClient::connect(agent.address(), stranger.keys, agent.publicKey(), 2s).ok())
      << "a key that supervises nothing here is a stranger";
  auto supervisor = AgentClient::connect(agent.address(), nodeA.keys, agent.publicKey(), 5s);
  ASSERT_TRUE(supervisor.ok()) << supervisor.error().message;
  auto& s = **supervisor;
  auto listed = s.listJobs(5s);
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  ASSERT_EQ(listed->jobs.size(), 1u) << "it sees only the job it supervises";
  EXPECT_EQ(listed->jobs[0].spec.jobId, "delegated");
  EXPECT_EQ(user->listJobs(5s)->jobs.size(), 2u);

  // It reads the stream of the job it supervises (its alerts are evaluated there), and nothing else
  // of the node's: not alice's other job, not the node's own records.
  std::vector<StreamMessage> seen;
  EXPECT_TRUE(waitUntil([&] {
    auto fetched = s.fetch(0, 10000, 0, 5s);
    EXPECT_TRUE(fetched.ok()) << fetched.error().message;
    if (fetched.ok()) seen = fetched->messages;
    return !seen.empty();
  }, 10s));
  for (const auto& m : seen) EXPECT_EQ(jobOf(m.payload), "delegated");
  auto everything = user->fetch(0, 10000, 0, 5s);
  ASSERT_TRUE(everything.ok());
  EXPECT_GT(everything->messages.size(), seen.size()) << "alice sees her other job and the node's own records";
  expectRefused(asVoid(s.logs("delegated", 0, 100, 5s)), "reading a rank's log");
  expectRefused(asVoid(s.stopJob("alices", 0, 5s)), "stopping another job");
  expectRefused(asVoid(s.startJob(sleepJob(dir, "new", "node-b"), "", 5s)), "starting a job of its own");
  const auto logsRefusal = s.logs("delegated", 0, 100, 5s);
  EXPECT_NE(logsRefusal.error().message.find("may only list, stop, restart and read the stream of the jobs it supervises"),
            std::string::npos)
      << logsRefusal.error().message;

  ASSERT_TRUE(s.stopJob("delegated", 0, 5s).ok());
  ASSERT_TRUE(endedOn(*user, "delegated"));
  JobSpec other = spec;
  other.attempt = 1;
  other.command->argv = {"/bin/sh", "-c", "echo owned"};
  expectRefused(asVoid(s.startJob(other, "", 5s)), "restarting it with another program");
  JobSpec next = spec;
  next.attempt = 1;
  next.restartReason = "a test restart";
  auto restarted = s.startJob(next, "", 10s);
  ASSERT_TRUE(restarted.ok()) << restarted.error().message;
  auto now = jobOn(*user, "delegated");
  ASSERT_TRUE(now);
  EXPECT_EQ(now->spec.attempt, 1u);

  // A user's stop is final: the supervisor may not undo it.
  ASSERT_TRUE(user->stopJob("delegated", 0, 5s).ok());
  ASSERT_TRUE(endedOn(*user, "delegated"));
  JobSpec third = next;
  third.attempt = 2;
  auto afterStop = s.startJob(third, "", 10s);
  ASSERT_FALSE(afterStop.ok());
  EXPECT_NE(afterStop.error().message.find("was stopped by a user"), std::string::npos) << afterStop.error().message;
  ASSERT_TRUE(user->stopJob("alices", 0, 5s).ok());
}

// The supervisor restarts with the rights of the key that launched the job, as they are now.
TEST(Supervision, ARestartNeedsTheLaunchingKeyStillAuthorized) {
  TempDir dir;
  AgentProcess agent(dir, "node-b");
  ClientKeys alice(dir, "alice"), bob(dir, "bob"), nodeA(dir, "node-a");
  agent.authorize(alice.keys.publicKey);
  auto user = connectTo(agent, alice);
  const JobSpec spec = supervisedFromNodeA(dir, "revoked", agent, nodeA);
  ASSERT_TRUE(user->startJob(spec, "", 10s).ok());
  auto supervisor = AgentClient::connect(agent.address(), nodeA.keys, agent.publicKey(), 5s);
  ASSERT_TRUE(supervisor.ok()) << supervisor.error().message;
  ASSERT_TRUE((*supervisor)->stopJob("revoked", 0, 5s).ok());
  ASSERT_TRUE(endedOn(*user, "revoked"));
  // Alice's key leaves the node's authorized keys (bob's stays).
  const std::string keys = agent.stateDir() + "/authorized_keys";
  std::ofstream(keys + ".new", std::ios::trunc) << authorizedKeyLine(bob.keys.publicKey, "bob");
  ASSERT_EQ(std::rename((keys + ".new").c_str(), keys.c_str()), 0);
  ASSERT_TRUE(waitUntil([&] { return !AgentClient::connect(agent.address(), alice.keys, agent.publicKey(), 1s).ok(); }, 10s));
  JobSpec next = spec;
  next.attempt = 1;
  auto restarted = (*supervisor)->startJob(next, "", 10s);
  ASSERT_FALSE(restarted.ok());
  EXPECT_EQ(restarted.error().code, ErrorCode::kPermissionDenied);
  EXPECT_NE(restarted.error().message.find("the key that launched job revoked may no longer start it"), std::string::npos)
      << restarted.error().message;
}

// Two agents, a job of one rank on each, launched by a client that then goes away.
struct TwoNodeJob {
  TwoNodeJob(const std::string& jobId) : a(dir, "node-a"), b(dir, "node-b"), alice(dir, "alice"), id(jobId) {
    a.authorize(alice.keys.publicKey);
    b.authorize(alice.keys.publicKey);
    auto ca = connectTo(a, alice), cb = connectTo(b, alice);
    JobSpec spec = commandJob(jobId, 0, {"/bin/sleep", "600"}, dir.path().string());
    auto placed = placeJob({ca.get(), cb.get()}, {1, 1}, spec, 5s);
    if (!placed) throw std::runtime_error(placed.error().message);
    if (auto launched = launchJob({ca.get(), cb.get()}, *placed, 10s); !launched) {
      throw std::runtime_error(launched.error().message);
    }
  }
  std::optional<pid_t> rank(int r) const {
    for (pid_t pid : processesOfJob(id)) {
      if (environOf(pid, "RANK") == std::to_string(r)) return pid;
    }
    return std::nullopt;
  }
  TempDir dir;
  AgentProcess a, b;
  ClientKeys alice;
  std::string id;
};

TEST(Supervision, AFailedJobsOtherPartsAreStoppedWithNoClientConnected) {
  TwoNodeJob job("no-client");
  ASSERT_TRUE(waitUntil([&] { return job.rank(0) && job.rank(1); }, 20s));
  ::kill(*job.rank(0), SIGKILL);  // node-a's rank: the job failed; node-b's part still runs
  EXPECT_TRUE(waitUntil([&] { return !job.rank(1); }, 20s)) << "node-b's rank was not stopped";
  auto cb = connectTo(job.b, job.alice);
  ASSERT_TRUE(endedOn(*cb, "no-client"));
  EXPECT_EQ(jobOn(*cb, "no-client")->state, JobState::kStopped);
  auto ca = connectTo(job.a, job.alice);
  ASSERT_TRUE(waitUntil([&] {
    auto j = jobOn(*ca, "no-client");
    return j && j->supervision.state == SupervisionState::kEnded;
  }, 20s));
  const auto supervised = jobOn(*ca, "no-client");
  EXPECT_EQ(supervised->supervision.outcome, JobState::kFailed);
  EXPECT_NE(supervised->supervision.message.find("rank 0 on node-a"), std::string::npos) << supervised->supervision.message;
  // node-b, the job's second agent, stood by and mirrors the end.
  ASSERT_TRUE(waitUntil([&] { return jobOn(*cb, "no-client")->supervision.state == SupervisionState::kEnded; }, 10s));
  EXPECT_EQ(jobOn(*cb, "no-client")->supervision.outcome, JobState::kFailed);
}

}  // namespace
}  // namespace lockstep::test
