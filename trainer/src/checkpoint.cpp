#include "checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <map>

#include "lockstep/common/files.h"
#include "lockstep/protocol/names.h"
#include "safetensors.h"

namespace lockstep::trainer {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "lockstep-checkpoint-v1";

std::string checkpointName(std::uint64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step-%08llu.safetensors", static_cast<unsigned long long>(step));
  return name;
}

std::optional<std::uint64_t> stepOfName(const std::string& name) {
  static const std::string prefix = "step-", suffix = ".safetensors";
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  std::uint64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

std::vector<TensorRef> weightRefs(const ParamLayout& layout, const float* params, const std::string& prefix) {
  std::vector<TensorRef> refs;
  for (const auto& t : layout.tensors()) refs.push_back({prefix + t.name, t.shape, params + t.offset});
  return refs;
}

std::string shapeText(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Copies prefix + layers.* tensors from the file into `dst` (layout offsets).
Result<void> copyTensors(const SafetensorsFile& file, const std::string& path, const ParamLayout& layout,
                         const std::string& prefix, float* dst) {
  for (const auto& slot : layout.tensors()) {
    const auto it = file.tensors.find(prefix + slot.name);
    if (it == file.tensors.end()) {
      std::string found;
      for (const auto& [name, t] : file.tensors) {
        if (found.size() > 200) {
          found += ", ...";
          break;
        }
        found += (found.empty() ? "" : ", ") + name;
      }
      return invalidArgument(path + " has no tensor '" + prefix + slot.name + "' (it has: " +
                             (found.empty() ? "nothing" : found) +
                             "); Lockstep names an MLP's nn.Linear layers layers.0, layers.1, ... "
                             "(an nn.ModuleList called `layers`)");
    }
    if (it->second.shape != slot.shape) {
      return invalidArgument(path + ": tensor '" + prefix + slot.name + "' has shape " + shapeText(it->second.shape) +
                             " but the model needs " + shapeText(slot.shape) + "; check --layers");
    }
    std::copy(it->second.data.begin(), it->second.data.end(), dst + slot.offset);
  }
  return {};
}

}  // namespace

std::string layersText(const std::vector<std::uint32_t>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size(); ++i) s += (i ? "," : "") + std::to_string(layers[i]);
  return s;
}

ResumeSettings resumeSettings(const JobSpec& spec, std::uint64_t datasetSamples, std::uint64_t datasetHash) {
  const auto& o = spec.optimizer;
  auto real = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", v);
    return std::string(text);
  };
  ResumeSettings s = {
      {"layers", layersText(spec.layers)},
      {"activation", std::string(nameOf(spec.activation))},
      {"optimizer", std::string(nameOf(o.kind))},
      {"weight_decay", real(o.weightDecay)},
      {"global_batch", std::to_string(spec.globalBatch())},
      {"seed", std::to_string(spec.seed)},
      {"shuffle", spec.shuffle ? "yes" : "no"},
      {"dataset_samples", std::to_string(datasetSamples)},
      {"dataset_hash", std::to_string(datasetHash)},
  };
  if (o.kind == OptimizerKind::kSgd) {
    s["momentum"] = real(o.momentum);
    s["nesterov"] = o.nesterov ? "yes" : "no";
  } else {
    s["beta1"] = real(o.beta1);
    s["beta2"] = real(o.beta2);
    s["eps"] = real(o.eps);
  }
  return s;
}

CheckpointData snapshotCheckpoint(std::uint64_t step, const ResumeSettings& settings, const std::vector<float>& params,
                                  Optimizer& optimizer) {
  CheckpointData data{step, optimizer.stepsTaken(), settings, params, {}};
  for (const auto& buffer : optimizer.stateBuffers()) data.state.emplace_back(buffer.name, *buffer.data);
  return data;
}

Result<std::string> saveCheckpoint(const std::string& dir, const ParamLayout& layout, const CheckpointData& data,
                                   std::uint32_t keep) {
  LOCKSTEP_TRY(makeDirectories(dir));
  std::vector<TensorRef> refs = weightRefs(layout, data.params.data(), "");
  for (const auto& [name, buffer] : data.state) {
    auto more = weightRefs(layout, buffer.data(), "optimizer." + name + ".");
    refs.insert(refs.end(), more.begin(), more.end());
  }
  std::map<std::string, std::string> metadata = data.settings;
  metadata["format"] = kFormat;
  metadata["step"] = std::to_string(data.step);
  metadata["optimizer_steps"] = std::to_string(data.optimizerSteps);
  const std::string path = (fs::path(dir) / checkpointName(data.step)).string();
  LOCKSTEP_TRY(writeFileAtomic(path, encodeSafetensors(refs, metadata)));

  // Retention: drop the oldest beyond `keep`. A failure here loses nothing, so it is not an error.
  std::vector<std::pair<std::uint64_t, fs::path>> existing;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (auto step = stepOfName(entry.path().filename().string())) existing.emplace_back(*step, entry.path());
  }
  std::sort(existing.begin(), existing.end());
  for (size_t i = 0; i + keep < existing.size(); ++i) fs::remove(existing[i].second, ec);
  return path;
}

Result<std::optional<std::string>> latestCheckpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return std::optional<std::string>{};
  std::optional<std::pair<std::uint64_t, std::string>> best;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (auto step = stepOfName(entry.path().filename().string()); step && (!best || *step > best->first)) {
      best = {{*step, entry.path().string()}};
    }
  }
  if (ec) return ioError("cannot list checkpoint directory " + dir + ": " + ec.message());
  if (!best) return std::optional<std::string>{};
  return std::optional<std::string>{best->second};
}

Result<std::uint64_t> loadCheckpoint(const std::string& path, const ParamLayout& layout, float* params,
                                     Optimizer& optimizer, const ResumeSettings& expected) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto file, readSafetensors(path));
  auto meta = [&](const std::string& key) -> std::string {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? "(none)" : it->second;
  };
  if (meta("format") != kFormat) return invalidArgument(path + " is not a Lockstep checkpoint (format '" + meta("format") + "')");
  for (const auto& [key, want] : expected) {
    if (meta(key) != want) {
      return invalidArgument("cannot resume from " + path + ": it was written with " + key + " = " + meta(key) +
                             " but this run has " + key + " = " + want +
                             "; resume with the same settings, or start afresh in an empty --checkpoint-dir");
    }
  }
  std::uint64_t step = 0;
  std::int64_t optimizerSteps = 0;
  const std::string stepText = meta("step"), optimizerText = meta("optimizer_steps");
  if (std::from_chars(stepText.data(), stepText.data() + stepText.size(), step).ec != std::errc() ||
      std::from_chars(optimizerText.data(), optimizerText.data() + optimizerText.size(), optimizerSteps).ec != std::errc()) {
    return invalidArgument(path + ": checkpoint metadata is damaged (step or optimizer_steps)");
  }
  LOCKSTEP_TRY(copyTensors(file, path, layout, "", params));
  for (const auto& buffer : optimizer.stateBuffers()) {
    LOCKSTEP_TRY(copyTensors(file, path, layout, "optimizer." + buffer.name + ".", buffer.data->data()));
  }
  optimizer.setStepsTaken(optimizerSteps);
  return step;
}

CheckpointWriter::CheckpointWriter(std::string dir, const ParamLayout& layout, std::uint32_t keep)
    : dir_(std::move(dir)), layout_(layout), keep_(keep), thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

Result<void> CheckpointWriter::submit(CheckpointData data) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !pending_ && !writing_; });
  if (error_) return *error_;
  pending_ = std::move(data);
  changed_.notify_all();
  return {};
}

Result<std::string> CheckpointWriter::finish(bool* waited) {
  std::unique_lock lock(mutex_);
  if (waited != nullptr) *waited = pending_.has_value() || writing_;
  changed_.wait(lock, [this] { return !pending_ && !writing_; });
  if (error_) return *error_;
  return lastPath_;
}

void CheckpointWriter::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [this] { return stopping_ || pending_.has_value(); });
    if (!pending_) return;  // stopping, nothing left to write
    CheckpointData data = std::move(*pending_);
    pending_.reset();
    writing_ = true;
    lock.unlock();
    auto written = saveCheckpoint(dir_, layout_, data, keep_);
    lock.lock();
    writing_ = false;
    if (written) {
      lastPath_ = *written;
    } else {
      error_ = written.error().withContext("checkpoint");
    }
    changed_.notify_all();
  }
}

Result<void> saveWeights(const std::string& path, const ParamLayout& layout, const float* params) {
  return writeFileAtomic(path, encodeSafetensors(weightRefs(layout, params, ""), {{"format", "pt"}}));
}

Result<void> loadWeights(const std::string& path, const ParamLayout& layout, float* params) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto file, readSafetensors(path));
  return copyTensors(file, path, layout, "", params);
}

}  // namespace lockstep::trainer
