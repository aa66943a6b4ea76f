#include "settings.h"

#include "lockstep/present/present.h"
#include "lockstep/protocol/names.h"
#include "lockstep/report/report.h"
#include "text.h"

namespace lockstep::report {
namespace {

using detail::compact;
using detail::dash;
using detail::number;

std::string layersText(const std::vector<std::uint32_t>& layers) {
  std::string text;
  for (const auto size : layers) text += (text.empty() ? "" : ", ") + std::to_string(size);
  return text.empty() ? dash() : text;
}

std::string datasetText(const DatasetSource& dataset) {
  if (const auto* s = std::get_if<SyntheticDataset>(&dataset)) {
    return "synthetic: " + number(static_cast<double>(s->samples), 0) + " samples, " + std::to_string(s->dim) +
           " features, " + std::to_string(s->classes) + " classes, seed " + std::to_string(s->seed);
  }
  const auto& npy = std::get<NpyDataset>(dataset);
  return "npy: " + npy.featuresPath + ", " + npy.labelsPath;
}

std::string optimizerText(const OptimizerSpec& o) {
  std::string text;
  if (o.kind == OptimizerKind::kSgd) {
    text = "SGD, lr " + compact(o.lr) + ", momentum " + compact(o.momentum) + (o.nesterov ? " (Nesterov)" : "");
  } else {
    text = "AdamW, lr " + compact(o.lr) + ", betas " + compact(o.beta1) + "/" + compact(o.beta2) + ", eps " +
           compact(o.eps);
  }
  text += ", weight decay " + compact(o.weightDecay);
  if (o.lrScaling == LrScaling::kLinear) {
    text += "; lr scaled linearly with the global batch (base batch " +
            (o.lrBaseBatch > 0 ? std::to_string(o.lrBaseBatch) : std::string("the per-rank batch")) + ")";
  }
  return text;
}

// The built-in trainer's settings, one row each.
std::vector<std::vector<std::string>> trainerSettings(const JobSpec& spec) {
  return {
      {"Job ID", spec.jobId},
      {"Name", spec.name.empty() ? dash() : spec.name},
      {"Backend", std::string(titleOf(spec.backend))},
      {"Model layers", layersText(spec.layers)},
      {"Activation", std::string(titleOf(spec.activation))},
      {"Precision", std::string(titleOf(spec.precision))},
      {"Dataset", datasetText(spec.dataset)},
      {"Ranks", std::to_string(spec.worldSize)},
      {"Batch per rank",
       std::to_string(spec.batchPerRank) +
           (spec.accumSteps > 1 ? " × " + std::to_string(spec.accumSteps) + " accumulation steps" : "")},
      {"Global batch", number(static_cast<double>(spec.globalBatch()), 0)},
      {"Optimizer", optimizerText(spec.optimizer)},
      {"Steps", spec.steps > 0 ? number(static_cast<double>(spec.steps), 0) : dash()},
      {"Epochs", spec.epochs > 0 ? std::to_string(spec.epochs) : dash()},
      {"Target loss", spec.targetLoss ? compact(*spec.targetLoss) : dash()},
      {"Data parallelism", present::parallelismText(spec)},
      {"Bucket size", spec.bucketMb > 0 ? compact(spec.bucketMb) + " MB" : "chosen by measurement (see Events)"},
      {"Shuffle, seed", std::string(spec.shuffle ? "yes" : "no") + ", " + std::to_string(spec.seed)},
      {"Checkpoints", spec.checkpointEvery > 0
                          ? "every " + std::to_string(spec.checkpointEvery) + " steps to " + spec.checkpointDir
                          : std::string("off")},
  };
}

// A command job's: what it ran, where, with what.
std::vector<std::vector<std::string>> commandSettings(const JobSpec& spec) {
  const CommandSpec& c = *spec.command;
  std::string env;
  for (const auto& [name, value] : c.env) env += (env.empty() ? "" : " ") + name + "=" + shellWord(value);
  return {
      {"Job ID", spec.jobId},
      {"Name", spec.name.empty() ? dash() : spec.name},
      {"Ranks run", "your own program"},
      {"Command", commandLine(c.argv)},
      {"Working directory", c.workingDir.empty() ? std::string("the agent's job directory") : c.workingDir},
      {"Environment", env.empty() ? dash() : env},
      {"Ranks", std::to_string(spec.worldSize) + (spec.backend == Backend::kCuda ? ", one GPU each" : ", on CPU cores")},
      {"Target loss", spec.targetLoss ? compact(*spec.targetLoss) : dash()},
      {"Restarts", spec.maxRestarts > 0 ? "up to " + std::to_string(spec.maxRestarts) : std::string("none")},
  };
}

}  // namespace

std::string shellWord(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789_-+=/.,:@%") == std::string::npos;
  if (plain) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string commandLine(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& word : argv) out += (out.empty() ? "" : " ") + shellWord(word);
  return out;
}

namespace detail {

std::vector<std::vector<std::string>> specSettings(const JobSpec& spec) {
  auto rows = spec.command ? commandSettings(spec) : trainerSettings(spec);
  rows.push_back({"Prices", spec.prices.anySet()
                                ? compact(spec.prices.gpuHour) + " per GPU-hour, " + compact(spec.prices.coreHour) +
                                      " per core-hour, " + compact(spec.prices.kwh) + " per kWh (" +
                                      spec.prices.currency + ")"
                                : std::string("not set")});
  return rows;
}

}  // namespace detail
}  // namespace lockstep::report
