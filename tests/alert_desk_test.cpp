// Issue 43: the rules a job runs under on its supervising agent (agent/src/alerts/alert_desk.h):
// its own, the defaults with --notify alone, the agent's, a budget, and what a job cannot do.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "alerts/alert_desk.h"
#include "base/log.h"
#include "support/test_support.h"

namespace lockstep::agent {
namespace {

std::vector<std::string> textsOf(const std::vector<alerts::Rule>& rules) {
  std::vector<std::string> out;
  for (const auto& r : rules) out.push_back(r.text);
  return out;
}

JobSpec trainerJob() {
  JobSpec s;
  s.jobId = "j1";
  s.layers = {8, 4};
  s.steps = 10;
  return s;
}

AlertDefaults agentsRules(std::vector<std::string> lines, std::vector<std::string> notify = {}) {
  AlertDefaults d;
  for (const auto& line : lines) d.rules.push_back(*alerts::parseRule(line));
  d.notify = std::move(notify);
  return d;
}

struct Desk : ::testing::Test {
  test::TempDir dir;
  Log log{dir.file("agent.log")};
};

TEST_F(Desk, NotifyAloneTurnsTheDefaultsOnEvenBesideTheAgentsOwnRules) {
  AlertDesk desk(agentsRules({"gpu_temperature > 85"}), log);
  JobSpec s = trainerJob();
  s.notify = {"https://hooks.example.org/x"};
  auto rules = desk.rulesFor(s);
  ASSERT_TRUE(rules) << rules.error().message;
  EXPECT_EQ(textsOf(*rules), (std::vector<std::string>{"failed", "stalled", "restarted", "finished", "gpu_temperature > 85"}));
  s.alertRules = {"exposed_comm > 40% for 2m"};
  rules = desk.rulesFor(s);
  ASSERT_TRUE(rules);
  EXPECT_EQ(textsOf(*rules), (std::vector<std::string>{"exposed_comm > 40% for 2m", "gpu_temperature > 85"}));
}

TEST_F(Desk, AnAgentWithWebhooksAndNoRulesGivesEveryJobTheDefaults) {
  AlertDesk desk(agentsRules({}, {"https://hooks.example.org/team"}), log);
  auto rules = desk.rulesFor(trainerJob());
  ASSERT_TRUE(rules);
  EXPECT_EQ(rules->size(), 4u);
  EXPECT_EQ(desk.webhooksFor(trainerJob()), std::vector<std::string>{"https://hooks.example.org/team"});
  AlertDesk quiet(AlertDefaults{}, log);
  EXPECT_TRUE(quiet.rulesFor(trainerJob())->empty()) << "no rules, nowhere to notify: nothing to evaluate";
}

TEST_F(Desk, TheAgentsCheckpointBendsToAJobThatWritesNoneButTheJobsOwnIsRefused) {
  AlertDesk desk(agentsRules({"cost > 40 -> checkpoint,stop"}), log);
  auto rules = desk.rulesFor(trainerJob());
  ASSERT_TRUE(rules) << rules.error().message;
  ASSERT_EQ(rules->size(), 1u);
  EXPECT_EQ(rules->front().actions, (std::vector<alerts::Action>{alerts::Action::kStop}));
  JobSpec own = trainerJob();
  own.alertRules = {"cost > 40 -> checkpoint,stop"};
  auto refused = desk.rulesFor(own);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("give --checkpoint-dir and --checkpoint-every"), std::string::npos)
      << refused.error().message;
  own.checkpointDir = "/tmp/ckpt";
  own.checkpointEvery = 100;
  EXPECT_TRUE(desk.rulesFor(own));
}

TEST_F(Desk, ABudgetNeedsPricesAndMoreThanNothing) {
  AlertDesk desk(AlertDefaults{}, log);
  JobSpec s = trainerJob();
  s.budget = 40;
  auto refused = desk.rulesFor(s);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("--budget needs the job's prices"), std::string::npos) << refused.error().message;
  s.prices.gpuHour = 2.5;
  auto rules = desk.rulesFor(s);
  ASSERT_TRUE(rules) << rules.error().message;
  EXPECT_EQ(textsOf(*rules), std::vector<std::string>{"cost >= 40 -> notify,stop"});
  s.budget = 0;
  EXPECT_FALSE(desk.rulesFor(s));
}

TEST_F(Desk, TheAgentsRulesFileRefusesWhatNoJobCanRunNamingTheLine) {
  const std::string path = dir.file("alerts.rules");
  std::ofstream(path) << "# every job\ngpu_temperature > 85\n\nstalled -> restart\n";
  auto read = readAlertRulesFile(path);
  ASSERT_FALSE(read);
  EXPECT_NE(read.error().message.find("alerts.rules line 4"), std::string::npos) << read.error().message;
  std::ofstream(path) << "gpu_temperature > 85\ndisk_free < 10% for 5m\n";
  read = readAlertRulesFile(path);
  ASSERT_TRUE(read) << read.error().message;
  EXPECT_EQ(read->size(), 2u);
}

}  // namespace
}  // namespace lockstep::agent
