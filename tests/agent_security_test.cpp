// Issue 14: lockstep-agent tried as an attacker would, on loopback, as a real process: keys kept
// like sshd's, and what a job's processes can reach.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <thread>

#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;

void writeKeys(const AgentProcess& agent, const std::string& text, mode_t mode = 0644) {
  const std::string path = agent.stateDir() + "/authorized_keys";
  std::ofstream(path, std::ios::trunc) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

std::string keyLine(const ClientKeys& keys, const std::string& comment) { return keys.keys.publicKey + " " + comment + "\n"; }

// Whether `client` can connect within `timeout` (the agent re-reads its keys every second).
bool canConnect(const AgentProcess& agent, const ClientKeys& client, std::chrono::milliseconds timeout = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  do {
    if (AgentClient::connect(agent.address(), client.keys, agent.publicKey(), 1s).ok()) return true;
    std::this_thread::sleep_for(200ms);
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

std::string agentLog(const AgentProcess& agent) { return readText(agent.stateDir() + "/agent.log"); }

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(AgentKeys, ARemovedKeyLosesItsOpenSessionWithinSeconds) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  ClientKeys alice(dir, "alice"), mallory(dir, "mallory");
  writeKeys(agent, keyLine(alice, "alice@laptop") + keyLine(mallory, "mallory@laptop"));
  auto a = connectTo(agent, alice);
  auto m = connectTo(agent, mallory);
  ASSERT_TRUE(m->listJobs(5s).ok());
  // A long poll waiting when the key goes must be answered too, not left to run out.
  auto waiting = std::async(std::launch::async, [&] { return m->fetch(1u << 30, 10, 20000, 25s); });
  std::this_thread::sleep_for(300ms);
  const auto revoked = std::chrono::steady_clock::now();
  writeKeys(agent, keyLine(alice, "alice@laptop"));

  auto fetched = waiting.get();
  ASSERT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.error().code, ErrorCode::kPermissionDenied) << fetched.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - revoked, 4s);
  auto listed = m->listJobs(5s);
  ASSERT_FALSE(listed.ok());
  EXPECT_NE(listed.error().message.find("no longer in the authorized keys"), std::string::npos) << listed.error().message;
  EXPECT_TRUE(a->listJobs(5s).ok()) << "the key that stayed keeps its session";
  EXPECT_NE(agentLog(agent).find("'mallory@laptop' (" + fingerprint(mallory.keys.publicKey) + ") left"), std::string::npos)
      << agentLog(agent);
}

// As root, chmod cannot make a file unreadable (CAP_DAC_OVERRIDE), so this also tests the other
// way a file becomes unusable and is fixed by chmod alone: StrictModes. Either way the mtime does
// not change, which is why the agent compares contents.
TEST(AgentKeys, AKeyFileFixedByChmodAloneLetsClientsInAgain) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  ClientKeys alice(dir, "alice");
  const std::string path = agent.stateDir() + "/authorized_keys";
  writeKeys(agent, keyLine(alice, "alice@laptop"), 0664);
  EXPECT_FALSE(canConnect(agent, alice, 1500ms)) << "a group-writable key file was trusted";
  EXPECT_NE(agentLog(agent).find("writable by group or others (mode 0664)"), std::string::npos) << agentLog(agent);
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  EXPECT_TRUE(canConnect(agent, alice));
  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(path.c_str(), 0), 0);
    std::ofstream(path, std::ios::app);  // a change the agent cannot read
    ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
    EXPECT_TRUE(canConnect(agent, alice));
  }
}

TEST(AgentKeys, AFileThatCannotBeUsedKeepsTheLastGoodSetAndSaysSoOnce) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  ClientKeys alice(dir, "alice"), bob(dir, "bob");
  writeKeys(agent, keyLine(alice, "alice@laptop"));
  ASSERT_TRUE(canConnect(agent, alice));
  writeKeys(agent, keyLine(alice, "alice@laptop") + keyLine(bob, "bob@laptop") + "garbage line\n");
  EXPECT_FALSE(canConnect(agent, bob, 2500ms)) << "a malformed file was used";
  EXPECT_TRUE(canConnect(agent, alice, 1s)) << "the last good set was dropped";
  EXPECT_EQ(count(agentLog(agent), "keeping the 1 key(s) read before"), 1u) << agentLog(agent);
  writeKeys(agent, keyLine(alice, "alice@laptop") + keyLine(bob, "bob@laptop"));
  EXPECT_TRUE(canConnect(agent, bob));
}

TEST(AgentKeys, AStateDirectoryOthersMayWriteIsRefused) {
  TempDir dir;
  const std::string state = dir.file("shared-state");
  ASSERT_EQ(::mkdir(state.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(state.c_str(), 0777), 0);
  const auto run = runProcess({agentPath(), "--state-dir", state, "--listen", "tcp://127.0.0.1:" + std::to_string(freePort())},
                              {}, dir, 20s);
  EXPECT_FALSE(run.status.success());
  EXPECT_NE(run.err.find("writable by group or others (mode 0777)"), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("chmod go-w " + state), std::string::npos) << run.err;
}

TEST(AgentKeys, StartsAndStopsNameTheKeyAndRefusalsCannotFloodTheLog) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  ClientKeys alice(dir, "alice");
  writeKeys(agent, keyLine(alice, "alice@laptop"));
  auto a = connectTo(agent, alice);
  ASSERT_TRUE(a->startJob(smallJob("job-logged", 1, 1'000'000), "", 10s).ok());
  ASSERT_TRUE(a->stopJob("job-logged", 2000, 10s).ok());
  const std::string who = "'alice@laptop' (" + fingerprint(alice.keys.publicKey) + ")";
  EXPECT_NE(agentLog(agent).find("job job-logged: start asked by key " + who), std::string::npos) << agentLog(agent);
  EXPECT_NE(agentLog(agent).find("job job-logged: stop asked by key " + who), std::string::npos) << agentLog(agent);

  for (int i = 0; i < 40; ++i) {
    ClientKeys stranger(dir, "stranger-" + std::to_string(i));
    EXPECT_FALSE(AgentClient::connect(agent.address(), stranger.keys, agent.publicKey(), 500ms).ok());
  }
  EXPECT_EQ(count(agentLog(agent), "refused a client with key"), 10u) << agentLog(agent);
  EXPECT_NE(agentLog(agent).find("further refusals this minute are counted"), std::string::npos);
}

}  // namespace
}  // namespace lockstep::test
