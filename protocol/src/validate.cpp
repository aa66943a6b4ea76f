#include "lockstep/protocol/validate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include "lockstep/protocol/names.h"
#include "lockstep/protocol/records.h"
#include "lockstep/protocol/spec_fields.h"

namespace lockstep {
namespace {

constexpr std::uint32_t kMaxLayers = 64;
constexpr std::uint32_t kMaxLayerWidth = 1u << 20;
constexpr std::uint64_t kMaxParameters = 1ull << 31;
using spec::kMaxWorldSize;
constexpr size_t kMaxPathLength = static_cast<size_t>(spec::kMaxPathLength);
constexpr size_t kMaxTextLength = 64 * 1024;
constexpr std::size_t kMaxCommandArgs = 4096;
constexpr std::size_t kMaxCommandArgBytes = 128 * 1024;  // Linux's MAX_ARG_STRLEN
constexpr std::size_t kMaxCommandEnv = 1024;
constexpr std::size_t kMaxCommandBytes = 1024 * 1024;    // argv and env together, under ARG_MAX

Error bad(std::string message) { return invalidArgument(std::move(message)); }

std::string num(double v) {
  std::string s = std::to_string(v);
  while (s.size() > 1 && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

Result<void> checkRange(const char* field, double value, double lo, double hi, bool loInclusive = true) {
  const bool aboveLo = loInclusive ? value >= lo : value > lo;
  if (std::isfinite(value) && aboveLo && value <= hi) return {};
  const std::string allowed = loInclusive ? "between " + num(lo) + " and " + num(hi)
                                          : "greater than " + num(lo) + " and at most " + num(hi);
  return bad(std::string(field) + " is " + num(value) + "; it must be " + allowed);
}

Result<void> checkText(const char* field, const std::string& value, size_t maxLength) {
  if (value.size() > maxLength) {
    return bad(std::string(field) + " is " + std::to_string(value.size()) + " bytes long; the limit is " +
               std::to_string(maxLength));
  }
  return {};
}

Result<void> checkRequired(const char* field, const std::string& value, size_t maxLength) {
  if (value.empty()) return bad(std::string(field) + " is required");
  return checkText(field, value, maxLength);
}

Result<void> validateLayers(const JobSpec& spec) {
  const auto& layers = spec.layers;
  if (layers.size() < 2 || layers.size() > kMaxLayers) {
    return bad("layers has " + std::to_string(layers.size()) +
               " sizes; give between 2 and " + std::to_string(kMaxLayers) +
               " (input features first, classes last, e.g. 784,1024,10)");
  }
  std::uint64_t params = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] == 0 || layers[i] > kMaxLayerWidth) {
      return bad("layer size " + std::to_string(i) + " is " + std::to_string(layers[i]) +
                 "; each size must be between 1 and " + std::to_string(kMaxLayerWidth));
    }
    if (i > 0) params += std::uint64_t{layers[i - 1]} * layers[i] + layers[i];
  }
  if (layers.back() < 2) return bad("the last layer size is the class count and must be at least 2");
  if (params > kMaxParameters) {
    return bad("the model has " + std::to_string(params) + " parameters; the limit is " +
               std::to_string(kMaxParameters));
  }
  return {};
}

Result<void> validateDataset(const JobSpec& spec) {
  if (const auto* s = std::get_if<SyntheticDataset>(&spec.dataset)) {
    if (s->samples == 0 || s->samples > (1ull << 31)) {
      return bad("synthetic dataset n=" + std::to_string(s->samples) + " must be between 1 and 2^31");
    }
    if (s->dim != spec.layers.front()) {
      return bad("the synthetic dataset has dim=" + std::to_string(s->dim) +
                 " features but the first layer size is " + std::to_string(spec.layers.front()) +
                 "; make them equal");
    }
    if (s->classes != spec.layers.back()) {
      return bad("the synthetic dataset has classes=" + std::to_string(s->classes) +
                 " but the last layer size is " + std::to_string(spec.layers.back()) + "; make them equal");
    }
    return {};
  }
  const auto& npy = std::get<NpyDataset>(spec.dataset);
  LOCKSTEP_TRY(checkRequired("dataset features path", npy.featuresPath, kMaxPathLength));
  LOCKSTEP_TRY(checkRequired("dataset labels path", npy.labelsPath, kMaxPathLength));
  return {};
}

Result<void> validateOptimizer(const OptimizerSpec& o) {
  LOCKSTEP_TRY(checkRange("lr", o.lr, 0.0, 1e3, false));
  // The other optimizer's settings are carried along unused, but never as NaN or infinity.
  for (const auto& [field, value] : {std::pair{"momentum", o.momentum}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}}) {
    if (!std::isfinite(value)) return bad(std::string(field) + " is " + num(value) + "; it must be a finite number");
  }
  if (o.kind == OptimizerKind::kSgd) {
    LOCKSTEP_TRY(checkRange("momentum", o.momentum, 0.0, 0.9999));
    if (o.nesterov && o.momentum <= 0.0) return bad("nesterov needs a momentum greater than 0");
  } else {
    LOCKSTEP_TRY(checkRange("beta1", o.beta1, 0.0, 0.9999));
    LOCKSTEP_TRY(checkRange("beta2", o.beta2, 0.0, 0.999999));
    LOCKSTEP_TRY(checkRange("eps", o.eps, 0.0, 1.0, false));
  }
  return {};
}

Result<void> validatePlacements(const JobSpec& spec) {
  if (spec.ranks.empty()) return {};
  if (spec.ranks.size() != spec.worldSize) {
    return bad("the job places " + std::to_string(spec.ranks.size()) + " ranks but its world size is " +
               std::to_string(spec.worldSize) + "; give one placement per rank");
  }
  std::set<std::uint32_t> seen;
  std::set<std::pair<std::string, std::uint32_t>> gpus;
  std::map<std::string, std::set<std::uint32_t>> localRanks;  // per node: 0..n-1, each once
  for (const auto& p : spec.ranks) {
    if (!localRanks[p.node].insert(p.localRank).second) {
      return bad("local rank " + std::to_string(p.localRank) + " on " + p.node + " is given to two ranks");
    }
    if (p.rank >= spec.worldSize) {
      return bad("rank " + std::to_string(p.rank) + " is outside the world size " + std::to_string(spec.worldSize));
    }
    if (!seen.insert(p.rank).second) return bad("rank " + std::to_string(p.rank) + " is placed twice");
    LOCKSTEP_TRY(checkRequired("rank placement node", p.node, 255));
    if (spec.backend == Backend::kCuda) {
      if (!p.gpuIndex) return bad("rank " + std::to_string(p.rank) + " has no GPU; CUDA ranks need one each");
      if (!gpus.insert({p.node, *p.gpuIndex}).second) {
        return bad("GPU " + std::to_string(*p.gpuIndex) + " on " + p.node + " is given to two ranks");
      }
    }
  }
  for (const auto& [node, locals] : localRanks) {
    if (*locals.rbegin() + 1 != locals.size()) {
      return bad("the local ranks on " + node + " must be numbered 0 to " + std::to_string(locals.size() - 1) +
                 " (LOCAL_RANK picks each rank's GPU)");
    }
  }
  return {};
}

// The environment the agent gives each rank of a command job (agent/src/jobs/rank_launch.cpp, which a
// test checks against this list); a job's own env may not set these. OMP_NUM_THREADS and PYTHONPATH
// are the agent's defaults, which a job may change.
constexpr std::string_view kRankVariables[] = {
    "RANK",       "WORLD_SIZE",      "LOCAL_RANK",      "LOCAL_WORLD_SIZE", "GROUP_RANK",
    "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",        "MASTER_ADDR",
    "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"};

bool validEnvName(const std::string& name) {
  if (name.empty() || name.size() > 256 || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

Result<void> checkNoNul(const std::string& what, const std::string& value) {
  if (value.find('\0') != std::string::npos) return bad(what + " contains a NUL byte, which no program can receive");
  return {};
}

Result<void> validateCommand(const CommandSpec& c) {
  if (c.argv.empty() || c.argv.front().empty()) {
    return bad("the command is empty: give the program and its arguments after -- (e.g. -- python3 train.py)");
  }
  if (c.argv.size() > kMaxCommandArgs) {
    return bad("the command has " + std::to_string(c.argv.size()) + " arguments; the limit is " +
               std::to_string(kMaxCommandArgs));
  }
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < c.argv.size(); ++i) {
    const std::string what = i == 0 ? "the program name" : "command argument " + std::to_string(i);
    LOCKSTEP_TRY(checkText(what.c_str(), c.argv[i], kMaxCommandArgBytes));
    LOCKSTEP_TRY(checkNoNul(what, c.argv[i]));
    bytes += c.argv[i].size() + 1;
  }
  LOCKSTEP_TRY(checkText("working directory", c.workingDir, kMaxPathLength));
  LOCKSTEP_TRY(checkNoNul("the working directory", c.workingDir));
  if (!c.workingDir.empty() && c.workingDir.front() != '/') {
    return bad("working directory '" + c.workingDir + "' is relative; give an absolute path (a node has no current "
               "directory of yours)");
  }
  if (c.env.size() > kMaxCommandEnv) {
    return bad("the job sets " + std::to_string(c.env.size()) + " environment variables; the limit is " +
               std::to_string(kMaxCommandEnv));
  }
  std::set<std::string> names;
  for (const auto& [name, value] : c.env) {
    if (!validEnvName(name)) {
      return bad("environment variable name '" + name.substr(0, 80) +
                 "' is malformed: use letters, digits and '_', not starting with a digit (NAME=VALUE)");
    }
    if (isRankVariable(name)) {
      return bad(name + " is set by the agent for each rank (torchrun's variables, CUDA_VISIBLE_DEVICES, "
                        "CUDA_DEVICE_ORDER and LOCKSTEP_*); leave it out of the job's environment");
    }
    if (!names.insert(name).second) return bad("environment variable " + name + " is given twice");
    LOCKSTEP_TRY(checkText(("the value of " + name).c_str(), value, kMaxCommandArgBytes));
    LOCKSTEP_TRY(checkNoNul("the value of " + name, value));
    bytes += name.size() + value.size() + 2;
  }
  if (bytes > kMaxCommandBytes) {
    return bad("the command and its environment take " + std::to_string(bytes) + " bytes; the limit is " +
               std::to_string(kMaxCommandBytes));
  }
  return {};
}

// Each field's range or length, as its description (spec_fields.h) gives it; a field only the
// built-in trainer reads is not checked on a command job, which leaves it unset.
Result<void> validateFields(const JobSpec& spec) {
  std::optional<Error> error;
  spec::forEachField([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    if (error || f.hi == 0 || f.style.boundOnFlag || (spec.isCommand() && f.flag.jobs == spec::Jobs::kTrainer)) return;
    const char* label = f.label.data();  // string literals: NUL-terminated
    Result<void> checked;
    if constexpr (std::is_same_v<T, std::string>) {
      checked = checkText(label, f.of(spec), static_cast<size_t>(f.hi));
    } else if constexpr (records::IsOptional<T>::value) {
      if (f.of(spec)) checked = checkRange(label, static_cast<double>(*f.of(spec)), f.lo, f.hi);
    } else if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      checked = checkRange(label, static_cast<double>(f.of(spec)), f.lo, f.hi);
    }
    if (!checked.ok()) error = checked.error();
  });
  if (error) return *error;
  return {};
}

// What only the built-in trainer's MLP job has: model, data, batch, optimizer, length.
Result<void> validateTrainerJob(const JobSpec& spec) {
  LOCKSTEP_TRY(validateLayers(spec));
  LOCKSTEP_TRY(validateDataset(spec));
  if (spec.backend == Backend::kCpu && spec.precision != Precision::kFp32) {
    return bad("the CPU backend computes in fp32 only; use --precision fp32 or --backend cuda");
  }
  if (spec.precision == Precision::kFp16 || spec.precision == Precision::kFp8) {
    return bad("the trainer computes in fp32, tf32 or bf16, not " + std::string(nameOf(spec.precision)) +
               "; use --precision bf16");
  }
  LOCKSTEP_TRY(validateOptimizer(spec.optimizer));
  if ((spec.steps == 0) == (spec.epochs == 0)) {
    return bad("give exactly one of steps and epochs (steps=" + std::to_string(spec.steps) +
               ", epochs=" + std::to_string(spec.epochs) + ")");
  }
  if (spec.maxRestarts > 0 && (spec.checkpointDir.empty() || spec.checkpointEvery == 0)) {
    return bad("restarts resume from checkpoints: with --max-restarts give --checkpoint-dir (a path every node "
               "sees) and --checkpoint-every");
  }
  if (spec.rebalanceEvery > 0 && spec.backend == Backend::kCuda) {
    return bad("--balance dynamic is available on the CPU backend only for now; use --balance even with --backend cuda");
  }
  if (spec.checkpointEvery > 0 && spec.checkpointDir.empty()) {
    return bad("a checkpoint interval needs a checkpoint directory");
  }
  // A rank's own spec says one rank until its environment says how many (the trainer checks again).
  if (spec.worldSize > 1 || spec.sync != Sync::kParameterServer) LOCKSTEP_TRY(validatePsRanks(spec));
  return validateSync(spec);
}

// A command job: the program decides its model, data and length; the trainer's fields stay unset.
Result<void> validateCommandJob(const JobSpec& spec) {
  LOCKSTEP_TRY(validateCommand(*spec.command));
  const bool trainerFields = !spec.layers.empty() || spec.steps != 0 || spec.epochs != 0 ||
                             spec.checkpointEvery != 0 || !spec.checkpointDir.empty() || spec.keepCheckpoints != 0 ||
                             !spec.initWeightsPath.empty() || spec.rebalanceEvery != 0 || spec.shard != Shard::kNone ||
                             spec.sync != Sync::kAllReduce || spec.staleness != 0 || spec.psRanks != 0;
  if (trainerFields) {
    return bad("a job that runs your own program has no layers, steps, epochs, checkpoints, initial weights, "
               "balancing or sharding of lockstep-trainer's: pass such settings to your program after --");
  }
  return {};
}

}  // namespace

// The parameter server (docs/trainer.md): where it runs, and what it does not combine with.
Result<void> validateSync(const JobSpec& spec) {
  if (spec.sync == Sync::kAllReduce) {
    if (spec.staleness != 0) return bad("--staleness goes with --sync parameter-server (all-reduce is synchronous)");
    return {};
  }
  if (spec.shard != Shard::kNone) {
    return bad("--sync parameter-server keeps the optimizer state on the server already: use --shard none with it");
  }
  if (spec.rebalanceEvery != 0) {
    return bad("--balance dynamic re-splits synchronous all-reduce steps: with a parameter server use --balance even "
               "(asynchronous training, --staleness K, lets a slow rank lag instead)");
  }
  if (spec.serverRanks() > 1 && spec.staleness > 0) {
    return bad("--ps-ranks " + std::to_string(spec.psRanks) + " with --staleness " + std::to_string(spec.staleness) +
               ": a server split over ranks is synchronous only for now (each part would order the asynchronous "
               "updates on its own); use --ps-ranks 1, or --staleness 0");
  }
  if (spec.staleness > 0 && spec.epochs > 0) {
    return bad("asynchronous training counts the server's updates, each one rank's batch: give --steps, not --epochs");
  }
  return validateStaleness(spec);
}

Result<void> validatePsRanks(const JobSpec& spec) {
  if (spec.psRanks > 1 && spec.sync != Sync::kParameterServer) {
    return bad("--ps-ranks goes with --sync parameter-server (all-reduce has no server to split)");
  }
  if (spec.worldSize == 0 || spec.serverRanks() <= spec.worldSize) return {};
  return bad("--ps-ranks " + std::to_string(spec.psRanks) + " with " + std::to_string(spec.worldSize) +
             " ranks: the server's parts live in ranks' processes, one part each; use --ps-ranks " +
             std::to_string(spec.worldSize) + " or fewer");
}

Result<void> validateStaleness(const JobSpec& spec) {
  const std::uint32_t ranks = spec.worldSize;
  if (spec.staleness == 0 || spec.staleness + 1 >= ranks) return {};
  return bad("--staleness " + std::to_string(spec.staleness) + " with " + std::to_string(ranks) +
             " ranks: each update is one rank's gradient, so even in lockstep a gradient is " + std::to_string(ranks - 1) +
             " updates old; use --staleness 0 (synchronous) or at least " + std::to_string(ranks - 1));
}

bool isRankVariable(std::string_view name) {
  return std::find(std::begin(kRankVariables), std::end(kRankVariables), name) != std::end(kRankVariables) ||
         name.rfind("LOCKSTEP_", 0) == 0 || name.rfind("TORCHELASTIC_", 0) == 0;
}

std::string combinedOwner(const std::vector<std::string>& parts) {
  std::vector<std::string> distinct;
  for (const auto& owner : parts) {
    if (!owner.empty() && std::find(distinct.begin(), distinct.end(), owner) == distinct.end()) distinct.push_back(owner);
  }
  std::string out;
  for (const auto& owner : distinct) out += (out.empty() ? "" : ", ") + owner;
  return out;
}

JobState combinedState(const std::vector<JobState>& parts) {
  bool running = false, failed = false, stopped = false, starting = false;
  for (JobState s : parts) {
    starting |= s == JobState::kStarting;
    running |= s == JobState::kRunning;
    failed |= s == JobState::kFailed;
    stopped |= s == JobState::kStopped;
  }
  if (failed) return JobState::kFailed;
  if (running) return JobState::kRunning;
  if (starting || parts.empty()) return JobState::kStarting;
  return stopped ? JobState::kStopped : JobState::kFinished;
}

JobState jobOutcome(const Supervision& supervision, const std::vector<JobState>& parts) {
  return supervision.state == SupervisionState::kEnded ? supervision.outcome : combinedState(parts);
}

bool jobOver(const Supervision& supervision, const std::vector<JobState>& parts) {
  if (supervision.state != SupervisionState::kNone) return supervision.state == SupervisionState::kEnded;
  return !parts.empty() && std::all_of(parts.begin(), parts.end(), jobStateEnded);
}

bool decidesOutcome(const Supervision& supervision) {
  return supervision.state != SupervisionState::kNone && supervision.state != SupervisionState::kEnded;
}

std::string_view jobStateWord(const Supervision& supervision, JobState state) {
  return restarting(supervision) ? "restarting" : jobStateName(state);
}

std::string_view jobStateName(JobState state) {
  switch (state) {
    case JobState::kStarting: return "starting";
    case JobState::kRunning: return "running";
    case JobState::kFinished: return "finished";
    case JobState::kFailed: return "failed";
    case JobState::kStopped: return "stopped";
  }
  return "unknown";
}

std::string_view jobEventKindName(JobEventKind kind) {
  switch (kind) {
    case JobEventKind::kStarted: return "started";
    case JobEventKind::kRankStarted: return "rank_started";
    case JobEventKind::kRankExited: return "rank_exited";
    case JobEventKind::kCheckpointSaved: return "checkpoint_saved";
    case JobEventKind::kFinished: return "finished";
    case JobEventKind::kFailed: return "failed";
    case JobEventKind::kStopped: return "stopped";
    case JobEventKind::kStalled: return "stalled";
    case JobEventKind::kStallEnded: return "stall_ended";
    case JobEventKind::kRankEvidence: return "rank_evidence";
    case JobEventKind::kNote: return "note";
    case JobEventKind::kAlertFiring: return "alert_firing";
    case JobEventKind::kAlertResolved: return "alert_resolved";
    case JobEventKind::kAlertUndelivered: return "alert_undelivered";
    case JobEventKind::kPeak: return "peak";
  }
  return "unknown";
}

Result<void> validateJobId(const std::string& jobId) {
  if (jobId.empty() || jobId.size() > 64) {
    return bad("job id '" + jobId.substr(0, 80) + "' must be 1 to 64 characters long");
  }
  if (jobId.front() == '.' || jobId.front() == '-') {
    return bad("job id '" + jobId + "' must not start with '.' or '-'");
  }
  for (char c : jobId) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return bad("job id '" + jobId + "' may contain only letters, digits, '.', '_' and '-'");
  }
  return {};
}

namespace {

// The job's agents: one per node, every rank's node among them, keys of CURVE's length.
Result<void> validateJobAgents(const JobSpec& spec) {
  if (spec.agents.empty()) return {};
  if (spec.agents.size() > kMaxWorldSize) return bad("a job lists at most " + std::to_string(kMaxWorldSize) + " agents");
  std::set<std::string> nodes;
  for (const auto& a : spec.agents) {
    LOCKSTEP_TRY(checkRequired("job agent node", a.node, 255));
    LOCKSTEP_TRY(checkRequired("job agent address", a.address, 300));
    if (a.publicKey.size() != 40) return bad("job agent " + a.node + "'s public key is not 40 characters of Z85");
    if (!nodes.insert(a.node).second) return bad("job lists node " + a.node + "'s agent twice");
  }
  for (const auto& r : spec.ranks) {
    if (!nodes.count(r.node)) return bad("rank " + std::to_string(r.rank) + "'s node " + r.node + " is not among the job's agents");
  }
  // The first agent supervises: rank 0's of the first attempt (a restart may move rank 0).
  for (const auto& r : spec.ranks) {
    if (spec.attempt == 0 && r.rank == 0 && r.node != spec.agents.front().node) {
      return bad("the job's first agent (its supervisor) is node " + spec.agents.front().node + "'s, not rank 0's node " + r.node);
    }
  }
  return {};
}

// How many alert rules and webhooks, and how long each: their form is the alerts library's to
// check (alerts/rules.h, alerts/webhook.h), which the agent and lockstepctl do before any rank starts.
Result<void> validateAlerting(const JobSpec& spec) {
  if (spec.alertRules.size() > kMaxAlertRules) return bad("a job takes at most " + std::to_string(kMaxAlertRules) + " --alert rules");
  if (spec.notify.size() > kMaxWebhooks) return bad("a job takes at most " + std::to_string(kMaxWebhooks) + " --notify URLs");
  for (const auto& rule : spec.alertRules) LOCKSTEP_TRY(checkRequired("alert rule", rule, kMaxAlertRuleBytes));
  for (const auto& url : spec.notify) LOCKSTEP_TRY(checkRequired("--notify URL", url, kMaxWebhookUrlBytes));
  return {};
}

}  // namespace

Result<void> validateJobSpec(const JobSpec& spec) {
  LOCKSTEP_TRY(validateJobId(spec.jobId));
  LOCKSTEP_TRY(validateFields(spec));
  LOCKSTEP_TRY(spec.command ? validateCommandJob(spec) : validateTrainerJob(spec));
  if (spec.onStall == OnStall::kRestart && spec.maxRestarts == 0) {
    return bad("--on-stall restart restarts the job from its last checkpoint: give --max-restarts N too");
  }
  LOCKSTEP_TRY(validatePlacements(spec));
  LOCKSTEP_TRY(validateJobAgents(spec));
  LOCKSTEP_TRY(validateAlerting(spec));
  // Slurm's job ids: 42, or 42_7 for an array's task.
  if (spec.slurmJobId.size() > 32 || spec.slurmJobId.find_first_not_of("0123456789_") != std::string::npos) {
    return bad("slurm job id '" + spec.slurmJobId.substr(0, 32) + "' is not a Slurm job id (digits, or JOB_TASK)");
  }
  return {};
}

Result<void> validateNodeHello(const NodeHello& hello) {
  if (hello.protocolVersion == 0) return bad("node hello: protocol version is required");
  LOCKSTEP_TRY(checkRequired("node hello host", hello.host, 255));
  LOCKSTEP_TRY(checkText("node hello agent version", hello.agentVersion, 64));
  LOCKSTEP_TRY(checkText("node hello GPU status", hello.gpuStatus, 1024));
  if (hello.gpus.size() > 64) return bad("node hello lists " + std::to_string(hello.gpus.size()) + " GPUs; at most 64");
  std::set<std::uint32_t> indexes;
  for (const auto& gpu : hello.gpus) {
    if (!indexes.insert(gpu.index).second) return bad("node hello lists GPU " + std::to_string(gpu.index) + " twice");
    LOCKSTEP_TRY(checkText("GPU name", gpu.name, 256));
    LOCKSTEP_TRY(checkText("GPU UUID", gpu.uuid, 128));
  }
  if (hello.cpuCorePeakFlops && !(*hello.cpuCorePeakFlops > 0 && *hello.cpuCorePeakFlops <= kMaxPeakFlops)) {
    return bad("node hello CPU core peak is out of range (0 to 1e17 FLOP/s)");
  }
  LOCKSTEP_TRY(checkText("node hello CPU peak basis", hello.cpuPeakBasis, 1024));
  if (hello.fencesOff.size() > 8) return bad("node hello lists " + std::to_string(hello.fencesOff.size()) + " fences off; at most 8");
  for (const auto& off : hello.fencesOff) LOCKSTEP_TRY(checkText("node hello fence", off, 1024));
  return {};
}

Result<void> validateJobEvent(const JobEvent& event) {
  LOCKSTEP_TRY(validateJobId(event.jobId));
  const int kind = static_cast<int>(event.kind);
  if (kind < static_cast<int>(JobEventKind::kStarted) || kind > static_cast<int>(JobEventKind::kPeak)) {
    return bad("job event kind is missing or unknown (" + std::to_string(kind) + ")");
  }
  LOCKSTEP_TRY(checkText("job event message", event.message, kMaxTextLength));
  LOCKSTEP_TRY(checkText("job event log tail", event.logTail, kMaxTextLength));
  if (event.signal && (*event.signal < 1 || *event.signal > 64)) return bad("job event signal is out of range");
  return {};
}

Result<void> validateGpuSample(const GpuSample& s) {
  LOCKSTEP_TRY(checkRequired("GPU sample node", s.node, 255));
  if (!s.jobId.empty()) LOCKSTEP_TRY(validateJobId(s.jobId));
  if (s.utilizationPct) LOCKSTEP_TRY(checkRange("GPU utilization %", *s.utilizationPct, 0.0, 100.0));
  if (s.temperatureC) LOCKSTEP_TRY(checkRange("GPU temperature", *s.temperatureC, -60.0, 250.0));
  return {};
}

Result<void> validateProcessSample(const ProcessSample& s) {
  LOCKSTEP_TRY(validateJobId(s.jobId));
  if (s.cpuPct) LOCKSTEP_TRY(checkRange("process CPU %", *s.cpuPct, 0.0, 100.0 * 4096));
  return {};
}

Result<void> validateNetSample(const NetSample& s) {
  LOCKSTEP_TRY(checkRequired("network sample node", s.node, 255));
  LOCKSTEP_TRY(checkRequired("network sample interface", s.interface, 64));
  return {};
}

namespace {

// kMaxTimeUnixUs (validate.h) also keeps a timeline from reaching centuries out, and `time -
// duration` far from overflowing.

Result<void> checkTime(const char* record, std::int64_t timeUnixUs) {
  if (timeUnixUs < 0 || timeUnixUs > kMaxTimeUnixUs) {
    return bad(std::string(record) + " time " + std::to_string(timeUnixUs) +
               " is not microseconds since 1970 (nanoseconds? microseconds reach the year 2286)");
  }
  return {};
}

// Whether `text` is UTF-8: no stray continuation byte, no overlong form, no surrogate, nothing past U+10FFFF.
bool isUtf8(std::string_view text) {
  static constexpr std::uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
  for (std::size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::size_t more = 0;
    std::uint32_t code = lead;
    if (lead >= 0x80) {
      if ((lead & 0xE0) == 0xC0) more = 1, code = lead & 0x1F;
      else if ((lead & 0xF0) == 0xE0) more = 2, code = lead & 0x0F;
      else if ((lead & 0xF8) == 0xF0) more = 3, code = lead & 0x07;
      else return false;
      if (i + more >= text.size()) return false;
      for (std::size_t k = 1; k <= more; ++k) {
        const auto next = static_cast<unsigned char>(text[i + k]);
        if ((next & 0xC0) != 0x80) return false;
        code = (code << 6) | (next & 0x3F);
      }
      if (code < kLeast[more] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    }
    i += more + 1;
  }
  return true;
}

bool knownKind(CollectiveKind kind) {
  return std::ranges::any_of(kCollectiveKindNames, [&](const auto& n) { return n.value == kind; });
}

Result<void> checkCollectiveTime(const std::string& what, std::int64_t us) {
  if (us < 0) return bad("step report " + what + " is negative");
  if (us > kMaxStepTimeUs) return bad("step report " + what + " is over a week (in microseconds?)");
  return {};
}

Result<void> validateCollectives(const StepReport& r) {
  if (r.collectives.size() > std::size(kCollectiveKindNames)) {
    return bad("step report has " + std::to_string(r.collectives.size()) + " collective entries; at most one per kind (" +
               std::to_string(std::size(kCollectiveKindNames)) + ")");
  }
  std::uint32_t seen = 0;
  for (const auto& c : r.collectives) {
    if (!knownKind(c.kind)) return bad("step report collective kind " + std::to_string(static_cast<int>(c.kind)) + " is unknown");
    const std::uint32_t bit = 1u << static_cast<int>(c.kind);
    if (seen & bit) return bad("step report lists " + std::string(nameOf(c.kind)) + " twice (one entry per kind)");
    seen |= bit;
    LOCKSTEP_TRY(checkCollectiveTime(std::string(nameOf(c.kind)) + " time", c.timeUs));
    LOCKSTEP_TRY(checkCollectiveTime(std::string(nameOf(c.kind)) + " exposed time", c.exposedUs));
  }
  if (r.collectiveSpans.size() > kMaxCollectiveSpans) {
    return bad("step report has " + std::to_string(r.collectiveSpans.size()) + " collective spans; at most " +
               std::to_string(kMaxCollectiveSpans));
  }
  for (const auto& s : r.collectiveSpans) {
    if (!knownKind(s.kind)) return bad("step report collective kind " + std::to_string(static_cast<int>(s.kind)) + " is unknown");
    LOCKSTEP_TRY(checkTime("step report collective span", s.startUnixUs));
    LOCKSTEP_TRY(checkCollectiveTime("collective span duration", s.durationUs));
    LOCKSTEP_TRY(checkCollectiveTime("collective span exposed time", s.exposedUs));
  }
  return {};
}

}  // namespace

namespace {

template <class E>
bool named(E value) {
  return std::ranges::any_of(namesOf(value), [&](const auto& n) { return n.value == value; });
}

// A rank's FLOPs in a step, their basis and precision, and the peak its agent set (docs/kpis.md).
Result<void> validateFlops(const StepReport& r) {
  // A step of a week (kMaxStepTimeUs) at 100 PFLOP/s: beyond that a unit was mistaken.
  if (r.flops && !(*r.flops >= 0 && *r.flops <= kMaxStepFlops)) {
    return bad("step report flops is out of range (0 to 6e22 FLOPs in one step)");
  }
  if (r.flopsBasis && !named(*r.flopsBasis)) {
    return bad("step report flops basis " + std::to_string(static_cast<int>(*r.flopsBasis)) + " is unknown");
  }
  if (r.precision && !named(*r.precision)) {
    return bad("step report precision " + std::to_string(static_cast<int>(*r.precision)) + " is unknown");
  }
  if (r.peakFlops && !(*r.peakFlops > 0 && *r.peakFlops <= kMaxPeakFlops)) {
    return bad("step report peak is out of range (0 to 1e17 FLOP/s)");
  }
  return {};
}

}  // namespace

Result<void> validateStepReport(const StepReport& r) {
  LOCKSTEP_TRY(validateJobId(r.jobId));
  LOCKSTEP_TRY(checkRange("step report world size", r.worldSize, 1, kMaxWorldSize));
  if (r.rank >= r.worldSize) {
    return bad("step report rank " + std::to_string(r.rank) + " is outside world size " + std::to_string(r.worldSize));
  }
  if (r.step == 0) return bad("step report step is required (steps count from 1)");
  LOCKSTEP_TRY(checkTime("step report", r.timeUnixUs));
  for (auto [field, value] : {std::pair{"data time", r.dataTimeUs}, {"compute time", r.computeTimeUs},
                              {"exposed communication time", r.exposedCommTimeUs},
                              {"all-reduce time", r.allreduceTimeUs}, {"optimizer time", r.optimizerTimeUs},
                              {"step time", std::optional<std::int64_t>(r.stepTimeUs)}}) {
    if (value && *value < 0) return bad(std::string("step report ") + field + " is negative");
    // Microseconds: a week is beyond any step; more is a unit mistaken (ns for us, say).
    if (value && *value > kMaxStepTimeUs) return bad(std::string("step report ") + field + " is over a week (in microseconds?)");
  }
  LOCKSTEP_TRY(checkRange("step report lr", r.lr, 0.0, 1e6));
  LOCKSTEP_TRY(validateFlops(r));
  return validateCollectives(r);
}

Result<void> validatePhaseReport(const PhaseReport& r) {
  LOCKSTEP_TRY(validateJobId(r.jobId));
  LOCKSTEP_TRY(checkRange("phase report world size", r.worldSize, 1, kMaxWorldSize));
  if (r.rank >= r.worldSize) {
    return bad("phase report rank " + std::to_string(r.rank) + " is outside world size " + std::to_string(r.worldSize));
  }
  LOCKSTEP_TRY(checkRequired("phase report name", r.name, kMaxPhaseNameBytes));
  if (!isUtf8(r.name)) return bad("phase report name is not UTF-8");
  for (const unsigned char c : r.name) {
    if (c < 0x20 || c == 0x7f) return bad("phase report name has a control character");
  }
  LOCKSTEP_TRY(checkTime("phase report", r.timeUnixUs));
  if (r.durationUs < 0) return bad("phase report duration is negative");
  if (r.durationUs > kMaxStepTimeUs) return bad("phase report duration is over a week (in microseconds?)");
  return {};
}

}  // namespace lockstep
