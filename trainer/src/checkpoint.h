#pragma once
// Checkpoints and weight files, all safetensors with PyTorch nn.Linear names.
//
// A checkpoint is one file, dir/step-NNNNNNNN.safetensors, holding the weights (layers.{i}.weight,
// layers.{i}.bias), the optimizer state (optimizer.{buffer}.layers.{i}.weight, ...) and in its
// metadata the step, the data position and what the run must match to resume. It is written
// atomically (temp file, fsync, rename), so a crash leaves the previous checkpoint intact.

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/common/result.h"
#include "model.h"
#include "optimizer.h"

namespace lockstep::trainer {

struct CheckpointInfo {
  std::uint64_t step = 0;  // optimizer steps completed
  std::uint64_t globalBatch = 0;
  std::uint64_t datasetSamples = 0;
  std::string layers;      // "784,1024,10"
  std::string activation;  // "relu"
  std::string optimizer;   // "sgd" or "adamw"
};

// Returns the path written. Keeps the newest `keep` checkpoints in dir and deletes older ones.
Result<std::string> saveCheckpoint(const std::string& dir, const ParamLayout& layout, const float* params,
                                   Optimizer& optimizer, const CheckpointInfo& info, std::uint32_t keep);

// The newest complete checkpoint in dir, if any.
Result<std::optional<std::string>> latestCheckpoint(const std::string& dir);

// Loads weights and optimizer state after checking that the checkpoint fits this run (same model,
// optimizer, global batch and data set size); returns the checkpoint's info.
Result<CheckpointInfo> loadCheckpoint(const std::string& path, const ParamLayout& layout, float* params,
                                      Optimizer& optimizer, const CheckpointInfo& expected);

// Weight files: the layers.* tensors only.
Result<void> saveWeights(const std::string& path, const ParamLayout& layout, const float* params);
Result<void> loadWeights(const std::string& path, const ParamLayout& layout, float* params);

std::string layersText(const std::vector<std::uint32_t>& layers);

}  // namespace lockstep::trainer
