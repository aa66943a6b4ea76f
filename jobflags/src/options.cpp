#include "lockstep/jobflags/options.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>

#include "lockstep/protocol/names.h"
#include "lockstep/protocol/validate.h"

namespace lockstep::trainer {
namespace {

Error usage(std::string message) { return invalidArgument(message + " (see lockstep-trainer --help)"); }

template <class T>
Result<T> parseUnsigned(const std::string& flag, const std::string& text, T max) {
  std::uint64_t v = 0;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end) {
    return usage(flag + ": '" + text + "' is not a whole number");
  }
  if (v > static_cast<std::uint64_t>(max)) {
    return usage(flag + ": " + text + " is larger than " + std::to_string(static_cast<std::uint64_t>(max)));
  }
  return static_cast<T>(v);
}

Result<double> parseReal(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v)) {
    return usage(flag + ": '" + text + "' is not a number");
  }
  return v;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t pos = text.find(sep, start);
    out.push_back(text.substr(start, pos - start));
    if (pos == std::string::npos) return out;
    start = pos + 1;
  }
}

Result<std::vector<std::uint32_t>> parseLayers(const std::string& text) {
  std::vector<std::uint32_t> layers;
  for (const auto& part : split(text, ',')) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto v, parseUnsigned<std::uint32_t>("--layers", part, 1u << 30));
    layers.push_back(v);
  }
  return layers;
}

// A flag's parser: stores the value's meaning in one field, or says what is wrong with it.
using Handler = std::function<Result<void>(const std::string& flag, const std::string& value)>;

Handler asText(std::string& field) {
  return [&field](const std::string&, const std::string& v) -> Result<void> {
    field = v;
    return {};
  };
}

Handler asOptionalText(std::optional<std::string>& field) {
  return [&field](const std::string&, const std::string& v) -> Result<void> {
    field = v;
    return {};
  };
}

template <class T>
Handler asWhole(T& field, T max) {
  return [&field, max](const std::string& flag, const std::string& v) -> Result<void> {
    LOCKSTEP_ASSIGN_OR_RETURN(field, parseUnsigned<T>(flag, v, max));
    return {};
  };
}

Handler asReal(double& field) {
  return [&field](const std::string& flag, const std::string& v) -> Result<void> {
    LOCKSTEP_ASSIGN_OR_RETURN(field, parseReal(flag, v));
    return {};
  };
}

// "auto" is 0: the trainer measures and chooses (--bucket-mb).
Handler asRealOrAuto(double& field) {
  return [&field](const std::string& flag, const std::string& v) -> Result<void> {
    if (v == "auto") {
      field = 0;
      return {};
    }
    LOCKSTEP_ASSIGN_OR_RETURN(field, parseReal(flag, v));
    return {};
  };
}

Handler asOptionalReal(std::optional<double>& field) {
  return [&field](const std::string& flag, const std::string& v) -> Result<void> {
    LOCKSTEP_ASSIGN_OR_RETURN(field, parseReal(flag, v));
    return {};
  };
}

template <class Enum>
Handler asChoice(Enum& field) {
  return [&field](const std::string& flag, const std::string& v) -> Result<void> {
    const auto value = named<Enum>(v);
    if (!value) return usage(flag + ": '" + v + "' is not one of " + namesText<Enum>());
    field = *value;
    return {};
  };
}

}  // namespace

Result<DatasetSource> parseDatasetSpec(const std::string& text, const std::vector<std::uint32_t>& layers) {
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : text.substr(colon + 1);
  if (kind == "npy") {
    const auto parts = split(rest, ',');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return usage("--dataset npy:FEATURES.npy,LABELS.npy needs two file names, got '" + text + "'");
    }
    return DatasetSource{NpyDataset{parts[0], parts[1]}};
  }
  if (kind != "synthetic") {
    return usage("--dataset '" + text + "': the kind must be synthetic:... or npy:...");
  }
  SyntheticDataset d;
  std::optional<std::uint32_t> dim, classes;
  if (!rest.empty()) {
    for (const auto& item : split(rest, ',')) {
      const auto eq = item.find('=');
      if (eq == std::string::npos) return usage("--dataset: '" + item + "' is not key=value");
      const std::string key = item.substr(0, eq);
      const std::string value = item.substr(eq + 1);
      const std::string flag = "--dataset synthetic " + key;
      if (key == "n") {
        LOCKSTEP_ASSIGN_OR_RETURN(d.samples, parseUnsigned<std::uint64_t>(flag, value, 1ull << 31));
      } else if (key == "dim") {
        LOCKSTEP_ASSIGN_OR_RETURN(dim, parseUnsigned<std::uint32_t>(flag, value, 1u << 20));
      } else if (key == "classes") {
        LOCKSTEP_ASSIGN_OR_RETURN(classes, parseUnsigned<std::uint32_t>(flag, value, 1u << 20));
      } else if (key == "seed") {
        LOCKSTEP_ASSIGN_OR_RETURN(d.seed, parseUnsigned<std::uint64_t>(flag, value, ~0ull));
      } else {
        return usage("--dataset synthetic: unknown key '" + key + "' (known: n, dim, classes, seed)");
      }
    }
  }
  d.dim = dim.value_or(layers.empty() ? 0 : layers.front());
  d.classes = classes.value_or(layers.empty() ? 0 : layers.back());
  return DatasetSource{d};
}

std::vector<std::string> withoutNproc(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--nproc") {
      ++i;
      continue;
    }
    if (args[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

Result<TrainerOptions> parseTrainerArgs(const std::vector<std::string>& args) {
  TrainerOptions o;
  JobSpec& s = o.spec;
  std::string datasetText = "synthetic";
  std::string backendText = "cpu";
  std::string precisionText;  // default: bf16 on GPUs, fp32 on CPUs
  std::string balanceText = "even";
  std::uint32_t rebalanceEvery = 0;
  std::optional<std::string> layersText;
  if (const char* id = std::getenv("LOCKSTEP_JOB_ID"); id != nullptr && *id != '\0') s.jobId = id;
  else s.jobId = "local";

  // Flags that take a value: each parses its text into one field.
  const std::map<std::string, Handler> valued = {
      {"--backend", asText(backendText)},
      {"--nproc", asWhole(o.nproc, 1024u)},
      {"--layers", asOptionalText(layersText)},
      {"--activation", asChoice(s.activation)},
      {"--precision", asText(precisionText)},
      {"--dataset", asText(datasetText)},
      {"--batch-per-rank", asWhole(s.batchPerRank, 1u << 20)},
      {"--accum-steps", asWhole(s.accumSteps, 4096u)},
      {"--steps", asWhole(s.steps, std::uint64_t{1'000'000'000'000})},
      {"--epochs", asWhole(s.epochs, 1'000'000u)},
      {"--optimizer", asChoice(s.optimizer.kind)},
      {"--lr", asReal(s.optimizer.lr)},
      {"--momentum", asReal(s.optimizer.momentum)},
      {"--weight-decay", asReal(s.optimizer.weightDecay)},
      {"--beta1", asReal(s.optimizer.beta1)},
      {"--beta2", asReal(s.optimizer.beta2)},
      {"--eps", asReal(s.optimizer.eps)},
      {"--lr-scaling", asChoice(s.optimizer.lrScaling)},
      {"--lr-base-batch", asWhole(s.optimizer.lrBaseBatch, 1u << 30)},
      {"--seed", asWhole(s.seed, ~std::uint64_t{0})},
      {"--target-loss", asOptionalReal(s.targetLoss)},
      {"--bucket-mb", asRealOrAuto(s.bucketMb)},
      {"--timeout-s", asWhole(s.timeoutS, 86400u)},
      {"--checkpoint-dir", asText(s.checkpointDir)},
      {"--checkpoint-every", asWhole(s.checkpointEvery, 1u << 30)},
      {"--balance", asText(balanceText)},
      {"--rebalance-every", asWhole(rebalanceEvery, 1000000u)},
      {"--max-restarts", asWhole(s.maxRestarts, 100u)},
      {"--min-ranks", asWhole(s.minWorldSize, 4096u)},
      {"--on-stall", asChoice(s.onStall)},
      {"--stall-after-s", asWhole(s.stallAfterS, 86400u)},
      {"--keep-checkpoints", asWhole(s.keepCheckpoints, 1u << 20)},
      {"--init-weights", asText(s.initWeightsPath)},
      {"--save-weights", asText(o.saveWeightsPath)},
      {"--metrics-out", asText(o.metricsOut)},
      {"--job-id", asText(s.jobId)},
      {"--name", asText(s.name)},
      {"--threads", asWhole(o.threads, 1024u)},
      {"--log-every", asWhole(o.logEvery, 1u << 30)},
  };
  const std::map<std::string, std::function<void()>> switches = {
      {"--no-shuffle", [&] { s.shuffle = false; }},
      {"--nesterov", [&] { s.optimizer.nesterov = true; }},
      {"--resume", [&] { o.resume = true; }},
      {"--quiet", [&] { o.quiet = true; }},
      {"--no-pin-cpus", [&] { o.pinCpus = false; }},
      {"--help", [&] { o.help = true; }},
      {"-h", [&] { o.help = true; }},
      {"--version", [&] { o.version = true; }},
  };

  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inlineValue;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inlineValue = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    o.given.push_back(flag);
    if (auto sw = switches.find(flag); sw != switches.end()) {
      if (inlineValue) return usage(flag + " takes no value");
      sw->second();
      continue;
    }
    auto handler = valued.find(flag);
    if (handler == valued.end()) {
      return usage(flag.rfind("-", 0) == 0 ? "unknown option " + flag : "unexpected argument '" + flag + "'");
    }
    std::string value;
    if (inlineValue) {
      value = *inlineValue;
    } else {
      if (i + 1 >= args.size()) return usage(flag + " needs a value");
      value = args[++i];
    }
    LOCKSTEP_TRY(handler->second(flag, value));
  }
  if (o.help || o.version) return o;

  LOCKSTEP_TRY(asChoice(s.backend)("--backend", backendText));
  if (balanceText != "even" && balanceText != "dynamic") return usage("--balance " + balanceText + ": use even or dynamic");
  if (rebalanceEvery > 0 && balanceText != "dynamic") return usage("--rebalance-every goes with --balance dynamic");
  s.rebalanceEvery = balanceText == "dynamic" ? (rebalanceEvery > 0 ? rebalanceEvery : 10) : 0;
  if (precisionText.empty()) precisionText = nameOf(s.backend == Backend::kCuda ? Precision::kBf16 : Precision::kFp32);
  LOCKSTEP_TRY(asChoice(s.precision)(
      "--precision", precisionText));
  if (!layersText) return usage("--layers is required, e.g. --layers 784,1024,1024,10");
  LOCKSTEP_ASSIGN_OR_RETURN(s.layers, parseLayers(*layersText));
  LOCKSTEP_ASSIGN_OR_RETURN(s.dataset, parseDatasetSpec(datasetText, s.layers));
  if (s.steps == 0 && s.epochs == 0) return usage("give --steps N or --epochs N");
  if (o.resume && s.checkpointDir.empty()) return usage("--resume needs --checkpoint-dir");
  if (o.gave("--keep-checkpoints") && s.keepCheckpoints == 0) return usage("--keep-checkpoints must be at least 1");
  if (o.nproc > 0) s.worldSize = o.nproc;
  LOCKSTEP_TRY(validateJobSpec(s));
  return o;
}

Result<TrainerOptions> parseJobArgs(const std::vector<std::string>& args) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto o, parseTrainerArgs(args));
  static const std::vector<std::pair<std::string, std::string>> processOnly = {
      {"--nproc", "the agents start a job's ranks: give --ranks or --ranks-per-agent"},
      {"--metrics-out", "the agent writes a job's metrics to its job directory; `lockstepctl history` and "
                        "`report` read them"},
      {"--save-weights", "a job's weights are its checkpoints: give --checkpoint-dir and --checkpoint-every"},
      {"--resume", "a job resumes only in its own restarts (--max-restarts); a new job refuses a directory "
                   "that holds another run's checkpoints: give it an empty --checkpoint-dir"},
      {"--threads", "the agent gives each rank the node's cores divided by its local ranks"},
      {"--log-every", "a job's rank logs keep the trainer's own interval (`lockstepctl logs JOB`)"},
      {"--quiet", "a job's rank logs keep the trainer's progress lines (`lockstepctl logs JOB`)"},
      {"--no-pin-cpus", "each of a job's local ranks computes on its own share of the node's CPUs"},
  };
  for (const auto& [flag, why] : processOnly) {
    if (o.gave(flag)) return invalidArgument(flag + " is lockstep-trainer's own, not a job's: " + why);
  }
  return o;
}

Result<std::pair<std::string, std::string>> parseEnvAssignment(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return invalidArgument("environment variable '" + text + "' is not NAME=VALUE");
  }
  return std::pair{text.substr(0, eq), text.substr(eq + 1)};
}

Result<JobSpec> parseCommandJobArgs(const std::vector<std::string>& args, const std::vector<std::string>& command) {
  JobSpec s;
  s.command = CommandSpec{command, "", {}};
  std::string backendText = "cpu";
  std::vector<std::string> envText;
  const std::map<std::string, Handler> valued = {
      {"--job-id", asText(s.jobId)},
      {"--name", asText(s.name)},
      {"--backend", asText(backendText)},
      {"--workdir", asText(s.command->workingDir)},
      {"--env", [&](const std::string&, const std::string& v) -> Result<void> {
         envText.push_back(v);
         return {};
       }},
      {"--target-loss", asOptionalReal(s.targetLoss)},
      {"--max-restarts", asWhole(s.maxRestarts, 100u)},
      {"--min-ranks", asWhole(s.minWorldSize, 4096u)},
      {"--on-stall", asChoice(s.onStall)},
      {"--stall-after-s", asWhole(s.stallAfterS, 86400u)},
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> inlineValue;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inlineValue = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    const auto handler = valued.find(flag);
    if (handler == valued.end()) {
      return invalidArgument(flag + " is not a flag of a job that runs your own program; the program's own flags "
                             "go after -- (job flags: --job-id --name --backend --workdir --env --target-loss "
                             "--max-restarts --min-ranks --on-stall --stall-after-s)");
    }
    if (!inlineValue && i + 1 >= args.size()) return invalidArgument(flag + " needs a value");
    LOCKSTEP_TRY(handler->second(flag, inlineValue ? *inlineValue : args[++i]));
  }
  LOCKSTEP_TRY(asChoice(s.backend)("--backend", backendText));
  for (const auto& item : envText) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto assignment, parseEnvAssignment(item));
    s.command->env.push_back(std::move(assignment));
  }
  LOCKSTEP_TRY(validateJobSpec(s));
  return s;
}

std::string trainerUsage() {
  return R"(Usage: lockstep-trainer [options]

Synchronous data-parallel training of an MLP classifier. One process is one rank; the rank and
world come from torchrun's environment (RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR
MASTER_PORT), or --nproc N starts N local ranks. Without either it trains alone.

Job:
  --backend cpu|cuda          compute backend (default cpu: OpenBLAS + Gloo)
  --nproc N                   launch N ranks on this machine
  --layers A,B,...,C          layer sizes: input features first, classes last (required)
  --activation relu|gelu      hidden activation (default relu)
  --precision fp32|tf32|bf16  math precision (default: bf16 with fp32 master weights on GPUs; the CPU
                              backend computes in fp32 only)
  --dataset SPEC              synthetic:n=65536,dim=784,classes=10,seed=1 (default synthetic, dim and
                              classes from --layers) or npy:FEATURES.npy,LABELS.npy (float32 [N,D],
                              integer labels [N])
  --batch-per-rank N          samples per rank per micro-step (default 64)
  --accum-steps N             micro-steps per optimizer step (default 1)
  --steps N | --epochs N      how long to train (one of them is required)
  --target-loss X             stop early once the smoothed loss is at or below X
  --no-shuffle                global step k takes samples [k*G, (k+1)*G) in order (G: global batch)
  --seed N                    weight init and shuffle seed (default 0)

Optimizer:
  --optimizer sgd|adamw       (default sgd)
  --lr X                      learning rate (default 0.01)
  --momentum X  --nesterov    SGD momentum (default 0)
  --weight-decay X            SGD: L2 added to the gradient; AdamW: decoupled (default 0)
  --beta1 X --beta2 X --eps X AdamW (defaults 0.9, 0.999, 1e-8)
  --lr-scaling none|linear    linear: lr x global batch / lr base batch
  --lr-base-batch N           the batch the lr was tuned for (default: --batch-per-rank)

Communication:
  --bucket-mb X|auto          gradient bucket size in MB; buckets all-reduce while backward goes on.
                              auto (the default): measured at start-up and chosen to hide the most
                              communication, chosen again if they drift (CPU backend)
  --balance even|dynamic      how the global batch is split among ranks (default even); dynamic
                              re-splits it from the ranks' measured compute rates, so that slower
                              ranks get fewer samples and all finish together (CPU backend)
  --rebalance-every N         with --balance dynamic: steps between re-splits (default 10)
  --max-restarts N            through agents: when ranks or nodes are lost, restart from the last
                              checkpoint with the ranks left, up to N times (lockstepctl start
                              --wait supervises; needs --checkpoint-dir on a path all nodes see)
  --min-ranks N               with --max-restarts: fail instead when fewer ranks remain (default 1)
  --on-stall report|stop|restart
                              through agents: what a stall does (no rank's progress moved for
                              --stall-after-s): report it (default), fail the job with the
                              diagnosis, or restart it from its last checkpoint (--max-restarts)
  --stall-after-s N           how long progress may stand still (default: the larger of 15 s and 5x
                              the rank's recent p99 step time; before the first step, 10x that)
  --timeout-s N               limit for the rendezvous and every collective (default 60)

Checkpoints and weights:
  --checkpoint-dir D          where checkpoints go (step-NNNNNNNN.safetensors)
  --checkpoint-every N        write one every N steps (and when stopped by a signal)
  --keep-checkpoints N        how many to keep (default 3)
  --resume                    continue from the newest checkpoint in --checkpoint-dir
  --init-weights F            start from these weights (safetensors, names layers.{i}.weight/bias)
  --save-weights F            write the final weights there (safetensors)

Output:
  --metrics-out F             one JSON line per step and rank (default: stdout)
  --job-id ID                 job id in metrics and reports (default $LOCKSTEP_JOB_ID or "local")
  --name TEXT                 a name for people: the history and reports show it beside the id
  --threads N                 BLAS threads per rank (default: cores / local ranks); each local rank
                              runs on its own share of the CPUs the process may use, where N fits
  --no-pin-cpus               let local ranks' threads run on any of those CPUs
  --log-every N               progress line every N steps (default: about 20 per run)
  --quiet                     no progress lines
  --help, --version

When LOCKSTEP_REPORT holds a ZeroMQ endpoint, each step is also pushed there as a protobuf
lockstep.v1.StreamMessage. Exit codes: 0 done, 1 failure, 2 bad input, 3 lost peer or timeout,
128+N stopped by signal N. See docs/trainer.md.
)";
}

std::vector<std::string> jobSpecToTrainerArgs(const JobSpec& spec, const std::string& metricsPath) {
  std::vector<std::string> a;
  auto real = [](double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", v);
    return std::string(text);
  };
  auto flag = [&a](const char* name, std::string value) {
    a.emplace_back(name);
    a.push_back(std::move(value));
  };
  flag("--backend", std::string(nameOf(spec.backend)));
  std::string layers;
  for (auto l : spec.layers) layers += (layers.empty() ? "" : ",") + std::to_string(l);
  flag("--layers", layers);
  flag("--activation", std::string(nameOf(spec.activation)));
  flag("--precision", std::string(nameOf(spec.precision)));
  if (const auto* s = std::get_if<SyntheticDataset>(&spec.dataset)) {
    flag("--dataset", "synthetic:n=" + std::to_string(s->samples) + ",dim=" + std::to_string(s->dim) +
                          ",classes=" + std::to_string(s->classes) + ",seed=" + std::to_string(s->seed));
  } else {
    const auto& npy = std::get<NpyDataset>(spec.dataset);
    flag("--dataset", "npy:" + npy.featuresPath + "," + npy.labelsPath);
  }
  flag("--batch-per-rank", std::to_string(spec.batchPerRank));
  flag("--accum-steps", std::to_string(spec.accumSteps));
  if (spec.steps > 0) flag("--steps", std::to_string(spec.steps));
  if (spec.epochs > 0) flag("--epochs", std::to_string(spec.epochs));
  const auto& o = spec.optimizer;
  flag("--optimizer", std::string(nameOf(o.kind)));
  flag("--lr", real(o.lr));
  flag("--momentum", real(o.momentum));
  if (o.nesterov) a.emplace_back("--nesterov");
  flag("--weight-decay", real(o.weightDecay));
  flag("--beta1", real(o.beta1));
  flag("--beta2", real(o.beta2));
  flag("--eps", real(o.eps));
  flag("--lr-scaling", std::string(nameOf(o.lrScaling)));
  if (o.lrBaseBatch > 0) flag("--lr-base-batch", std::to_string(o.lrBaseBatch));
  if (spec.targetLoss) flag("--target-loss", real(*spec.targetLoss));
  if (!spec.shuffle) a.emplace_back("--no-shuffle");
  flag("--seed", std::to_string(spec.seed));
  if (spec.bucketMb > 0) flag("--bucket-mb", real(spec.bucketMb));
  if (spec.maxRestarts > 0) flag("--max-restarts", std::to_string(spec.maxRestarts));
  if (spec.minWorldSize > 0) flag("--min-ranks", std::to_string(spec.minWorldSize));
  if (spec.onStall != OnStall::kReport) flag("--on-stall", std::string(nameOf(spec.onStall)));
  if (spec.stallAfterS > 0) flag("--stall-after-s", std::to_string(spec.stallAfterS));
  if (spec.rebalanceEvery > 0) {
    flag("--balance", "dynamic");
    flag("--rebalance-every", std::to_string(spec.rebalanceEvery));
  }
  flag("--timeout-s", std::to_string(spec.timeoutS));
  if (!spec.checkpointDir.empty()) {
    flag("--checkpoint-dir", spec.checkpointDir);
    if (spec.checkpointEvery > 0) flag("--checkpoint-every", std::to_string(spec.checkpointEvery));
    if (spec.keepCheckpoints > 0) flag("--keep-checkpoints", std::to_string(spec.keepCheckpoints));
    // A restart of this job (attempt 1, 2, ...) continues where the last attempt stopped. A new
    // job is not told to resume: a directory already holding another run's checkpoints is refused
    // rather than resumed from (and then pruned by this job's retention).
    if (spec.attempt > 0) a.emplace_back("--resume");
  }
  if (!spec.initWeightsPath.empty()) flag("--init-weights", spec.initWeightsPath);
  flag("--job-id", spec.jobId);
  if (!spec.name.empty()) flag("--name", spec.name);
  flag("--metrics-out", metricsPath);
  return a;
}

}  // namespace lockstep::trainer
