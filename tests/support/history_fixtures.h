#pragma once
// The job history's tests share these: a job spec, its statuses, a job's stream of records, and
// raw SQL on the file (tests/history_test.cpp, tests/history_schema_test.cpp).

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <functional>
#include <string>
#include <vector>

#include "lockstep/history/history.h"
#include "support/test_support.h"

namespace lockstep::history::test_fixtures {

inline constexpr std::int64_t kT0 = 1'800'000'000'000'000;  // a fixed start, in unix microseconds

inline JobSpec spec(const std::string& id, std::uint32_t ranks = 2, const std::string& name = "mnist-mlp") {
  JobSpec s;
  s.jobId = id;
  s.name = name;
  s.layers = {8, 16, 4};
  s.dataset = SyntheticDataset{.samples = 1024, .dim = 8, .classes = 4};
  s.steps = 10;
  s.worldSize = ranks;
  for (std::uint32_t r = 0; r < ranks; ++r) s.ranks.push_back(RankPlacement{r, r % 2 ? "node-b" : "node-a", r / 2, {}});
  return s;
}

inline JobStatus status(const JobSpec& s, JobState state, std::int64_t endedUs = 0) {
  JobStatus st;
  st.spec = s;
  st.state = state;
  st.startedUnixUs = kT0;
  st.endedUnixUs = endedUs;
  return st;
}

inline JobEvent event(const std::string& jobId, JobEventKind kind, std::int64_t timeUs) {
  JobEvent e;
  e.jobId = jobId;
  e.kind = kind;
  e.timeUnixUs = timeUs;
  return e;
}

inline StreamMessage message(const std::string& node, auto payload) { return StreamMessage{0, node, std::move(payload)}; }

// A job's stream: started, `steps` steps of every rank 100 ms apart, a GPU and a process sample per
// step, a checkpoint of every rank after step 5, and (when `finish`) the finished event.
inline std::vector<StreamMessage> stream(const JobSpec& s, std::uint64_t steps, bool finish,
                                  const std::function<void(StepReport&)>& shape = {}) {
  std::vector<StreamMessage> out;
  out.push_back(message("node-a", event(s.jobId, JobEventKind::kStarted, kT0)));
  for (std::uint64_t step = 1; step <= steps; ++step) {
    const std::int64_t t = kT0 + static_cast<std::int64_t>(step) * 100'000;
    for (const auto& p : s.ranks) {
      StepReport r;
      r.jobId = s.jobId;
      r.rank = p.rank;
      r.worldSize = s.worldSize;
      r.step = step;
      r.samples = s.batchPerRank;
      r.loss = 2.0f / static_cast<float>(step);
      r.globalLoss = r.loss;
      r.dataTimeUs = 5'000;
      r.computeTimeUs = 70'000 + 5'000 * p.rank;
      r.exposedCommTimeUs = 20'000;
      r.stepTimeUs = 100'000;
      r.timeUnixUs = t;
      r.lr = 0.01;
      r.optimizerTimeUs = 10'000;
      r.optimizerStateBytes = 4'000'000 + p.rank;
      r.staleness = 3;
      if (shape) shape(r);
      out.push_back(message(p.node, r));
      out.push_back(message(p.node, ProcessSample{s.jobId, p.rank, 1000 + p.rank, t, 95.0f, 1u << 20}));
      if (step == 5) out.push_back(message(p.node, PhaseReport{s.jobId, p.rank, s.worldSize, 0, "checkpoint", t + 50'000, 40'000, 5}));
    }
    GpuSample g;
    g.node = "node-a";
    g.jobId = s.jobId;
    g.timeUnixUs = t;
    g.utilizationPct = 80.0f;
    g.energyMillijoules = 1000 * step;
    out.push_back(message("node-a", g));
  }
  if (finish) out.push_back(message("node-a", event(s.jobId, JobEventKind::kFinished, kT0 + static_cast<std::int64_t>(steps + 1) * 100'000)));
  return out;
}

inline NodeHello hello(const std::string& node) {
  NodeHello h;
  h.nodeName = node;
  h.host = node + ".example";
  h.cpuCores = 32;
  h.memoryTotalBytes = 64ull << 30;
  h.gpus = {GpuInfo{0, "NVIDIA H200", "GPU-1", 141ull << 30}};
  h.agentVersion = "0.1.0";
  return h;
}

// Records a whole finished job on two nodes.
inline void recordFinished(History& h, const JobSpec& s, std::uint64_t steps = 10,
                    const std::function<void(StepReport&)>& shape = {}) {
  ASSERT_TRUE(h.recordNode(hello("node-a")));
  ASSERT_TRUE(h.recordNode(hello("node-b")));
  ASSERT_TRUE(h.recordJob("node-a", status(s, JobState::kRunning)));
  ASSERT_TRUE(h.recordJob("node-b", status(s, JobState::kRunning)));
  const auto messages = stream(s, steps, true, shape);
  ASSERT_TRUE(h.recordMessages(messages));
  const std::int64_t end = kT0 + static_cast<std::int64_t>(steps + 1) * 100'000;
  ASSERT_TRUE(h.recordJob("node-a", status(s, JobState::kFinished, end)));
  ASSERT_TRUE(h.recordJob("node-b", status(s, JobState::kFinished, end)));
}

inline std::int64_t count(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  std::int64_t n = -1;
  if (sqlite3_step(stmt) == SQLITE_ROW) n = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return n;
}

inline std::string textOf(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  std::string out;
  if (sqlite3_step(stmt) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return out;
}

inline void execSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  sqlite3_close(db);
}

}  // namespace lockstep::history::test_fixtures
