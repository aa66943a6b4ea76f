#pragma once
// Checkpoints and weight files, all safetensors with PyTorch nn.Linear names.
//
// A checkpoint is one file, dir/step-NNNNNNNN.safetensors, holding the weights (layers.{i}.weight,
// layers.{i}.bias), the optimizer state (optimizer.{buffer}.layers.{i}.weight, ...) and in its
// metadata the step and every setting a resumed run must share for its losses to continue the
// uninterrupted run's (model, optimizer settings, global batch, seed, shuffling, a hash of the
// data). It is written atomically (temp file, fsync, rename), so a crash leaves the previous one.

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/common/result.h"
#include "model.h"
#include "optimizer.h"

namespace lockstep::trainer {

// What must match between a checkpoint and the run resuming from it, by name.
using ResumeSettings = std::map<std::string, std::string>;
ResumeSettings resumeSettings(const JobSpec& spec, std::uint64_t datasetSamples, std::uint64_t datasetHash);

// A copy of everything a checkpoint holds, taken between steps.
struct CheckpointData {
  std::uint64_t step = 0;  // optimizer steps completed
  std::int64_t optimizerSteps = 0;
  ResumeSettings settings;
  std::vector<float> params;
  std::vector<std::pair<std::string, std::vector<float>>> state;  // optimizer buffers by name
};

CheckpointData snapshotCheckpoint(std::uint64_t step, const ResumeSettings& settings, const std::vector<float>& params,
                                  Optimizer& optimizer);

// Writes dir/step-NNNNNNNN.safetensors and keeps the newest `keep`; returns the path written.
Result<std::string> saveCheckpoint(const std::string& dir, const ParamLayout& layout, const CheckpointData& data,
                                   std::uint32_t keep);

// The newest checkpoint in dir, if any.
Result<std::optional<std::string>> latestCheckpoint(const std::string& dir);

// Loads weights and optimizer state after checking that every resume setting matches; returns
// the checkpoint's step.
Result<std::uint64_t> loadCheckpoint(const std::string& path, const ParamLayout& layout, float* params,
                                     Optimizer& optimizer, const ResumeSettings& expected);

// Writes checkpoints on a thread of its own, so that a slow disk does not hold rank 0 (and with it
// every rank's next collective) inside a step. One write at a time: submitting while one is in
// progress waits for it.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, const ParamLayout& layout, std::uint32_t keep);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Fails with the previous write's error, if it failed.
  Result<void> submit(CheckpointData data);
  // Waits for the write in progress; returns the path of the last checkpoint written, or an error.
  // `waited`, when given, says whether a write was pending or in progress.
  Result<std::string> finish(bool* waited = nullptr);

 private:
  void run();

  const std::string dir_;
  const ParamLayout& layout_;
  const std::uint32_t keep_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<CheckpointData> pending_;
  bool writing_ = false;
  bool stopping_ = false;
  std::optional<Error> error_;
  std::string lastPath_;
  std::thread thread_;
};

// Weight files: the layers.* tensors only.
Result<void> saveWeights(const std::string& path, const ParamLayout& layout, const float* params);
Result<void> loadWeights(const std::string& path, const ParamLayout& layout, float* params);

std::string layersText(const std::vector<std::uint32_t>& layers);

}  // namespace lockstep::trainer
