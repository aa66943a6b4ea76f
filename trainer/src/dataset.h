#pragma once
// Training data in memory: float32 features [samples, dim] and int32 labels [samples].

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::trainer {

struct Dataset {
  std::uint64_t samples = 0;
  std::uint32_t dim = 0;
  std::uint32_t classes = 0;  // labels lie in [0, classes)
  std::vector<float> features;
  std::vector<std::int32_t> labels;

  const float* row(std::uint64_t i) const { return features.data() + i * dim; }
  // Copies the rows `indices` names into x [n, dim] and their labels into y [n].
  void gather(const std::vector<std::uint32_t>& indices, float* x, std::int32_t* y) const {
    for (std::size_t i = 0; i < indices.size(); ++i) {
      std::copy_n(row(indices[i]), dim, x + i * dim);
      y[i] = labels[indices[i]];
    }
  }
};

// Features uniform in [-sqrt(3), sqrt(3)] (zero mean, unit variance); labels are the argmax of a
// random teacher MLP (dim -> 64 tanh -> classes) with per-class centred logits, so classes are
// roughly balanced and the task is learnable. Deterministic in the seed, on every machine.
Result<Dataset> makeSyntheticDataset(const SyntheticDataset& spec);

// Loads NumPy files: features float32 [N, D] C-order, labels any integer dtype [N] in [0, classes).
Result<Dataset> loadNpyDataset(const NpyDataset& spec, std::uint32_t expectedDim, std::uint32_t classes);

// The job's dataset, checked against its first and last layer sizes.
Result<Dataset> loadDataset(const JobSpec& spec);

}  // namespace lockstep::trainer
