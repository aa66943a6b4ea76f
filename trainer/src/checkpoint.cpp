#include "checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "lockstep/common/files.h"
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
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoull(digits);
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

Result<std::string> saveCheckpoint(const std::string& dir, const ParamLayout& layout, const float* params,
                                   Optimizer& optimizer, const CheckpointInfo& info, std::uint32_t keep) {
  LOCKSTEP_TRY(makeDirectories(dir));
  std::vector<TensorRef> refs = weightRefs(layout, params, "");
  for (const auto& buffer : optimizer.stateBuffers()) {
    auto more = weightRefs(layout, buffer.data->data(), "optimizer." + buffer.name + ".");
    refs.insert(refs.end(), more.begin(), more.end());
  }
  const std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"step", std::to_string(info.step)},
      {"optimizer_steps", std::to_string(optimizer.stepsTaken())},
      {"global_batch", std::to_string(info.globalBatch)},
      {"dataset_samples", std::to_string(info.datasetSamples)},
      {"layers", info.layers},
      {"activation", info.activation},
      {"optimizer", info.optimizer},
  };
  const std::string path = (fs::path(dir) / checkpointName(info.step)).string();
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

Result<CheckpointInfo> loadCheckpoint(const std::string& path, const ParamLayout& layout, float* params,
                                      Optimizer& optimizer, const CheckpointInfo& expected) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto file, readSafetensors(path));
  auto meta = [&](const char* key) -> std::string {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? "" : it->second;
  };
  if (meta("format") != kFormat) return invalidArgument(path + " is not a Lockstep checkpoint (format '" + meta("format") + "')");
  CheckpointInfo info;
  try {
    info.step = std::stoull(meta("step"));
    info.globalBatch = std::stoull(meta("global_batch"));
    info.datasetSamples = std::stoull(meta("dataset_samples"));
  } catch (const std::exception&) {
    return invalidArgument(path + ": checkpoint metadata is damaged (step, global_batch or dataset_samples)");
  }
  info.layers = meta("layers");
  info.activation = meta("activation");
  info.optimizer = meta("optimizer");
  auto mismatch = [&](const char* what, const std::string& have, const std::string& want) {
    return invalidArgument("cannot resume from " + path + ": it was written with " + what + " " + have +
                           " but this run has " + want + "; resume with the same settings or start afresh");
  };
  if (info.layers != expected.layers) return mismatch("--layers", info.layers, expected.layers);
  if (info.activation != expected.activation) return mismatch("--activation", info.activation, expected.activation);
  if (info.optimizer != expected.optimizer) return mismatch("--optimizer", info.optimizer, expected.optimizer);
  if (info.globalBatch != expected.globalBatch) {
    return mismatch("global batch", std::to_string(info.globalBatch), std::to_string(expected.globalBatch));
  }
  if (info.datasetSamples != expected.datasetSamples) {
    return mismatch("a data set of", std::to_string(info.datasetSamples) + " samples",
                    std::to_string(expected.datasetSamples) + " samples");
  }
  LOCKSTEP_TRY(copyTensors(file, path, layout, "", params));
  for (const auto& buffer : optimizer.stateBuffers()) {
    LOCKSTEP_TRY(copyTensors(file, path, layout, "optimizer." + buffer.name + ".", buffer.data->data()));
  }
  try {
    optimizer.setStepsTaken(std::stoll(meta("optimizer_steps")));
  } catch (const std::exception&) {
    return invalidArgument(path + ": checkpoint metadata is damaged (optimizer_steps)");
  }
  return info;
}

Result<void> saveWeights(const std::string& path, const ParamLayout& layout, const float* params) {
  return writeFileAtomic(path, encodeSafetensors(weightRefs(layout, params, ""), {{"format", "pt"}}));
}

Result<void> loadWeights(const std::string& path, const ParamLayout& layout, float* params) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto file, readSafetensors(path));
  return copyTensors(file, path, layout, "", params);
}

}  // namespace lockstep::trainer
