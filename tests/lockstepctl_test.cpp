// Issue 3: lockstepctl as scripts use it: real agents, real trainers, exit codes and --json.

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;

struct Ctl {
  const TempDir& dir;
  std::string configDir;
  ProcessResult operator()(std::vector<std::string> args) const {
    args.insert(args.begin(), lockstepctlPath());
    return runProcess(args, {{"LOCKSTEP_CONFIG_DIR", configDir}}, dir, 120s);
  }
  // Makes this client's key, authorizes it on the agent and pins the agent's key: ready to use it.
  bool pairWith(const AgentProcess& agent) const {
    const auto key = nlohmann::json::parse((*this)({"keygen", "--json"}).out)["public_key"].get<std::string>();
    agent.authorize(key);
    return (*this)({"trust", agent.address().text(), agent.publicKey()}).status.exitCode == 0;
  }
};

TEST(Lockstepctl, KeysTrustAndRefusalsAreSpelledOut) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  const std::string where = agent.address().text();

  auto keygen = ctl({"keygen", "--json"});
  ASSERT_EQ(keygen.status.exitCode, 0) << keygen.err;
  const auto key = nlohmann::json::parse(keygen.out);
  EXPECT_TRUE(key["created"].get<bool>());
  const std::string clientKey = key["public_key"];
  EXPECT_EQ(nlohmann::json::parse(ctl({"keygen", "--json"}).out)["public_key"], clientKey);  // made once

  auto untrusted = ctl({"--agent", where, "nodes"});
  EXPECT_EQ(untrusted.status.exitCode, 4);
  EXPECT_NE(untrusted.err.find("lockstepctl trust " + where + " KEY"), std::string::npos) << untrusted.err;

  const std::string otherKey = generateKeyPair()->publicKey;
  auto unknownKey = ctl({"--agent", where, "--agent-key", otherKey, "nodes"});
  EXPECT_EQ(unknownKey.status.exitCode, 4);
  EXPECT_NE(unknownKey.err.find(fingerprint(otherKey)), std::string::npos) << unknownKey.err;
  EXPECT_NE(unknownKey.err.find("lockstepctl trust " + where + " " + otherKey), std::string::npos) << unknownKey.err;

  ASSERT_EQ(ctl({"trust", where, agent.publicKey()}).status.exitCode, 0);
  auto unauthorized = ctl({"--agent", where, "--timeout-s", "3", "nodes"});
  EXPECT_EQ(unauthorized.status.exitCode, 4);
  EXPECT_NE(unauthorized.err.find(clientKey), std::string::npos) << unauthorized.err;

  agent.authorize(clientKey);
  auto nodes = ctl({"nodes", "--json"});
  ASSERT_EQ(nodes.status.exitCode, 0) << nodes.err;
  const auto list = nlohmann::json::parse(nodes.out);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["node"], "node-a");
  EXPECT_GE(list[0]["cpu_cores"].get<int>(), 1);

  auto nobody = ctl({"--agent", "127.0.0.1:" + std::to_string(freePort()), "nodes"});
  EXPECT_EQ(nobody.status.exitCode, 4);  // not pinned comes first
}

TEST(Lockstepctl, StartWaitStatusLogsAndStop) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));

  auto done = ctl({"start", "--ranks", "2", "--wait", "--job-id", "ctl-1", "--layers", "16,32,4", "--dataset",
                   "synthetic:n=2048", "--steps", "50", "--lr", "0.05"});
  ASSERT_EQ(done.status.exitCode, 0) << done.out << done.err;
  EXPECT_NE(done.out.find("started job ctl-1: 2 ranks on node-a"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("job ctl-1: finished"), std::string::npos) << done.out;

  auto status = ctl({"status", "ctl-1", "--json"});
  ASSERT_EQ(status.status.exitCode, 0) << status.err;
  const auto job = nlohmann::json::parse(status.out);
  EXPECT_EQ(job["state"], "finished");
  EXPECT_EQ(job["ranks"].size(), 2u);
  auto logs = ctl({"logs", "ctl-1", "--rank", "0"});
  EXPECT_EQ(logs.status.exitCode, 0);
  EXPECT_NE(logs.out.find("[lockstep] done: steps 1..50"), std::string::npos) << logs.out;

  // A job spec file in protobuf JSON, then stop.
  std::ofstream(dir.file("job.json")) << R"({"jobId": "ctl-2", "backend": "BACKEND_CPU", "activation": "ACTIVATION_RELU",
      "precision": "PRECISION_FP32", "layers": [16, 32, 4], "dataset": {"synthetic": {"samples": "2048", "dim": 16,
      "classes": 4, "seed": "1"}}, "batchPerRank": 16, "accumSteps": 1, "optimizer": {"kind": "OPTIMIZER_KIND_SGD",
      "lr": 0.05}, "steps": "100000000", "bucketMb": 25, "timeoutS": 30, "worldSize": 1})";
  auto started = ctl({"start", "--ranks", "2", "--spec", dir.file("job.json"), "--price-core-hour", "0.04",
                      "--currency", "EUR", "--json"});
  ASSERT_EQ(started.status.exitCode, 0) << started.err;
  EXPECT_EQ(nlohmann::json::parse(started.out)["world_size"], 2);
  const auto running = nlohmann::json::parse(ctl({"status", "ctl-2", "--json"}).out);
  EXPECT_EQ(running["prices"]["core_hour"], 0.04);
  EXPECT_EQ(running["prices"]["gpu_hour"], 0.0);
  EXPECT_EQ(running["prices"]["currency"], "EUR");
  auto stopped = ctl({"stop", "ctl-2", "--json"});
  ASSERT_EQ(stopped.status.exitCode, 0) << stopped.err;
  EXPECT_EQ(nlohmann::json::parse(stopped.out)["state"], "stopped");
  EXPECT_TRUE(processesOfJob("ctl-2").empty());

  auto list = ctl({"status", "--json"});
  ASSERT_EQ(list.status.exitCode, 0);
  EXPECT_EQ(nlohmann::json::parse(list.out).size(), 2u);

  auto badPrice = ctl({"start", "--price-gpu-hour", "cheap", "--layers", "16,4", "--steps", "5"});
  EXPECT_EQ(badPrice.status.exitCode, 2);
  EXPECT_NE(badPrice.err.find("--price-gpu-hour needs a price, like 2.50"), std::string::npos) << badPrice.err;
  auto bad = ctl({"start", "--layers", "16,x,4", "--steps", "5"});
  EXPECT_EQ(bad.status.exitCode, 2);
  EXPECT_NE(bad.err.find("'x' is not a whole number"), std::string::npos) << bad.err;
  auto refused = ctl({"start", "--ranks", "64", "--layers", "16,4", "--dataset", "synthetic:n=64", "--steps", "5"});
  EXPECT_NE(refused.status.exitCode, 0);
  EXPECT_NE(refused.err.find("cores for 64 CPU ranks"), std::string::npos) << refused.err;
  auto missing = ctl({"status", "no-such-job"});
  EXPECT_EQ(missing.status.exitCode, 1);
  EXPECT_NE(missing.err.find("no agent knows job no-such-job"), std::string::npos);
}

TEST(Lockstepctl, AFailedJobExitsFiveAndWatchShowsTheRanks) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  // Initial weights that are not there: rank 0 fails at start-up, so the job fails.
  auto failed = ctl({"start", "--ranks", "2", "--wait", "--job-id", "ctl-bad", "--layers", "16,4", "--dataset",
                     "synthetic:n=64", "--steps", "5", "--init-weights", dir.file("missing.safetensors")});
  EXPECT_EQ(failed.status.exitCode, 5) << failed.out << failed.err;
  EXPECT_NE(failed.out.find("job ctl-bad: failed"), std::string::npos) << failed.out;

  ASSERT_EQ(ctl({"start", "--ranks", "2", "--job-id", "ctl-watch", "--layers", "16,32,4", "--dataset",
                 "synthetic:n=2048", "--steps", "300"}).status.exitCode, 0);
  auto watch = ctl({"watch", "ctl-watch", "--json"});
  EXPECT_EQ(watch.status.exitCode, 0) << watch.err;
  const auto lines = [&] {
    std::vector<nlohmann::json> out;
    std::istringstream in(watch.out);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    }
    return out;
  }();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["state"], "finished");
  ASSERT_EQ(lines.back()["ranks"].size(), 2u);
  EXPECT_EQ(lines.back()["ranks"][0]["step"], 300);
  EXPECT_EQ(lines.back()["ranks"][1]["node"], "node-a");
}

}  // namespace
}  // namespace lockstep::test
