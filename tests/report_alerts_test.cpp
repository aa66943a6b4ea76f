// A job's alerts (docs/alerts.md) in its reports and its trace, over a real SQLite history: the
// alert events as the supervising agent appends them (alerts::alertEvent), recorded through
// History's recording API, read back into the JSON report (its schema), the HTML and PDF reports'
// Alerts section (escaped: a rule holds '<' and '>') and the trace's instant events.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lockstep/alerts/alert.h"
#include "lockstep/history/history.h"
#include "lockstep/report/report.h"
#include "lockstep/report/trace.h"
#include "report_fixtures.h"
#include "support/test_support.h"
#if LOCKSTEP_REPORT_PDF
#include "lockstep/report/report_pdf.h"
#endif

namespace lockstep::report {
namespace {

using namespace fixtures;
using test::TempDir;

const std::string kNode = "node-a";
constexpr std::int64_t kClockAheadUs = 2 * kSecond;  // node-a stamps everything 2 s late
constexpr std::uint64_t kSteps = 20;
const std::string kStraggler = "straggler_wait > 20% for 2s -> notify";
const std::string kExposed = "exposed_comm > 40% for 2m -> notify";
const std::string kNan = "loss is nan -> notify,stop";
const std::string kWebhook = "https://hooks.example.org/services/T000/s3cr3t";

alerts::Alert alert(const std::string& jobId, const std::string& rule, const std::string& kpi, alerts::State state,
                    std::optional<double> value, const std::string& unit, std::int64_t timeUs) {
  alerts::Alert a;
  a.jobId = jobId;
  a.rule = rule;
  a.kpi = kpi;
  a.state = state;
  a.value = value;
  a.unit = unit;
  a.startedAtUs = timeUs - 300'000;
  a.timeUs = timeUs;
  a.actions = {alerts::Action::kNotify};
  a.text = "job " + jobId + ": " + rule.substr(0, rule.find(" ->")) + " is " + std::string(alerts::stateName(state));
  return a;
}

JobEvent undelivered(const std::string& jobId, std::int64_t timeUs) {
  JobEvent e = event(jobId, JobEventKind::kAlertUndelivered, timeUs);
  e.message =
      "alert '" + kStraggler + "' (firing) was not delivered to https://hooks.example.org/…: HTTP 500 (5 attempts)";
  return e;
}

class AlertsInReports : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opened = history::History::open(dir_.file("history.db"));
    ASSERT_TRUE(opened) << opened.error().message;
    history_.emplace(std::move(*opened));
    NodeHello hello;
    hello.nodeName = kNode;
    hello.host = "a.example";
    hello.cpuCores = 32;
    hello.memoryTotalBytes = 256ull << 30;
    ASSERT_TRUE(history_->recordNode(hello));
    ASSERT_TRUE(history_->recordClock(kNode, ClockOffset{kClockAheadUs, 100, kT0}));

    // job-9: rules and a webhook; straggler_wait fires on rank 1 (waiting for data) and resolves,
    // exposed_comm fires and never resolves, a NaN loss fires unnotified; a webhook refuses one.
    JobSpec alerted = spec("job-9", 2);
    alerted.steps = kSteps;
    alerted.alertRules = {kStraggler, kExposed, kNan};
    alerted.notify = {kWebhook};
    std::vector<StreamMessage> messages = steps(alerted);
    auto straggler = alert("job-9", kStraggler, "straggler_wait", alerts::State::kFiring, 34.2, "%", kT0 + 500'000);
    straggler.ranks = {1};
    straggler.nodes = {kNode};
    straggler.cause = "data wait";
    straggler.history = {{kT0 + 300'000, 31.0}, {kT0 + 500'000, 34.2}};
    auto resolved = straggler;
    resolved.state = alerts::State::kResolved;
    resolved.value = 4.5;
    resolved.timeUs = kT0 + 1'500'000;
    resolved.text = "job job-9: straggler_wait > 20% for 2s is resolved";
    auto exposed = alert("job-9", kExposed, "exposed_comm", alerts::State::kFiring, 45.5, "%", kT0 + 1'000'000);
    auto nan = alert("job-9", kNan, "loss", alerts::State::kFiring, std::numeric_limits<double>::quiet_NaN(), "",
                     kT0 + 1'800'000);
    nan.notify = false;
    nan.notNotifiedWhy = "rate limited: 10 changes in the last minute";
    for (const JobEvent& e : {alerts::alertEvent(straggler), undelivered("job-9", kT0 + 600'000),
                              alerts::alertEvent(exposed), alerts::alertEvent(resolved), alerts::alertEvent(nan)}) {
      messages.push_back({0, kNode, e});
    }
    record(alerted, messages);

    JobSpec quiet = spec("job-quiet", 2);  // rules, none fired
    quiet.steps = kSteps;
    quiet.alertRules = {kExposed};
    record(quiet, steps(quiet));
    JobSpec plain = spec("job-plain", 2);  // no rules at all
    plain.steps = kSteps;
    record(plain, steps(plain));
  }

  std::vector<StreamMessage> steps(const JobSpec& s) {
    std::vector<StreamMessage> out;
    out.push_back({0, kNode, event(s.jobId, JobEventKind::kStarted, kT0)});
    for (std::uint64_t step = 1; step <= kSteps; ++step) {
      for (const auto& p : s.ranks) {
        StepReport r;
        r.jobId = s.jobId;
        r.rank = p.rank;
        r.worldSize = s.worldSize;
        r.step = step;
        r.samples = s.batchPerRank;
        r.loss = 1.0f;
        r.globalLoss = r.loss;
        r.dataTimeUs = 5'000;
        r.computeTimeUs = 60'000;
        r.exposedCommTimeUs = 20'000;
        r.allreduceTimeUs = 30'000;
        r.bytesReduced = 1 << 20;
        r.stepTimeUs = 100'000;
        r.timeUnixUs = kT0 + static_cast<std::int64_t>(step) * 100'000;
        out.push_back({0, kNode, r});
      }
    }
    out.push_back({0, kNode, event(s.jobId, JobEventKind::kFinished, kEndUs)});
    return out;
  }

  void record(const JobSpec& s, const std::vector<StreamMessage>& messages) {
    JobStatus status;
    status.spec = s;
    status.state = JobState::kRunning;
    status.startedUnixUs = kT0;
    ASSERT_TRUE(history_->recordJob(kNode, status));
    ASSERT_TRUE(history_->recordMessages(messages));
    status.state = JobState::kFinished;
    status.endedUnixUs = kEndUs;
    ASSERT_TRUE(history_->recordJob(kNode, status));
  }

  std::string html(const std::string& jobId) {
    const std::string path = dir_.file(jobId + ".html");
    EXPECT_TRUE(write(*history_, jobId, Format::kHtml, path, now_));
    return test::readText(path);
  }

  static constexpr std::int64_t kEndUs = kT0 + static_cast<std::int64_t>(kSteps + 1) * 100'000;
  TempDir dir_;
  std::optional<history::History> history_;
  const std::int64_t now_ = kT0 + 3600 * kSecond;
};

TEST_F(AlertsInReports, TheModelHoldsEachChangeAndTheUndeliveredWebhook) {
  const auto loaded = load(*history_, "job-9", now_);
  ASSERT_TRUE(loaded) << loaded.error().message;
  ASSERT_EQ(loaded->alerts.size(), 4u);
  EXPECT_EQ(loaded->alerts[0].rule, kStraggler);
  EXPECT_EQ(loaded->alerts[0].ranks, std::vector<std::uint32_t>{1});
  EXPECT_EQ(loaded->alerts[0].cause, "data wait");
  EXPECT_EQ(loaded->alerts[1].rule, kExposed);
  EXPECT_EQ(loaded->alerts[2].state, alerts::State::kResolved);
  ASSERT_TRUE(loaded->alerts[3].value);
  EXPECT_TRUE(std::isnan(*loaded->alerts[3].value));
  ASSERT_EQ(loaded->undeliveredAlerts.size(), 1u);
  EXPECT_EQ(loaded->undeliveredAlerts[0].timeUnixUs, kT0 + 600'000);
}

TEST_F(AlertsInReports, TheJsonReportListsThemAndMatchesItsSchema) {
  const std::string path = dir_.file("job-9.json");
  ASSERT_TRUE(write(*history_, "job-9", Format::kJson, path, now_));
  const std::string text = test::readText(path);
  const auto j = nlohmann::json::parse(text);
  ASSERT_EQ(j["alerts"].size(), 4u) << j["alerts"].dump(2);
  const auto& first = j["alerts"][0];
  EXPECT_EQ(first["job"], "job-9");
  EXPECT_EQ(first["rule"], kStraggler);
  EXPECT_EQ(first["kpi"], "straggler_wait");
  EXPECT_EQ(first["state"], "firing");
  EXPECT_DOUBLE_EQ(first["value"].get<double>(), 34.2);
  EXPECT_EQ(first["unit"], "%");
  EXPECT_EQ(first["time_us"], kT0 + 500'000);
  EXPECT_EQ(first["ranks"], nlohmann::json::array({1}));
  EXPECT_EQ(first["nodes"], nlohmann::json::array({kNode}));
  EXPECT_EQ(first["cause"], "data wait");
  EXPECT_EQ(first["actions"], nlohmann::json::array({"notify"}));
  EXPECT_EQ(first["notify"], true);
  EXPECT_EQ(j["alerts"][2]["state"], "resolved");
  EXPECT_EQ(j["alerts"][3]["value"], "nan");  // JSON has no NaN: a NaN loss is what the rule reports
  EXPECT_EQ(j["alerts"][3]["notify"], false);
  ASSERT_EQ(j["undelivered"].size(), 1u);
  EXPECT_EQ(j["undelivered"][0]["time_us"], kT0 + 600'000);
  EXPECT_NE(j["undelivered"][0]["message"].get<std::string>().find("HTTP 500"), std::string::npos);
  expectMatchesSchema(text);
  // The job's webhook, in its spec, shown without its secret: a report is passed around.
  EXPECT_EQ(text.find("s3cr3t"), std::string::npos);
  EXPECT_EQ(j["job"]["spec"]["notify"], nlohmann::json::array({"https://hooks.example.org/…"})) << j["job"]["spec"].dump();

  const std::string plain = dir_.file("job-plain.json");
  ASSERT_TRUE(write(*history_, "job-plain", Format::kJson, plain, now_));
  const std::string plainText = test::readText(plain);
  const auto p = nlohmann::json::parse(plainText);
  EXPECT_EQ(p["alerts"], nlohmann::json::array());
  EXPECT_EQ(p["undelivered"], nlohmann::json::array());
  expectMatchesSchema(plainText);
}

TEST_F(AlertsInReports, TheHtmlReportHasAnEscapedAlertsSection) {
  const std::string page = html("job-9");
  const auto at = page.find("<h2>Alerts</h2>");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(at, page.find("<h2>Events</h2>"));
  const std::string section = page.substr(at, page.find("</section>", at) - at);
  // Every '<' and '>' of a rule escaped, in the section and in the events table alike.
  EXPECT_NE(section.find("exposed_comm &gt; 40%"), std::string::npos) << section;
  EXPECT_EQ(page.find("exposed_comm > 40"), std::string::npos);
  EXPECT_EQ(page.find("-> notify"), std::string::npos);
  EXPECT_NE(section.find("<th>Time</th><th>State</th><th>Rule</th><th>Value</th><th>About</th><th>Text</th>"),
            std::string::npos)
      << section;
  // The straggler fired and resolved; exposed_comm and the NaN loss never resolved.
  EXPECT_NE(
      section.find("<td>firing</td><td>straggler_wait &gt; 20% for 2s -&gt; notify</td><td class=\"num\">34.2%</td>"
                   "<td>rank 1 on node-a; data wait</td>"),
      std::string::npos)
      << section;
  EXPECT_NE(section.find("<td>resolved</td><td>straggler_wait &gt; 20%"), std::string::npos) << section;
  EXPECT_NE(section.find("<td>firing, never resolved</td><td>exposed_comm &gt; 40% for 2m -&gt; notify</td>"),
            std::string::npos)
      << section;
  EXPECT_NE(section.find("<td>firing, never resolved</td><td>loss is nan -&gt; notify,stop</td><td>NaN</td>"),
            std::string::npos)
      << section;
  EXPECT_NE(section.find("2 alerts fired and never resolved"), std::string::npos) << section;
  EXPECT_NE(section.find("(not notified: rate limited"), std::string::npos) << section;
  // The webhook that refused, below; its URL as the agent redacted it, the job's own never shown.
  EXPECT_GT(section.find("Webhooks that did not take an alert"), section.find("loss is nan"));
  EXPECT_NE(section.find("https://hooks.example.org/…: HTTP 500"), std::string::npos) << section;
  EXPECT_NE(section.find("1 webhook"), std::string::npos) << section;
  EXPECT_EQ(page.find("s3cr3t"), std::string::npos);

  const std::string quiet = html("job-quiet");
  const auto quietAt = quiet.find("<h2>Alerts</h2>");
  ASSERT_NE(quietAt, std::string::npos);
  EXPECT_NE(quiet.find("<p>No alert fired.</p>", quietAt), std::string::npos);
  EXPECT_EQ(html("job-plain").find("<h2>Alerts</h2>"), std::string::npos) << "no rules, no alert: no section";
}

#if LOCKSTEP_REPORT_PDF
TEST_F(AlertsInReports, ThePdfReportHasTheAlertsSection) {
  const std::string path = dir_.file("job-9.pdf");
  const auto written = writePdf(*history_, "job-9", path, now_);
  ASSERT_TRUE(written) << written.error().message;
  const auto r = test::runProcess({"/usr/bin/pdftotext", "-layout", path, "-"}, {}, dir_, std::chrono::seconds(30));
  ASSERT_TRUE(r.status.success()) << r.err;
  EXPECT_NE(r.out.find("Alerts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exposed_comm > 40%"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("never resolved"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Webhooks that did not take an alert"), std::string::npos) << r.out;
}
#endif

TEST_F(AlertsInReports, TheTraceHasAnInstantPerChangeOnTheClientsClock) {
  const std::string path = dir_.file("job-9.trace.json");
  ASSERT_TRUE(writeTrace(*history_, "job-9", {}, path));
  const auto trace = nlohmann::json::parse(test::readText(path));
  const std::int64_t baseUs = trace["baseTimeNanoseconds"].get<std::int64_t>() / 1000;
  std::vector<nlohmann::json> changes;
  bool undeliveredSeen = false;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("cat", "") == "alert") changes.push_back(e);
    EXPECT_NE(e["name"], "alert_firing") << "an alert's change is written once, as the alert";
    if (e["name"] == "alert_undelivered") undeliveredSeen = true;
  }
  EXPECT_TRUE(undeliveredSeen);
  ASSERT_EQ(changes.size(), 4u);
  const auto& first = changes[0];
  EXPECT_EQ(first["ph"], "i");
  EXPECT_EQ(first["s"], "g");
  EXPECT_EQ(first["name"], kStraggler);
  EXPECT_EQ(first["args"]["state"], "firing");
  EXPECT_DOUBLE_EQ(first["args"]["value"].get<double>(), 34.2);
  EXPECT_EQ(first["args"]["text"], "job job-9: straggler_wait > 20% for 2s is firing");
  EXPECT_EQ(first["args"]["ranks"], nlohmann::json::array({1}));
  EXPECT_EQ(first["args"]["cause"], "data wait");
  // Raised by the agent on node-a, whose clock is 2 s ahead: on the trace's clock 2 s earlier.
  EXPECT_EQ(first["ts"].get<std::int64_t>() + baseUs, kT0 + 500'000 - kClockAheadUs);
  EXPECT_EQ(changes[1]["name"], kExposed);
  EXPECT_EQ(changes[2]["args"]["state"], "resolved");
  EXPECT_EQ(changes[3]["args"]["value"], "nan");
}

}  // namespace
}  // namespace lockstep::report
