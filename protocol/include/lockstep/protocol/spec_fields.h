#pragma once
// One description of a job spec's fields (issue 41), as records.h is for streamed records: each
// field's place in the schema (lockstep.v1.JobSpec, or its `optimizer` / `prices` message), the
// JobSpec member, how messages name it, the range it may take, and its flag. From this one table
// follow the protobuf conversion (codec.cpp, through protobuf's reflection) and so the JSON form,
// the checks of each field's range and length (validate.cpp), the trainer's and lockstepctl's job
// flags both ways and their usage lines (jobflags). A field is added to the schema, the struct and
// its line here. What cannot be one scalar — the data set, the placements, the agents and a command
// job's program — is converted by hand and listed in kStructured; tests/spec_fields_test.cpp checks
// that the two together name every field of the schema's JobSpec, and walks every row through the
// protobuf, JSON and flag forms.

#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep::spec {

// Which jobs take a field as a flag: the built-in trainer's, a command job's (the user's own
// program), both, or neither (the client or agent that places the job sets it).
enum class Jobs : unsigned { kNone = 0, kTrainer = 1, kCommand = 2, kBoth = 3 };

constexpr bool takes(Jobs field, Jobs job) { return (static_cast<unsigned>(field) & static_cast<unsigned>(job)) != 0; }

// A field that is a list (the layer sizes): its codec and its flag treat it element by element.
template <class T>
struct IsList : std::false_type {};
template <class T>
struct IsList<std::vector<T>> : std::true_type {};

struct Flag {
  std::string_view name;     // "--lr"; empty: no flag
  Jobs jobs = Jobs::kNone;
  std::string_view metavar;  // "X" in "--lr X"; empty: a switch
  std::string_view help;     // the usage line (continued lines start with '\n')
  std::string_view group;    // the usage section
};

// Modifiers of how a value is written: `invert` for a bool the schema and its switch say the other
// way round (shuffle: no_shuffle, --no-shuffle); `zeroWord` for a number whose 0 a flag may spell
// ("auto"); `alwaysWritten` for a flag whose default the trainer works out from other flags, so a
// writer of flags gives it even when it holds JobSpec{}'s value; `boundOnFlag` for a bound only the
// flag has always had (a spec from JSON or the wire was never held to it, and a job table written
// by an earlier agent may hold such a spec); `bytes` for a size its flag writes with a unit.
struct Style {
  bool invert = false;
  std::string_view zeroWord;
  bool alwaysWritten = false;
  bool boundOnFlag = false;
  bool bytes = false;  // kBytes
};
inline constexpr Style kInverted{true, {}, false, false};
inline constexpr Style kAlwaysWritten{false, {}, true, false};
inline constexpr Style kAutoIsZero{false, "auto", false, false};
inline constexpr Style kBoundOnFlag{false, {}, false, true};
// A size in bytes that its flag writes with a unit: 512K, 256M, 4G, 1T (binary; a bare number is
// MiB, as Slurm's --mem).
inline constexpr Style kBytes{false, {}, false, false, true};

template <class T>
struct Field {
  using Type = T;
  std::string_view message;  // the JobSpec's sub-message that holds it; empty: JobSpec itself
  std::string_view name;     // its field there, and its JSON key (in lowerCamelCase)
  T& (*ref)(JobSpec&);
  std::string_view label;    // how a message names it: "batch per rank"
  double lo = 0;             // numbers (each element of a list): at least lo ...
  double hi = 0;             // ... and at most hi (0: any); text: at most hi bytes (0: any)
  Flag flag{};
  Style style{};

  const T& of(const JobSpec& s) const { return ref(const_cast<JobSpec&>(s)); }
  T& of(JobSpec& s) const { return ref(s); }
};

// A row of kFields; what a row leaves out is no flag and the plain style.
template <class T>
constexpr Field<T> row(std::string_view message, std::string_view name, T& (*ref)(JobSpec&), std::string_view label,
                       double lo, double hi, Flag flag = {}, Style style = {}) {
  return Field<T>{message, name, ref, label, lo, hi, flag, style};
}

// A member of JobSpec, however deep, as a plain function (what Field keeps).
#define LOCKSTEP_SPEC_MEMBER(type, path) [](JobSpec& s) -> type& { return s.path; }

inline constexpr char kJob[] = "Job";
inline constexpr char kOptim[] = "Optimizer";
inline constexpr char kComm[] = "Communication and restarts";
inline constexpr char kCkpt[] = "Checkpoints and weights";
inline constexpr char kOut[] = "Output";
inline constexpr char kRes[] = "What each rank may take of its node (through agents; docs/fences.md)";

// Twice the largest jobs run today (16,384 GPUs): a spec placing 32,768 ranks on nodes with
// 64-character names is about 2.5 MB, under the 4 MiB a message may be (codec.h).
inline constexpr std::uint32_t kMaxWorldSize = 32768;
inline constexpr double kMaxPathLength = 4096;

inline constexpr auto kFields = std::tuple{
    row<std::string>("", "job_id", LOCKSTEP_SPEC_MEMBER(std::string, jobId), "job id", 0, 0,
                       {"--job-id", Jobs::kBoth, "ID", "job id in metrics and reports (default $LOCKSTEP_JOB_ID or \"local\")", kOut},
                       kAlwaysWritten),
    row<std::string>("", "name", LOCKSTEP_SPEC_MEMBER(std::string, name), "name", 0, 256,
                       {"--name", Jobs::kBoth, "TEXT", "a name for people: the history and reports show it beside the id", kOut}),
    row<Backend>("", "backend", LOCKSTEP_SPEC_MEMBER(Backend, backend), "backend", 0, 0,
                   {"--backend", Jobs::kBoth, "cpu|cuda", "compute backend (default cpu: OpenBLAS + Gloo; for your own program:\nwhether its ranks get GPUs)", kJob}),
    row<std::vector<std::uint32_t>>("", "layers", LOCKSTEP_SPEC_MEMBER(std::vector<std::uint32_t>, layers), "layers", 0, 1u << 30,
                                      {"--layers", Jobs::kTrainer, "A,B,...,C", "layer sizes: input features first, classes last (required)", kJob}),
    row<Activation>("", "activation", LOCKSTEP_SPEC_MEMBER(Activation, activation), "activation", 0, 0,
                      {"--activation", Jobs::kTrainer, "relu|gelu", "hidden activation (default relu)", kJob}),
    row<Precision>("", "precision", LOCKSTEP_SPEC_MEMBER(Precision, precision), "precision", 0, 0,
                     {"--precision", Jobs::kTrainer, "fp32|tf32|bf16", "math precision (default: bf16 with fp32 master weights on GPUs; the CPU\nbackend computes in fp32 only)", kJob},
                     kAlwaysWritten),
    row<std::uint32_t>("", "batch_per_rank", LOCKSTEP_SPEC_MEMBER(std::uint32_t, batchPerRank), "batch per rank", 1, 1 << 20,
                         {"--batch-per-rank", Jobs::kTrainer, "N", "samples per rank per micro-step (default 64)", kJob}),
    row<std::uint32_t>("", "accum_steps", LOCKSTEP_SPEC_MEMBER(std::uint32_t, accumSteps), "accum steps", 1, 4096,
                         {"--accum-steps", Jobs::kTrainer, "N", "micro-steps per optimizer step (default 1)", kJob}),
    row<std::uint64_t>("", "steps", LOCKSTEP_SPEC_MEMBER(std::uint64_t, steps), "steps", 0, 1e12,
                         {"--steps", Jobs::kTrainer, "N", "how many steps to train (give --steps or --epochs)", kJob}),
    row<std::uint32_t>("", "epochs", LOCKSTEP_SPEC_MEMBER(std::uint32_t, epochs), "epochs", 0, 1e6,
                         {"--epochs", Jobs::kTrainer, "N", "how many epochs to train", kJob}),
    row<std::optional<double>>("", "target_loss", LOCKSTEP_SPEC_MEMBER(std::optional<double>, targetLoss), "target loss", 0, 1e6,
                                 {"--target-loss", Jobs::kBoth, "X", "stop early once the smoothed loss is at or below X", kJob}),
    row<bool>("", "no_shuffle", LOCKSTEP_SPEC_MEMBER(bool, shuffle), "shuffle", 0, 0,
                {"--no-shuffle", Jobs::kTrainer, "", "global step k takes samples [k*G, (k+1)*G) in order (G: global batch)", kJob},
                kInverted),
    row<std::uint64_t>("", "seed", LOCKSTEP_SPEC_MEMBER(std::uint64_t, seed), "seed", 0, 0,
                         {"--seed", Jobs::kTrainer, "N", "weight init and shuffle seed (default 0)", kJob}),

    row<OptimizerKind>("optimizer", "kind", LOCKSTEP_SPEC_MEMBER(OptimizerKind, optimizer.kind), "optimizer", 0, 0,
                         {"--optimizer", Jobs::kTrainer, "sgd|adamw", "(default sgd)", kOptim}),
    row<double>("optimizer", "lr", LOCKSTEP_SPEC_MEMBER(double, optimizer.lr), "lr", 0, 0,
                  {"--lr", Jobs::kTrainer, "X", "learning rate (default 0.01)", kOptim}),
    row<double>("optimizer", "momentum", LOCKSTEP_SPEC_MEMBER(double, optimizer.momentum), "momentum", 0, 0,
                  {"--momentum", Jobs::kTrainer, "X", "SGD momentum (default 0)", kOptim}),
    row<bool>("optimizer", "nesterov", LOCKSTEP_SPEC_MEMBER(bool, optimizer.nesterov), "nesterov", 0, 0,
                {"--nesterov", Jobs::kTrainer, "", "Nesterov momentum (SGD)", kOptim}),
    row<double>("optimizer", "weight_decay", LOCKSTEP_SPEC_MEMBER(double, optimizer.weightDecay), "weight decay", 0, 1e3,
                  {"--weight-decay", Jobs::kTrainer, "X", "SGD: L2 added to the gradient; AdamW: decoupled (default 0)", kOptim}),
    row<double>("optimizer", "beta1", LOCKSTEP_SPEC_MEMBER(double, optimizer.beta1), "beta1", 0, 0,
                  {"--beta1", Jobs::kTrainer, "X", "AdamW (default 0.9)", kOptim}),
    row<double>("optimizer", "beta2", LOCKSTEP_SPEC_MEMBER(double, optimizer.beta2), "beta2", 0, 0,
                  {"--beta2", Jobs::kTrainer, "X", "AdamW (default 0.999)", kOptim}),
    row<double>("optimizer", "eps", LOCKSTEP_SPEC_MEMBER(double, optimizer.eps), "eps", 0, 0,
                  {"--eps", Jobs::kTrainer, "X", "AdamW (default 1e-8)", kOptim}),
    row<LrScaling>("optimizer", "lr_scaling", LOCKSTEP_SPEC_MEMBER(LrScaling, optimizer.lrScaling), "lr scaling", 0, 0,
                     {"--lr-scaling", Jobs::kTrainer, "none|linear", "linear: lr x global batch / lr base batch", kOptim}),
    row<std::uint32_t>("optimizer", "lr_base_batch", LOCKSTEP_SPEC_MEMBER(std::uint32_t, optimizer.lrBaseBatch), "lr base batch", 0, 1u << 30,
                         {"--lr-base-batch", Jobs::kTrainer, "N", "the batch the lr was tuned for (default: --batch-per-rank)", kOptim}),

    row<double>("", "bucket_mb", LOCKSTEP_SPEC_MEMBER(double, bucketMb), "bucket size in MB (0: chosen by measurement)", 0, 4096,
                  {"--bucket-mb", Jobs::kTrainer, "X|auto", "gradient bucket size in MB; buckets all-reduce while backward goes on.\nauto (the default): measured at start-up and chosen to hide the most\ncommunication, chosen again if they drift (CPU backend)", kComm},
                  kAutoIsZero),
    row<std::uint32_t>("", "rebalance_every", LOCKSTEP_SPEC_MEMBER(std::uint32_t, rebalanceEvery), "rebalance every", 0, 1e6,
                         {"--rebalance-every", Jobs::kTrainer, "N", "with --balance dynamic: steps between re-splits (default 10)", kComm}),
    row<Shard>("", "shard", LOCKSTEP_SPEC_MEMBER(Shard, shard), "shard", 0, 0,
                 {"--shard", Jobs::kTrainer, "none|optimizer|gradients|parameters", "what each rank keeps 1/N of (ZeRO stages 1-3; default none: all of it).\noptimizer: the optimizer state; gradients are reduce-scattered and the\nparameters all-gathered after each step. gradients: the gradients too,\nreduce-scattered a bucket at a time while backward goes on. parameters:\nthe parameters too, each layer all-gathered as it is reached (docs/trainer.md)", kComm}),
    row<Sync>("", "sync", LOCKSTEP_SPEC_MEMBER(Sync, sync), "sync", 0, 0,
                {"--sync", Jobs::kTrainer, "allreduce|parameter-server", "how the ranks combine gradients (default allreduce). parameter-server:\nrank 0's process holds the master model and the optimizer; every rank\npushes its gradients there and pulls the weights (docs/trainer.md)", kComm}),
    row<std::uint32_t>("", "staleness", LOCKSTEP_SPEC_MEMBER(std::uint32_t, staleness), "staleness", 0, 1000,
                         {"--staleness", Jobs::kTrainer, "K", "with --sync parameter-server: 0 (the default) synchronous; K >= 1\nasynchronous, each rank's gradient an update of its own, computed on\nweights at most K updates old (--steps counts the server's updates)", kComm}),
    row<std::uint32_t>("", "ps_ranks", LOCKSTEP_SPEC_MEMBER(std::uint32_t, psRanks), "server ranks", 0, 4096,
                         {"--ps-ranks", Jobs::kTrainer, "N", "with --sync parameter-server: split the server by parameter ranges over\nthe processes of ranks 0..N-1 (default 1: all of it in rank 0's), so that\nno one rank's link carries every rank's bytes; synchronous only", kComm}),
    row<std::uint32_t>("", "max_restarts", LOCKSTEP_SPEC_MEMBER(std::uint32_t, maxRestarts), "max restarts", 0, 100,
                         {"--max-restarts", Jobs::kBoth, "N", "through agents: when ranks or nodes are lost, restart from the last\ncheckpoint with the ranks left, up to N times (needs --checkpoint-dir on a\npath all nodes see for the trainer)", kComm}),
    row<std::uint32_t>("", "min_world_size", LOCKSTEP_SPEC_MEMBER(std::uint32_t, minWorldSize), "min ranks", 0, kMaxWorldSize,
                         {"--min-ranks", Jobs::kBoth, "N", "with --max-restarts: fail instead when fewer ranks remain (default 1)", kComm},
                         kBoundOnFlag),
    row<OnStall>("", "on_stall", LOCKSTEP_SPEC_MEMBER(OnStall, onStall), "on stall", 0, 0,
                   {"--on-stall", Jobs::kBoth, "report|stop|restart", "through agents: what a stall does (no rank's progress moved for\n--stall-after-s): report it (default), fail the job with the diagnosis,\nor restart it from its last checkpoint (--max-restarts)", kComm}),
    row<std::uint32_t>("", "stall_after_s", LOCKSTEP_SPEC_MEMBER(std::uint32_t, stallAfterS), "stall after (s)", 0, 86400,
                         {"--stall-after-s", Jobs::kBoth, "N", "how long progress may stand still (default: the larger of 14 s and 5x\nthe rank's recent p99 step time; before the first step, 10x that)", kComm}),
    row<std::optional<double>>("", "budget", LOCKSTEP_SPEC_MEMBER(std::optional<double>, budget), "budget", 0, 1e12,
                                 {"--budget", Jobs::kBoth, "AMOUNT", "through agents: stop the job with a checkpoint once its cost reaches\nAMOUNT (in the currency of its prices; docs/alerts.md)", kComm}),
    row<std::uint64_t>("", "mem_per_rank", LOCKSTEP_SPEC_MEMBER(std::uint64_t, memPerRank), "memory per rank", 0, 1e15,
                         {"--mem-per-rank", Jobs::kBoth, "SIZE", "memory each rank may use (512K, 256M, 4G); a rank over it is killed\n(default: the node's, else unbounded)", kRes},
                         kBytes),
    row<std::uint32_t>("", "max_processes_per_rank", LOCKSTEP_SPEC_MEMBER(std::uint32_t, maxProcessesPerRank), "processes per rank", 0, 1u << 22,
                         {"--max-processes-per-rank", Jobs::kBoth, "N", "processes and threads each rank may have (default 4096)", kRes}),
    row<std::uint32_t>("", "cpus_per_rank", LOCKSTEP_SPEC_MEMBER(std::uint32_t, cpusPerRank), "cores per rank", 0, 4096,
                         {"--cpus-per-rank", Jobs::kBoth, "N", "cores of its own for each rank (default 1)", kRes}),
    row<std::uint32_t>("", "timeout_s", LOCKSTEP_SPEC_MEMBER(std::uint32_t, timeoutS), "timeout in seconds", 1, 86400,
                         {"--timeout-s", Jobs::kTrainer, "N", "limit for the rendezvous and every collective (default 60)", kComm}),

    row<std::string>("", "checkpoint_dir", LOCKSTEP_SPEC_MEMBER(std::string, checkpointDir), "checkpoint directory", 0, kMaxPathLength,
                       {"--checkpoint-dir", Jobs::kTrainer, "D", "where checkpoints go (step-NNNNNNNN.safetensors)", kCkpt}),
    row<std::uint32_t>("", "checkpoint_every", LOCKSTEP_SPEC_MEMBER(std::uint32_t, checkpointEvery), "checkpoint every", 0, 1u << 30,
                         {"--checkpoint-every", Jobs::kTrainer, "N", "write one every N steps (and when stopped by a signal)", kCkpt},
                         kBoundOnFlag),
    row<std::uint32_t>("", "keep_checkpoints", LOCKSTEP_SPEC_MEMBER(std::uint32_t, keepCheckpoints), "keep checkpoints", 0, 1u << 20,
                         {"--keep-checkpoints", Jobs::kTrainer, "N", "how many to keep (default 3)", kCkpt}),
    row<std::string>("", "init_weights_path", LOCKSTEP_SPEC_MEMBER(std::string, initWeightsPath), "initial weights path", 0, kMaxPathLength,
                       {"--init-weights", Jobs::kTrainer, "F", "start from these weights (safetensors, names layers.{i}.weight/bias)", kCkpt}),

    // Set by the client or agent that places the job: no flag.
    row<std::uint32_t>("", "world_size", LOCKSTEP_SPEC_MEMBER(std::uint32_t, worldSize), "world size", 1, kMaxWorldSize),
    row<std::string>("", "rendezvous_host", LOCKSTEP_SPEC_MEMBER(std::string, rendezvousHost), "rendezvous host", 0, 255),
    row<std::uint32_t>("", "rendezvous_port", LOCKSTEP_SPEC_MEMBER(std::uint32_t, rendezvousPort), "rendezvous port", 0, 65535),
    row<std::uint32_t>("", "attempt", LOCKSTEP_SPEC_MEMBER(std::uint32_t, attempt), "attempt", 0, 1000),
    row<std::string>("", "restart_reason", LOCKSTEP_SPEC_MEMBER(std::string, restartReason), "restart reason", 0, 4096),
    row<std::string>("", "slurm_job_id", LOCKSTEP_SPEC_MEMBER(std::string, slurmJobId), "slurm job id", 0, 0),
    row<std::uint32_t>("", "allocated_gpus", LOCKSTEP_SPEC_MEMBER(std::uint32_t, allocatedGpus), "allocated GPUs", 0, 1u << 20),
    row<double>("prices", "gpu_hour", LOCKSTEP_SPEC_MEMBER(double, prices.gpuHour), "price per GPU-hour", 0, 1e6),
    row<double>("prices", "core_hour", LOCKSTEP_SPEC_MEMBER(double, prices.coreHour), "price per core-hour", 0, 1e6),
    row<double>("prices", "kwh", LOCKSTEP_SPEC_MEMBER(double, prices.kwh), "price per kWh", 0, 1e6),
    row<std::string>("prices", "currency", LOCKSTEP_SPEC_MEMBER(std::string, prices.currency), "currency", 0, 8),
};

#undef LOCKSTEP_SPEC_MEMBER

// The fields of lockstep.v1.JobSpec converted by hand (codec.cpp), each with its own checks
// (validate.cpp): the data set (a oneof of messages), the ranks' placements, the job's agents and a
// command job's program (its argv, working directory and environment: --workdir, --env and what
// follows `--`).
// The alert rules and webhooks (--alert, --notify: repeated flags) are lists of text.
inline constexpr std::string_view kStructured[] = {"dataset", "ranks", "agents", "command", "alert_rules", "notify"};

// The messages inside JobSpec whose scalar fields kFields lists.
inline constexpr std::string_view kMessages[] = {"optimizer", "prices"};

template <class F>
constexpr void forEachField(F&& f) {
  std::apply([&](const auto&... each) { (f(each), ...); }, kFields);
}

}  // namespace lockstep::spec
