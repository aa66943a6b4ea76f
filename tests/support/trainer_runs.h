#pragma once
// What tests of lockstep-trainer runs share: its command line, and comparing what two runs wrote
// (their weight files, their losses step by step).

#include <cmath>
#include <map>
#include <string>
#include <vector>

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

// Global losses by step from a metrics file (rank 0's lines).
inline std::map<std::uint64_t, double> globalLosses(const std::string& metrics) {
  std::map<std::uint64_t, double> out;
  for (const auto& line : readJsonLines(metrics)) {
    if (line["rank"] == 0) out[line["step"].get<std::uint64_t>()] = line["global_loss"].get<double>();
  }
  return out;
}

}  // namespace lockstep::test
