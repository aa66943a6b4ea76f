#pragma once
// lockstep-trainer's command line: the job (a JobSpec, validated by the protocol library's rules)
// plus what only this process needs. Flag names are the interface documented in docs/trainer.md;
// lockstepctl start takes the same job flags, and the agent hands a rank its spec whole (--spec,
// rankArgs). The spec's flags, their usage lines and both directions follow from its one
// description (lockstep/protocol/spec_fields.h); --dataset, --balance and the flags of the process
// alone are listed in options.cpp.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::jobflags {

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
  bool gemmPeak = false;          // measure the CPU's sgemm peak and print it (gemm_peak.h)
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

// "NAME=VALUE" (an --env flag, one word of the launcher's environment field) as its two parts.
Result<std::pair<std::string, std::string>> parseEnvAssignment(const std::string& text);

// A job that runs the user's own program: `command` is its argv (everything after `--`), `args`
// the job flags before it: the spec's fields a command job takes (spec::Jobs::kCommand: --job-id,
// --name, --backend cpu|cuda (whether ranks get GPUs), --target-loss, --max-restarts, ...), and
// --workdir DIR, --env NAME=VALUE (repeatable). The built-in trainer's flags are refused, saying
// that the program's own flags go after `--`. The spec is validated, except for its placement.
Result<JobSpec> parseCommandJobArgs(const std::vector<std::string>& args, const std::vector<std::string>& command);

// argv[1..] without --nproc and its value: what the launcher passes to each rank it spawns.
std::vector<std::string> withoutNproc(const std::vector<std::string>& args);

// The trainer flags that make a rank run `spec`, writing metrics to metricsPath:
// parseTrainerArgs(jobSpecToTrainerArgs(spec, m)).spec == spec, but for the fields the client or
// agent that places a job sets (spec::Jobs::kNone: world size, placements, prices, ...), which ranks
// take from their environment. Every field is carried (tests/spec_fields_test.cpp).
std::vector<std::string> jobSpecToTrainerArgs(const JobSpec& spec, const std::string& metricsPath);

// What the agent gives lockstep-trainer to run one rank of `spec`: the validated spec whole, as
// one line of JSON (--spec), less the placements, which each rank takes from its environment, and
// where its metrics go; --resume for a restart. parseTrainerArgs reads back the same spec.
std::vector<std::string> rankArgs(const JobSpec& spec, const std::string& metricsPath);

// SIZE (--mem-per-rank's) as bytes: a whole number with a binary unit, B, K, M, G or T (a bare
// number is MiB, as Slurm's --mem); `flag` names it in the error.
Result<std::uint64_t> parseSize(const std::string& flag, const std::string& text);

// A command job's flags before `--` (the program's argv goes after it):
// parseCommandJobArgs(jobSpecToCommandJobArgs(spec), spec.command->argv) == spec, but for the
// fields the placing client or agent sets.
std::vector<std::string> jobSpecToCommandJobArgs(const JobSpec& spec);

}  // namespace lockstep::jobflags
