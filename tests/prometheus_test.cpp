// Issue 17: lockstep-agent --metrics-listen scraped by a real Prometheus (Debian 12's, started by
// tests/cluster/prometheus_fixture.sh), a per-rank series read back through its HTTP API.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "lockstep/client/launch.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;

const std::string kFixture = std::string(LOCKSTEP_SOURCE_DIR) + "/tests/cluster/prometheus_fixture.sh";

// The port the agent's log says it serves metrics on.
std::string metricsAddress(const AgentProcess& agent) {
  std::smatch m;
  std::string log;
  waitUntil([&] {
    log = readText(agent.stateDir() + "/agent.log");
    return std::regex_search(log, m, std::regex("metrics for Prometheus at http://([0-9.]+:[0-9]+)/metrics"));
  }, 10s);
  return m.size() > 1 ? m[1].str() : "";
}

TEST(Prometheus, ScrapesTheAgentWhileAJobRunsAndAnswersForOneRank) {
  TempDir dir;
  AgentProcess agent(dir, "node-p", {"--metrics-listen", "127.0.0.1:0"});
  const std::string target = metricsAddress(agent);
  ASSERT_FALSE(target.empty()) << readText(agent.stateDir() + "/agent.log");
  ClientKeys keys(dir);
  agent.authorize(keys.keys.publicKey);
  auto client = connectTo(agent, keys);
  ASSERT_TRUE(client);
  ASSERT_TRUE(client->startJob(smallJob("prom-1", 2, 100'000'000), "", 10s).ok());

  auto started = runProcess({"/bin/bash", kFixture, "start", dir.file("prom"), target}, {}, dir, 60s);
  if (started.status.exitCode == 77) GTEST_SKIP() << "no Prometheus here (apt install prometheus curl): " << started.err;
  ASSERT_EQ(started.status.exitCode, 0) << started.out << started.err;
  const std::string api = "http://127.0.0.1:" + readText(dir.file("prom") + "/port").substr(0, 5) + "/api/v1/query";
  const auto query = [&](const std::string& promql) {
    auto got = runProcess({"/usr/bin/curl", "-sfG", api, "--data-urlencode", "query=" + promql}, {}, dir, 10s);
    return got.status.exitCode == 0 ? nlohmann::json::parse(got.out, nullptr, false) : nlohmann::json();
  };

  nlohmann::json result;
  const bool answered = waitUntil([&] {
    result = query(R"(lockstep_rank_samples_per_second{job_id="prom-1",rank="1"})");
    return result.is_object() && !result["data"]["result"].empty();
  }, 40s);
  runProcess({"/bin/bash", kFixture, "stop", dir.file("prom")}, {}, dir, 30s);
  ASSERT_TRUE(answered) << result.dump() << readText(dir.file("prom") + "/prometheus.log");
  const auto& series = result["data"]["result"][0];
  EXPECT_EQ(series["metric"]["node"], "node-p");
  EXPECT_EQ(series["metric"]["job_id"], "prom-1");  // "job" is Prometheus' own: the scrape job
  EXPECT_EQ(series["metric"]["rank"], "1");
  EXPECT_GT(std::stod(series["value"][1].get<std::string>()), 0.0);
  (void)client->stopJob("prom-1", 0, 10s);
}

}  // namespace
}  // namespace lockstep::test
