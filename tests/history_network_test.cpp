// Issue 31: the nodes' network in the history (schema 6) and in the reports that read it back; a
// file of the previous schema opens and migrates; nodes are listed in natural order.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "lockstep/history/history.h"
#include "lockstep/report/report.h"
#include "support/sql_support.h"
#include "support/test_support.h"

namespace lockstep::history {
namespace {

using test::TempDir;

constexpr std::int64_t kT0 = 1'700'000'000'000'000;
constexpr std::int64_t kSecond = 1'000'000;

// What the file holds, read behind the history's back.
std::int64_t count(const std::string& path, const std::string& sql) { return test::sqlCount(path, sql); }

JobSpec spec(const std::string& id, const std::vector<std::string>& nodes) {
  JobSpec s;
  s.jobId = id;
  s.layers = {8, 16, 4};
  s.dataset = SyntheticDataset{.samples = 1024, .dim = 8, .classes = 4};
  s.steps = 10;
  s.worldSize = static_cast<std::uint32_t>(nodes.size());
  std::map<std::string, std::uint32_t> local;
  for (std::uint32_t r = 0; r < s.worldSize; ++r) s.ranks.push_back(RankPlacement{r, nodes[r], local[nodes[r]]++, {}});
  return s;
}

JobStatus status(const JobSpec& s, JobState state, std::int64_t endedUs = 0) {
  JobStatus st;
  st.spec = s;
  st.state = state;
  st.startedUnixUs = kT0;
  st.endedUnixUs = endedUs;
  return st;
}

// An interface's counters at time t: 10 MB/s in, 1 MB/s out since kT0 - 100 s.
StreamMessage net(const std::string& node, std::int64_t t) {
  NetSample n;
  n.node = node;
  n.interface = "eth0";
  n.timeUnixUs = t;
  const auto seconds = static_cast<std::uint64_t>((t - (kT0 - 100 * kSecond)) / kSecond);
  n.rxBytes = 10'000'000 * seconds;
  n.txBytes = 1'000'000 * seconds;
  n.linkBitsPerSecond = 10'000'000'000ull;
  return StreamMessage{0, node, n};
}

// Issue 31: node1's network while its job runs (and for 5 s after it ended) is kept; node2, where
// no recorded job runs, is not; the job's replay gives node1's tracker, and its reports show it.
TEST(HistoryNetwork, ANodesNetworkIsKeptWhileARecordedJobRunsOnItAndComesBackWithTheJob) {
  TempDir dir;
  const std::string path = dir.file("h.db");
  auto h = History::open(path);
  ASSERT_TRUE(h) << h.error().message;
  const JobSpec s = spec("net-1", {"node1", "node1"});
  ASSERT_TRUE(h->recordJob("node1", status(s, JobState::kRunning)));
  // An agent's buffer, fetched from its start: what its node did before the job is not the job's.
  std::vector<StreamMessage> batch = {net("node1", kT0 - 20 * kSecond)};
  for (std::int64_t t = kT0; t <= kT0 + 6 * kSecond; t += kSecond) {
    batch.push_back(net("node1", t));
    batch.push_back(net("node2", t));
  }
  ASSERT_TRUE(h->recordMessages(batch));
  ASSERT_TRUE(h->recordJob("node1", status(s, JobState::kFinished, kT0 + 6 * kSecond)));
  ASSERT_TRUE(h->recordMessages(std::vector{net("node1", kT0 + 8 * kSecond), net("node1", kT0 + 30 * kSecond)}));
  ASSERT_TRUE(h->recordMessages(std::vector{net("node1", kT0 + 8 * kSecond)})) << "a replayed sample is stored once";
  EXPECT_EQ(count(path, "SELECT count(*) FROM net_samples WHERE node = 'node1'"), 8) << "from the start to 5 s after the end";
  EXPECT_EQ(count(path, "SELECT count(*) FROM net_samples WHERE node = 'node2'"), 0) << "no recorded job ran there";

  auto replayed = h->replayJob("net-1");
  ASSERT_TRUE(replayed) << replayed.error().message;
  ASSERT_EQ(replayed->nodes.size(), 1u);
  const auto totals = replayed->nodes.at("node1").totals();
  ASSERT_EQ(totals.size(), 1u);
  EXPECT_EQ(totals[0].rxBytes, 80'000'000u) << "kT0 to kT0 + 8 s at 10 MB/s";
  EXPECT_DOUBLE_EQ(totals[0].peakRxBytesPerSecond, 10e6);

  auto data = report::load(*h, "net-1", kT0 + 60 * kSecond);
  ASSERT_TRUE(data) << data.error().message;
  ASSERT_EQ(data->network.size(), 1u);
  EXPECT_EQ(data->network[0].node, "node1");
  EXPECT_FALSE(data->network[0].series.at("eth0").empty());
  const auto json = nlohmann::json::parse(report::json(*data));
  ASSERT_EQ(json["network"].size(), 1u);
  EXPECT_EQ(json["network"][0]["interfaces"][0]["interface"], "eth0");
  EXPECT_EQ(json["network"][0]["interfaces"][0]["rx_bytes"], 80'000'000);
  const std::string html = report::html(report::document(*data));
  EXPECT_NE(html.find("Network interfaces"), std::string::npos);
  EXPECT_NE(html.find("node1 eth0 \u2193"), std::string::npos) << "the chart's series";

  ASSERT_TRUE(report::write(*h, "net-1", report::Format::kCsv, dir.file("r.csv"), kT0));
  std::ifstream csv(report::networkCsvPath(dir.file("r.csv")));
  std::string header, first;
  std::getline(csv, header);
  std::getline(csv, first);
  EXPECT_EQ(header.rfind("node,interface,time_unix_us,rx_bytes,tx_bytes,", 0), 0u) << header;
  EXPECT_EQ(first.rfind("node1,eth0,", 0), 0u) << first;

  ASSERT_TRUE(h->remove("net-1"));
  EXPECT_EQ(count(path, "SELECT count(*) FROM net_samples"), 0) << "the network goes with the only job it was kept for";
}

// Compacted, a bucket keeps its newest counters: the bytes between the kept samples are exact.
TEST(HistoryNetwork, CompactionKeepsEachBucketsNewestCounters) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"), Options{0, 10});
  ASSERT_TRUE(h);
  const JobSpec s = spec("net-2", {"node1"});
  ASSERT_TRUE(h->recordJob("node1", status(s, JobState::kRunning)));
  std::vector<StreamMessage> batch;
  for (std::int64_t t = kT0; t < kT0 + 40 * kSecond; t += kSecond / 5) batch.push_back(net("node1", t));
  ASSERT_TRUE(h->recordMessages(batch));
  const auto stats = h->compact(kT0 + 100 * kSecond);
  ASSERT_TRUE(stats) << stats.error().message;
  EXPECT_EQ(stats->netRowsBefore, 200u);
  EXPECT_EQ(stats->netRowsAfter, 4u) << "one row per 10 s bucket";
  std::vector<NetSample> kept;
  ASSERT_TRUE(h->forEachNetSample("net-2", [&](const NetSample& n) { kept.push_back(n); }));
  ASSERT_EQ(kept.size(), 4u);
  EXPECT_EQ(kept.back().timeUnixUs, kT0 + 40 * kSecond - kSecond / 5) << "the newest sample of the last bucket";
  auto replayed = h->replayJob("net-2");
  ASSERT_TRUE(replayed);
  EXPECT_EQ(replayed->nodes.at("node1").totals()[0].rxBytes, kept.back().rxBytes - kept.front().rxBytes);
}

std::string readText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Issue 31: a history written by the previous schema (5) opens, migrates to 6 and keeps its job:
// an event of no rank, stored then as rank -1, reads back without a rank, and is still stored once.
TEST(HistoryNetwork, ASchemaFiveFileOpensMigratesAndKeepsItsJob) {
  TempDir dir;
  const std::string path = dir.file("v5.db");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    char* error = nullptr;
    ASSERT_EQ(sqlite3_exec(db, readText(LOCKSTEP_FIXTURES "/history-v5.sql").c_str(), nullptr, nullptr, &error), SQLITE_OK)
        << (error ? error : "");
    sqlite3_close(db);
  }
  ASSERT_EQ(count(path, "PRAGMA user_version"), 5);
  auto h = History::open(path);
  ASSERT_TRUE(h) << h.error().message;
  EXPECT_EQ(count(path, "PRAGMA user_version"), kSchemaVersion);
  auto job = h->job("old-1");
  ASSERT_TRUE(job) << job.error().message;
  EXPECT_EQ(job->state, JobState::kFinished);
  EXPECT_EQ(job->stepReports, 6u);
  auto events = h->events("old-1");
  ASSERT_TRUE(events);
  ASSERT_EQ(events->size(), 3u);
  EXPECT_FALSE((*events)[0].rank.has_value()) << "rank -1 of schema 5 is no rank";
  EXPECT_EQ((*events)[1].rank, 0u);
  StreamMessage again{0, "node1", (*events)[0]};
  ASSERT_TRUE(h->recordMessages(std::vector{again}));
  EXPECT_EQ(count(path, "SELECT count(*) FROM events"), 3) << "the same event without a rank is stored once";
  ASSERT_TRUE(h->refreshFinalKpis());
  auto data = report::load(*h, "old-1", kT0);
  ASSERT_TRUE(data) << data.error().message;
  EXPECT_EQ(data->kpis.step, 3u);
  EXPECT_TRUE(data->network.empty()) << "schema 5 kept no network";
  auto reopened = History::open(path);
  ASSERT_TRUE(reopened) << reopened.error().message;
}

// Issue 31: twelve nodes, named as people name them, come back in natural order (node2 before
// node10) in the job's record and in its report's nodes table.
TEST(HistoryNetwork, TwelveNodesAreListedInNaturalOrder) {
  TempDir dir;
  auto h = History::open(dir.file("h.db"));
  ASSERT_TRUE(h);
  std::vector<std::string> nodes;
  for (int i = 12; i >= 1; --i) nodes.push_back("node" + std::to_string(i));
  const JobSpec s = spec("twelve", nodes);
  for (const auto& node : nodes) {
    NodeHello hello;
    hello.nodeName = node;
    hello.host = node;
    ASSERT_TRUE(h->recordNode(hello));
    ASSERT_TRUE(h->recordJob(node, status(s, JobState::kFinished, kT0 + kSecond)));
  }
  auto job = h->job("twelve");
  ASSERT_TRUE(job);
  std::vector<std::string> order;
  for (const auto& part : job->parts) order.push_back(part.node);
  std::vector<std::string> expected(nodes.rbegin(), nodes.rend());
  EXPECT_EQ(order, expected);
  auto data = report::load(*h, "twelve", kT0);
  ASSERT_TRUE(data);
  const auto doc = report::document(*data);
  for (const auto& section : doc.sections) {
    if (section.heading != "Nodes and GPUs") continue;
    std::vector<std::string> rows;
    for (const auto& row : section.tables.at(0).rows) rows.push_back(row.at(0));
    EXPECT_EQ(rows, expected);
  }
}

}  // namespace
}  // namespace lockstep::history
