#pragma once
// What the report tests share: a fixed clock, a job spec and events by hand.

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "lockstep/protocol/types.h"
#include "support/test_support.h"

namespace lockstep::report::fixtures {

inline constexpr std::int64_t kT0 = 1'800'000'000'000'000;  // a fixed start, in unix microseconds
inline constexpr std::int64_t kSecond = 1'000'000;

inline JobEvent event(const std::string& jobId, JobEventKind kind, std::int64_t timeUs) {
  JobEvent e;
  e.jobId = jobId;
  e.kind = kind;
  e.timeUnixUs = timeUs;
  return e;
}

inline JobSpec spec(const std::string& id, std::uint32_t ranks) {
  JobSpec s;
  s.jobId = id;
  s.name = "mnist-mlp";
  s.backend = Backend::kCuda;
  s.layers = {784, 256, 10};
  s.dataset = SyntheticDataset{.samples = 65536, .dim = 784, .classes = 10};
  s.batchPerRank = 64;
  s.steps = 1000;
  s.targetLoss = 0.5;
  s.worldSize = ranks;
  for (std::uint32_t r = 0; r < ranks; ++r) s.ranks.push_back(RankPlacement{r, "node-a", r, r});
  s.prices = {2.5, 0.0, 0.3, "USD"};
  return s;
}

inline std::size_t count(std::string_view text, std::string_view what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string_view::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// Checks a JSON report against docs/report.schema.json (python3-jsonschema; skips without it).
inline void expectMatchesSchema(const std::string& jsonText) {
  test::TempDir dir;
  const std::string path = dir.file("report.json");
  std::ofstream(path) << jsonText;
  const auto probe = test::runProcess({"/usr/bin/python3", "-c", "import jsonschema"}, {}, dir);
  if (!probe.status.success()) GTEST_SKIP() << "python3-jsonschema is not installed";
  const auto run = test::runProcess({"/usr/bin/python3", "-c",
                                     "import json, sys, jsonschema\n"
                                     "schema = json.load(open(sys.argv[2]))\n"
                                     "jsonschema.Draft202012Validator.check_schema(schema)\n"
                                     "jsonschema.Draft202012Validator(schema).validate(json.load(open(sys.argv[1])))\n",
                                     path, LOCKSTEP_REPORT_SCHEMA},
                                    {}, dir);
  EXPECT_TRUE(run.status.success()) << run.err;
}

}  // namespace lockstep::report::fixtures
