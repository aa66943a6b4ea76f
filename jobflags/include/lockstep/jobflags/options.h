#pragma once
// lockstep-trainer's command line: the job (a JobSpec, validated by the protocol library's rules)
// plus what only this process needs. Flag names are the interface documented in docs/trainer.md;
// lockstepctl start takes the same job flags, and the agent turns a JobSpec back into them.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::trainer {

struct TrainerOptions {
  JobSpec spec;
  std::uint32_t nproc = 0;        // > 0: launch this many local ranks (like torchrun --nproc_per_node)
  std::string metricsOut;         // JSON lines per step and rank; empty: stdout
  std::string saveWeightsPath;    // final weights (safetensors), written by rank 0
  bool resume = false;            // continue from the newest checkpoint in spec.checkpointDir
  std::uint32_t threads = 0;      // BLAS threads per rank; 0: cores / local ranks
  bool pinCpus = true;            // each local rank on its own share of the CPUs (when its threads fit)
  std::uint32_t logEvery = 0;     // progress line interval in steps; 0: about 20 lines per run
  bool quiet = false;             // no progress lines
  bool help = false;
  bool version = false;
  std::vector<std::string> given;  // the flags on the command line, in order

  bool gave(const std::string& flag) const { return std::find(given.begin(), given.end(), flag) != given.end(); }
};

// Parses argv[1..]. Usage errors are InvalidArgument and name the flag.
Result<TrainerOptions> parseTrainerArgs(const std::vector<std::string>& args);

// lockstepctl start's job flags: the trainer's less those only a lockstep-trainer process started
// by hand has (the agent decides them for a job's ranks), each refused with its reason rather than
// dropped.
Result<TrainerOptions> parseJobArgs(const std::vector<std::string>& args);

// Parses "synthetic:n=65536,dim=784,classes=10,seed=1" or "npy:FEATURES.npy,LABELS.npy". A synthetic
// dim or classes left out is taken from the first or last layer size.
Result<DatasetSource> parseDatasetSpec(const std::string& text, const std::vector<std::uint32_t>& layers);

std::string trainerUsage();

// A job that runs the user's own program: `command` is its argv (everything after `--`), `args`
// the job flags before it: --job-id, --name, --backend cpu|cuda (whether ranks get GPUs),
// --workdir DIR, --env NAME=VALUE (repeatable), --target-loss, --max-restarts, --min-ranks. The
// built-in trainer's flags are refused, saying that the program's own flags go
// after `--`. The spec is validated, except for its placement.
// "NAME=VALUE" (an --env flag, one word of the launcher's environment field) as its two parts.
Result<std::pair<std::string, std::string>> parseEnvAssignment(const std::string& text);

Result<JobSpec> parseCommandJobArgs(const std::vector<std::string>& args, const std::vector<std::string>& command);

// argv[1..] without --nproc and its value: what the launcher passes to each rank it spawns.
std::vector<std::string> withoutNproc(const std::vector<std::string>& args);

// The trainer flags that make a rank run `spec`, writing metrics to metricsPath:
// parseTrainerArgs(jobSpecToTrainerArgs(spec, m)).spec == spec (up to world size and rank placements,
// which ranks take from their environment).
std::vector<std::string> jobSpecToTrainerArgs(const JobSpec& spec, const std::string& metricsPath);

}  // namespace lockstep::trainer
