#pragma once
// What tests of lockstep-trainer runs share: its command line, and comparing what two runs wrote
// (their weight files, their losses step by step).

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "safetensors.h"
#include "support/test_support.h"

namespace lockstep::test {

inline std::vector<std::string> trainer(std::vector<std::string> args) {
  args.insert(args.begin(), trainerPath());
  return args;
}

// Norm-wise relative difference per tensor, the largest over the file.
inline double maxRelativeDifference(const std::string& pathA, const std::string& pathB) {
  auto a = trainer::readSafetensors(pathA);
  auto b = trainer::readSafetensors(pathB);
  EXPECT_TRUE(a.ok() && b.ok());
  if (!a.ok() || !b.ok()) return INFINITY;
  EXPECT_EQ(a->tensors.size(), b->tensors.size());
  double worst = 0;
  for (const auto& [name, ta] : a->tensors) {
    const auto& tb = b->tensors.at(name);
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < ta.data.size(); ++i) {
      diff += std::pow(double(ta.data[i]) - tb.data[i], 2);
      norm += std::pow(double(ta.data[i]), 2);
    }
    worst = std::max(worst, std::sqrt(diff / norm));
  }
  return worst;
}

struct TrainerRun {
  ProcessResult process;
  std::vector<nlohmann::json> lines;  // its metrics, once it succeeded
};

// lockstep-trainer with `job`, then `more`, writing NAME.jsonl and NAME.safetensors in dir.
inline TrainerRun train(const TempDir& dir, const std::string& name, const std::vector<std::string>& job,
                        const std::vector<std::string>& more, const Env& env = {}) {
  TrainerRun run;
  run.process = runProcess(trainer(join(job, join(more, {"--metrics-out", dir.file(name + ".jsonl"), "--save-weights",
                                                         dir.file(name + ".safetensors")}))),
                           env, dir);
  if (run.process.status.success()) run.lines = readJsonLines(dir.file(name + ".jsonl"));
  return run;
}

// A step report line's collective of this kind ("reduce_scatter"), or null.
inline nlohmann::json collectiveOf(const nlohmann::json& line, const std::string& kind) {
  for (const auto& c : line.value("collectives", nlohmann::json::array())) {
    if (c["kind"] == kind) return c;
  }
  return nullptr;
}

// A GPU job of a kind the CUDA backend runs: validation took it (no "CPU backend only"), and where
// it failed, it was for want of a GPU or of the CUDA build; where no GPU exists it must fail so.
inline void expectTheGpuBackendTakesIt(const TrainerRun& run) {
  EXPECT_EQ(run.process.err.find("CPU backend only"), std::string::npos) << run.process.err;
  if (::access("/dev/nvidia0", F_OK) != 0) EXPECT_FALSE(run.process.status.success());
  if (!run.process.status.success()) {  // trains where there is a GPU
    EXPECT_TRUE(run.process.err.find("--backend cuda needs") != std::string::npos ||
                run.process.err.find("built without CUDA") != std::string::npos)
        << run.process.err;
  }
}

// An asynchronous run's step reports: how many updates each rank's gradients made, and each
// server update's loss. Every report carries a staleness within `bound`, and each update is
// reported once (by the rank whose gradient made it).
struct AsyncUpdates {
  std::map<int, int> perRank;
  std::map<std::uint64_t, double> lossByStep;
};
inline AsyncUpdates asyncUpdates(const std::vector<nlohmann::json>& lines, int bound) {
  AsyncUpdates out;
  for (const auto& l : lines) {
    ++out.perRank[l["rank"].get<int>()];
    const nlohmann::json staleness = l.value("staleness", nlohmann::json());
    EXPECT_TRUE(staleness.is_number()) << l.dump();
    if (staleness.is_number()) EXPECT_LE(staleness.get<int>(), bound) << l.dump();
    EXPECT_TRUE(out.lossByStep.emplace(l["step"].get<std::uint64_t>(), l["global_loss"].get<double>()).second)
        << "one update per step number: " << l.dump();
  }
  return out;
}

// Global losses by step from a metrics file (rank 0's lines).
inline std::map<std::uint64_t, double> globalLosses(const std::string& metrics) {
  std::map<std::uint64_t, double> out;
  for (const auto& line : readJsonLines(metrics)) {
    if (line["rank"] == 0) out[line["step"].get<std::uint64_t>()] = line["global_loss"].get<double>();
  }
  return out;
}

// Run `resumed` (the trainer's `name`s in `dir`), resumed from a checkpoint for its last `steps`
// steps, against the uninterrupted run `whole`: the same global losses and final weights, bit for bit.
inline void expectResumedAsWhole(const TempDir& dir, const std::string& whole, const std::string& resumed,
                                 std::size_t steps) {
  const auto expected = globalLosses(dir.file(whole + ".jsonl")), got = globalLosses(dir.file(resumed + ".jsonl"));
  ASSERT_EQ(got.size(), steps) << resumed;
  for (const auto& [step, loss] : got) EXPECT_EQ(loss, expected.at(step)) << resumed << ", step " << step;
  EXPECT_EQ(maxRelativeDifference(dir.file(whole + ".safetensors"), dir.file(resumed + ".safetensors")), 0.0) << resumed;
}

}  // namespace lockstep::test
