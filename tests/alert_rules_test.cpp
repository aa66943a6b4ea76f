// Alert rules (alerts/rules.h): the examples of docs/alerts.md parse to what they say, and a
// malformed rule is refused with its position and what was expected there.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "lockstep/alerts/rules.h"

namespace lockstep::alerts {
namespace {

constexpr std::int64_t kMinuteUs = 60'000'000;

Rule parsed(std::string_view text) {
  auto rule = parseRule(text);
  EXPECT_TRUE(rule.ok()) << text << ": " << (rule.ok() ? "" : rule.error().message);
  return rule.ok() ? *rule : Rule{};
}

std::string errorOf(std::string_view text) {
  auto rule = parseRule(text);
  EXPECT_FALSE(rule.ok()) << text << " was accepted";
  if (rule.ok()) return {};
  EXPECT_EQ(rule.error().code, ErrorCode::kInvalidArgument);
  return rule.error().message;
}

void expectRule(std::string_view text, std::string_view kpi, Op op, double value, std::int64_t forUs,
                std::vector<Action> actions) {
  const Rule rule = parsed(text);
  EXPECT_EQ(rule.text, text);
  EXPECT_EQ(rule.kpi, kpi) << text;
  EXPECT_EQ(rule.op, op) << text;
  EXPECT_DOUBLE_EQ(rule.value, value) << text;
  EXPECT_EQ(rule.forUs, forUs) << text;
  EXPECT_EQ(rule.actions, actions) << text;
}

const std::vector<Action> kNotifyOnly = {Action::kNotify};

TEST(AlertRules, ThresholdExamplesParse) {
  expectRule("gpu_util < 30% for 10m -> notify", "gpu_util", Op::kLess, 30, 10 * kMinuteUs, kNotifyOnly);
  expectRule("exposed_comm > 40% for 2m -> notify", "exposed_comm", Op::kGreater, 40, 2 * kMinuteUs, kNotifyOnly);
  expectRule("throughput_drop > 30% for 5m -> notify", "throughput_drop", Op::kGreater, 30, 5 * kMinuteUs, kNotifyOnly);
  expectRule("straggler_wait > 30% for 5m -> notify", "straggler_wait", Op::kGreater, 30, 5 * kMinuteUs, kNotifyOnly);
  expectRule("mfu < 30% for 5m", "mfu", Op::kLess, 30, 5 * kMinuteUs, kNotifyOnly);
  expectRule("cost > 40 -> checkpoint,stop", "cost", Op::kGreater, 40, 0, {Action::kCheckpoint, Action::kStop});
  expectRule("projected_cost > 100 -> notify", "projected_cost", Op::kGreater, 100, 0, kNotifyOnly);
  expectRule("eta > 6h -> notify", "eta", Op::kGreater, 6 * 3600, 0, kNotifyOnly);
  expectRule("gpu_util < 5% for 30m -> stop", "gpu_util", Op::kLess, 5, 30 * kMinuteUs, {Action::kStop});
}

TEST(AlertRules, RulesWithoutActionsNotify) {
  expectRule("gpu_memory > 95%", "gpu_memory", Op::kGreater, 95, 0, kNotifyOnly);
  expectRule("gpu_temperature > 85", "gpu_temperature", Op::kGreater, 85, 0, kNotifyOnly);
  expectRule("disk_free < 10%", "disk_free", Op::kLess, 10, 0, kNotifyOnly);
  expectRule("gpu_util <= 30 for 500ms", "gpu_util", Op::kLessEqual, 30, 500'000, kNotifyOnly);
  expectRule("loss >= 2.5e-1", "loss", Op::kGreaterEqual, 0.25, 0, kNotifyOnly);
  expectRule("loss < -1.5", "loss", Op::kLess, -1.5, 0, kNotifyOnly);
}

TEST(AlertRules, EventsAndNan) {
  for (const char* event : {"stalled", "failed", "finished", "restarted"}) {
    expectRule(event, event, Op::kEvent, 0, 0, kNotifyOnly);
  }
  expectRule("loss is nan -> notify,stop", "loss", Op::kIsNan, 0, 0, {Action::kNotify, Action::kStop});
  expectRule("failed -> restart", "failed", Op::kEvent, 0, 0, {Action::kRestart});
}

TEST(AlertRules, DurationsAndPercentages) {
  EXPECT_DOUBLE_EQ(parsed("eta > 90s").value, 90);
  EXPECT_DOUBLE_EQ(parsed("eta > 90").value, 90);  // plain seconds
  EXPECT_DOUBLE_EQ(parsed("eta > 1h30m").value, 5400);
  EXPECT_DOUBLE_EQ(parsed("eta > 2d").value, 172800);
  EXPECT_DOUBLE_EQ(parsed("eta < 10m").value, 600);
  EXPECT_EQ(parsed("gpu_util < 30 for 30s").forUs, 30'000'000);
  EXPECT_EQ(parsed("gpu_util < 30 for 2h").forUs, 7200LL * 1'000'000);
  // `30%` and `30` are the same percentage.
  EXPECT_DOUBLE_EQ(parsed("gpu_util < 30").value, parsed("gpu_util < 30%").value);
}

TEST(AlertRules, BlanksAreOptionalAndCollapsedInTheText) {
  const Rule tight = parsed("gpu_util<30% for 10m->notify,stop");
  EXPECT_EQ(tight.op, Op::kLess);
  EXPECT_DOUBLE_EQ(tight.value, 30);
  EXPECT_EQ(tight.actions, (std::vector<Action>{Action::kNotify, Action::kStop}));
  const Rule loose = parsed("  cost \t>  40   ->  checkpoint , stop  ");
  EXPECT_EQ(loose.text, "cost > 40 -> checkpoint , stop");
  EXPECT_EQ(loose.actions, (std::vector<Action>{Action::kCheckpoint, Action::kStop}));
}

TEST(AlertRules, UnknownKpiListsTheNames) {
  EXPECT_EQ(errorOf("gpu_utl < 30%"),
            "alert rule 'gpu_utl < 30%': at position 1: expected a KPI (gpu_util, exposed_comm, throughput_drop, "
            "straggler_wait, mfu, loss, cost, projected_cost, eta, gpu_memory, gpu_temperature, disk_free) or an event "
            "(stalled, failed, finished, restarted), found 'gpu_utl'");
  // Positions count in the rule as given, leading blanks included.
  EXPECT_NE(errorOf("  stopped").find("at position 3: expected a KPI"), std::string::npos);
}

TEST(AlertRules, EmptyAndOverlongRulesAreRefused) {
  EXPECT_NE(errorOf("").find("alert rule '': at position 1: expected a KPI ("), std::string::npos);
  EXPECT_NE(errorOf("").find("found the end of the rule"), std::string::npos);
  const std::string longRule = "gpu_util < 30 -> notify" + std::string(490, ' ');
  ASSERT_EQ(longRule.size(), 513u);
  EXPECT_NE(errorOf(longRule).find("513 bytes long; the limit is 512"), std::string::npos);
}

TEST(AlertRules, MissingOrWrongValue) {
  EXPECT_EQ(errorOf("gpu_util <"),
            "alert rule 'gpu_util <': at position 11: expected a percentage (30% or 30), found the end of the rule");
  EXPECT_EQ(errorOf("gpu_util < x"),
            "alert rule 'gpu_util < x': at position 12: expected a percentage (30% or 30), found 'x'");
  EXPECT_EQ(errorOf("gpu_util < for 10m"),
            "alert rule 'gpu_util < for 10m': at position 12: expected a percentage (30% or 30), found 'for'");
  EXPECT_EQ(errorOf("gpu_util 30"),
            "alert rule 'gpu_util 30': at position 10: expected a comparison (<, <=, >, >=), found '30'");
  EXPECT_EQ(
      errorOf("eta > 6x"),
      "alert rule 'eta > 6x': at position 7: expected a duration (90s, 10m, 6h, 1h30m, 2d, or seconds), found '6x'");
}

TEST(AlertRules, PercentOnlyOnPercentages) {
  EXPECT_EQ(errorOf("cost > 40%"),
            "alert rule 'cost > 40%': at position 8: expected an amount of money (a plain number: cost is not a "
            "percentage), found '40%'");
  EXPECT_EQ(errorOf("gpu_temperature > 85%"),
            "alert rule 'gpu_temperature > 85%': at position 19: expected a temperature in °C (a plain number), "
            "found '85%'");
}

TEST(AlertRules, BadDuration) {
  EXPECT_EQ(errorOf("gpu_util < 30% for 10x"),
            "alert rule 'gpu_util < 30% for 10x': at position 20: expected a positive duration (500ms, 30s, 10m, "
            "2h), found '10x'");
  EXPECT_NE(errorOf("gpu_util < 30% for 0s").find("at position 20: expected a positive duration"), std::string::npos);
  EXPECT_NE(errorOf("gpu_util < 30% for 10").find("found '10'"), std::string::npos);  // a unit is required
  EXPECT_NE(errorOf("gpu_util < 30% for").find("at position 19: expected a positive duration"), std::string::npos);
}

TEST(AlertRules, BadActions) {
  EXPECT_EQ(errorOf("gpu_util < 30% -> page"),
            "alert rule 'gpu_util < 30% -> page': at position 19: expected an action (notify, stop, checkpoint, "
            "restart), found 'page'");
  EXPECT_EQ(errorOf("failed -> notify, notify"),
            "alert rule 'failed -> notify, notify': at position 19: expected an action not listed yet, found 'notify'");
  EXPECT_EQ(errorOf("cost > 40 -> checkpoint"),
            "alert rule 'cost > 40 -> checkpoint': at position 14: checkpoint is only an action with stop: write "
            "`checkpoint,stop`");
  EXPECT_NE(errorOf("failed ->").find("at position 10: expected an action"), std::string::npos);
  EXPECT_NE(errorOf("failed -> notify,").find("found the end of the rule"), std::string::npos);
}

TEST(AlertRules, TrailingGarbage) {
  EXPECT_EQ(errorOf("gpu_util < 30% foo"),
            "alert rule 'gpu_util < 30% foo': at position 16: expected `for DURATION`, `-> ACTIONS` or the end of "
            "the rule, found 'foo'");
  EXPECT_EQ(errorOf("stalled now"),
            "alert rule 'stalled now': at position 9: expected `-> ACTIONS` or the end of the rule, found 'now'");
  EXPECT_EQ(errorOf("failed -> notify stop"),
            "alert rule 'failed -> notify stop': at position 18: expected ',' or the end of the rule, found 'stop'");
  // `for` belongs to thresholds only.
  EXPECT_NE(errorOf("stalled for 5m").find("at position 9: expected `-> ACTIONS`"), std::string::npos);
  EXPECT_NE(errorOf("gpu_util < 30% for 1m for 2m").find("at position 23: expected `-> ACTIONS`"), std::string::npos);
}

TEST(AlertRules, IsNanOnlyForTheLoss) {
  EXPECT_EQ(errorOf("gpu_util is nan"),
            "alert rule 'gpu_util is nan': at position 10: expected a comparison (<, <=, >, >=), found 'is'");
  EXPECT_EQ(errorOf("loss is number"),
            "alert rule 'loss is number': at position 9: expected `nan` (as in `loss is nan`), found 'number'");
  EXPECT_NE(errorOf("loss = 3").find("expected a comparison (<, <=, >, >=) or `is nan`, found '='"), std::string::npos);
}

TEST(AlertRules, ParseRulesReturnsTheFirstError) {
  auto all = parseRules({"failed", "gpu_util < 30%", "eta > 6h"});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[1].kpi, "gpu_util");
  auto bad = parseRules({"failed", "bogus", "gpu_utl"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("alert rule 'bogus'"), std::string::npos);
}

TEST(AlertRules, Holds) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Rule less = parsed("gpu_util < 30");
  EXPECT_TRUE(holds(less, 29.9));
  EXPECT_FALSE(holds(less, 30));
  EXPECT_FALSE(holds(less, nan));
  EXPECT_TRUE(holds(parsed("gpu_util <= 30"), 30));
  EXPECT_FALSE(holds(parsed("cost > 40"), 40));
  EXPECT_TRUE(holds(parsed("cost >= 40"), 40));
  const Rule isNan = parsed("loss is nan");
  EXPECT_TRUE(holds(isNan, nan));
  EXPECT_FALSE(holds(isNan, std::numeric_limits<double>::infinity()));
  EXPECT_FALSE(holds(isNan, 0.5));
  EXPECT_FALSE(holds(parsed("failed"), 0));
}

TEST(AlertRules, DefaultRules) {
  const auto rules = defaultRules();
  ASSERT_EQ(rules.size(), 4u);
  const char* names[] = {"failed", "stalled", "restarted", "finished"};
  for (std::size_t i = 0; i < rules.size(); ++i) {
    EXPECT_EQ(rules[i].kpi, names[i]);
    EXPECT_EQ(rules[i].text, names[i]);
    EXPECT_EQ(rules[i].op, Op::kEvent);
    EXPECT_EQ(rules[i].actions, kNotifyOnly);
  }
}

TEST(AlertRules, CatalogueNamesUnitsAndScopes) {
  ASSERT_EQ(kpiCatalogue().size(), 16u);
  EXPECT_EQ(kpiCatalogue().front().name, "gpu_util");
  ASSERT_NE(findKpi("disk_free"), nullptr);
  EXPECT_EQ(findKpi("disk_free")->scope, Scope::kNode);
  EXPECT_EQ(findKpi("eta")->unit, Unit::kSeconds);
  // MFU is a fraction in the KPIs and a percentage in rules, like exposed_comm (docs/kpis.md, MFU).
  ASSERT_NE(findKpi("mfu"), nullptr);
  EXPECT_EQ(findKpi("mfu")->unit, Unit::kPercent);
  EXPECT_EQ(findKpi("mfu")->scope, Scope::kJob);
  EXPECT_EQ(findKpi("stalled")->unit, Unit::kEvent);
  EXPECT_EQ(findKpi("nope"), nullptr);
  EXPECT_EQ(unitName(Unit::kCelsius), "°C");
  EXPECT_EQ(unitName(Unit::kPercent), "%");
  EXPECT_EQ(opText(Op::kIsNan), "is nan");
  EXPECT_EQ(actionName(Action::kCheckpoint), "checkpoint");
}

}  // namespace
}  // namespace lockstep::alerts
