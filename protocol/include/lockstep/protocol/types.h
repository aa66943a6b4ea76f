#pragma once
// Plain domain structs for everything in the v1 schema (protocol/lockstep/v1/lockstep.proto).
// The rest of Lockstep uses these; only protocol/src sees generated protobuf code.
// Defaults here are the product's defaults (a JobSpec{} plus layers and dataset is a valid job).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep {

inline constexpr std::uint32_t kProtocolVersion = 1;

struct GpuInfo {
  std::uint32_t index = 0;
  std::string name;
  std::string uuid;
  std::uint64_t memoryTotalBytes = 0;
  bool operator==(const GpuInfo&) const = default;
};

struct NodeHello {
  std::uint32_t protocolVersion = kProtocolVersion;
  std::string agentVersion;
  std::string host;
  std::uint32_t cpuCores = 0;
  std::uint64_t memoryTotalBytes = 0;
  std::vector<GpuInfo> gpus;
  std::string gpuStatus;
  std::uint64_t lastSeq = 0;
  std::string nodeName;
  std::uint64_t instanceId = 0;
  std::uint32_t sampleHz = 0;
  std::int64_t timeUnixUs = 0;  // the agent's clock when it answered; 0: not said (an older agent)
  // What no running job holds (docs/fences.md), and each fence that is off here with why.
  std::uint32_t freeCores = 0;
  std::uint64_t freeMemoryBytes = 0;
  std::vector<std::string> fencesOff;
  std::optional<double> cpuCorePeakFlops;  // one core's fp32 GEMM peak, FLOP/s; unset: not known
  std::string cpuPeakBasis;                // where it came from, or why it is not known
  bool operator==(const NodeHello&) const = default;
};

enum class Backend { kCpu = 1, kCuda = 2 };
enum class Activation { kRelu = 1, kGelu = 2 };
// The trainer computes in the first three; an own program's step reports may say the others.
enum class Precision { kFp32 = 1, kTf32 = 2, kBf16 = 3, kFp16 = 4, kFp8 = 5 };
// How a step report's FLOPs were known (lockstep.proto's FlopsBasis).
enum class FlopsBasis { kDeclared = 1, kTokens = 2, kLayers = 3 };
enum class OptimizerKind { kSgd = 1, kAdamW = 2 };
enum class LrScaling { kNone = 0, kLinear = 1 };
// What each rank keeps of the model's state (lockstep.proto): all of it, or 1/N of the optimizer
// state (ZeRO stage 1), of the gradients too (2), of the parameters too (3).
enum class Shard { kNone = 0, kOptimizer = 1, kGradients = 2, kParameters = 3 };
// How the ranks combine their gradients (lockstep.proto): all-reduce, or a parameter server.
enum class Sync { kAllReduce = 0, kParameterServer = 1 };

struct SyntheticDataset {
  std::uint64_t samples = 65536;
  std::uint32_t dim = 784;
  std::uint32_t classes = 10;
  std::uint64_t seed = 1;
  bool operator==(const SyntheticDataset&) const = default;
};

struct NpyDataset {
  std::string featuresPath;
  std::string labelsPath;
  bool operator==(const NpyDataset&) const = default;
};

using DatasetSource = std::variant<SyntheticDataset, NpyDataset>;

struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kSgd;
  double lr = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  double weightDecay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  LrScaling lrScaling = LrScaling::kNone;
  std::uint32_t lrBaseBatch = 0;  // 0: the per-rank batch
  bool operator==(const OptimizerSpec&) const = default;
};

struct RankPlacement {
  std::uint32_t rank = 0;
  std::string node;
  std::uint32_t localRank = 0;
  std::optional<std::uint32_t> gpuIndex;
  bool operator==(const RankPlacement&) const = default;
};

struct Prices {
  double gpuHour = 0.0;
  double coreHour = 0.0;
  double kwh = 0.0;
  std::string currency = "USD";
  // Whether the job has a price at all: without one its cost is unknown, not 0.
  bool anySet() const { return gpuHour > 0 || coreHour > 0 || kwh > 0; }
  bool operator==(const Prices&) const = default;
};

// The user's own program as a job's ranks (lockstep.v1.Command; docs/own-program.md).
struct CommandSpec {
  std::vector<std::string> argv;  // argv[0]: absolute, relative to workingDir, or looked up in PATH
  std::string workingDir;         // absolute; empty: the agent's job directory
  std::vector<std::pair<std::string, std::string>> env;
  bool operator==(const CommandSpec&) const = default;
};

inline constexpr std::uint32_t kDefaultKeepCheckpoints = 3;

// How the job's launching client reached one of its agents (docs/agent.md: supervision).
struct JobAgent {
  std::string node;
  std::string address;    // HOST:PORT
  std::string publicKey;  // Z85, as the client pinned it
  bool operator==(const JobAgent&) const = default;
};

enum class OnStall { kReport = 0, kStop = 1, kRestart = 2 };

struct JobSpec {
  std::string jobId;
  std::string name;
  Backend backend = Backend::kCpu;
  std::vector<std::uint32_t> layers;
  Activation activation = Activation::kRelu;
  Precision precision = Precision::kFp32;
  DatasetSource dataset = SyntheticDataset{};
  std::uint32_t batchPerRank = 64;
  std::uint32_t accumSteps = 1;
  OptimizerSpec optimizer;
  std::uint64_t steps = 0;
  std::uint32_t epochs = 0;
  std::optional<double> targetLoss;
  bool shuffle = true;
  std::uint64_t seed = 0;
  double bucketMb = 0;  // 0: the trainer measures and chooses its buckets
  std::uint32_t checkpointEvery = 0;
  std::string checkpointDir;
  std::uint32_t keepCheckpoints = 0;  // the newest ones kept; 0: kDefaultKeepCheckpoints
  std::string initWeightsPath;
  std::uint32_t timeoutS = 60;
  std::uint32_t worldSize = 1;
  std::vector<RankPlacement> ranks;
  std::string rendezvousHost;
  std::uint32_t rendezvousPort = 0;
  Prices prices;
  std::uint32_t rebalanceEvery = 0;  // 0: even split; N: re-split by measured rates every N steps
  std::uint32_t maxRestarts = 0;     // elastic restarts (the supervising agent carries them out)
  std::uint32_t minWorldSize = 0;    // 0: 1
  std::uint32_t attempt = 0;         // restarts so far
  std::string restartReason;         // why this attempt started
  // Set: the ranks run this program instead of lockstep-trainer, and the MLP fields above (layers
  // to bucketMb, checkpoints, initial weights) do not apply.
  std::optional<CommandSpec> command;
  // The agents of the job's nodes. agents[0] (rank 0's agent of the first attempt) supervises the
  // job, agents[1] stands by; the others let their keys list, stop and restart this job only.
  // Empty: not supervised.
  std::vector<JobAgent> agents;
  // The Slurm job whose allocation runs this job, and the GPUs it holds (cost counts them all).
  std::string slurmJobId;
  std::uint32_t allocatedGpus = 0;
  // What a stall does (docs/stalls.md), and after how long a rank's progress counts as stalled
  // (0: the larger of 14 s and 5x its recent p99 step time).
  OnStall onStall = OnStall::kReport;
  std::uint32_t stallAfterS = 0;
  // Alerts (docs/alerts.md): the rules as written (alerts/rules.h checks them), the webhooks they
  // go to, and the cost at which the job stops with a checkpoint.
  std::vector<std::string> alertRules;
  std::vector<std::string> notify;
  std::optional<double> budget;
  // What each rank may take of its node (docs/fences.md): memory in bytes (0: the node's default,
  // else unbounded), processes and threads (0: kDefaultProcessesPerRank), cores (0: 1).
  std::uint64_t memPerRank = 0;
  std::uint32_t maxProcessesPerRank = 0;
  std::uint32_t cpusPerRank = 0;
  Shard shard = Shard::kNone;
  Sync sync = Sync::kAllReduce;
  std::uint32_t staleness = 0;  // with a parameter server: 0 synchronous, K >= 1 asynchronous
  std::uint32_t psRanks = 0;    // with a parameter server: the ranks holding a part of it (0: 1)
  std::uint32_t serverRanks() const { return psRanks > 0 ? psRanks : 1; }
  static constexpr std::uint32_t kDefaultProcessesPerRank = 4096;
  bool operator==(const JobSpec&) const = default;

  bool isCommand() const { return command.has_value(); }
  // The built-in trainer's global batch; 0 for a command job, whose batch only the program knows.
  std::uint64_t globalBatch() const {
    return isCommand() ? 0 : std::uint64_t{batchPerRank} * accumSteps * worldSize;
  }
};

// ---- streamed messages ----

enum class JobEventKind {
  kStarted = 1,
  kRankStarted = 2,
  kRankExited = 3,
  kCheckpointSaved = 4,
  kFinished = 5,
  kFailed = 6,
  kStopped = 7,
  kStalled = 8,       // message: the diagnosis
  kStallEnded = 9,    // progress moved again
  kRankEvidence = 10, // a stalled rank's state (message) and stacks (logTail)
  kNote = 11,         // what a rank says about its run (its bucket plan): message, rank
  kAlertFiring = 12,      // an alert rule fired: message its text, logTail its JSON (alerts/alert.h)
  kAlertResolved = 13,    // it resolved
  kAlertUndelivered = 14, // a webhook did not take an alert: message (the URL redacted) and why
  kPeak = 15,             // the peak a part's MFU is taken against, and its source: message
};

// "rank_exited", ...: the names reports and JSON use.
std::string_view jobEventKindName(JobEventKind kind);

struct JobEvent {
  std::string jobId;
  JobEventKind kind = JobEventKind::kStarted;
  std::int64_t timeUnixUs = 0;
  std::optional<std::uint32_t> rank;
  std::optional<std::int32_t> exitCode;
  std::optional<std::int32_t> signal;
  std::string message;
  std::string logTail;
  std::optional<std::uint64_t> step;
  bool operator==(const JobEvent& other) const;  // field by field, NaN equal to NaN (records.h)
};

struct GpuSample {
  std::string node;
  std::uint32_t gpuIndex = 0;
  std::int64_t timeUnixUs = 0;
  std::string jobId;
  std::optional<float> utilizationPct;
  std::optional<std::uint64_t> memoryUsedBytes;
  std::optional<std::uint32_t> powerMilliwatts;
  std::optional<std::uint64_t> energyMillijoules;
  std::optional<std::int32_t> temperatureC;
  std::optional<std::uint32_t> smClockMhz;
  bool operator==(const GpuSample& other) const;  // field by field, NaN equal to NaN (records.h)
};

struct ProcessSample {
  std::string jobId;
  std::uint32_t rank = 0;
  std::uint32_t pid = 0;
  std::int64_t timeUnixUs = 0;
  std::optional<float> cpuPct;
  std::optional<std::uint64_t> rssBytes;
  bool operator==(const ProcessSample& other) const;  // field by field, NaN equal to NaN (records.h)
};

// One network interface of a node, as the kernel counts it (docs/agent.md): totals since the
// interface came up. An InfiniBand port is named "ib:DEVICE/PORT". What the kernel or the driver
// does not say (a link speed, an IB port's transmit errors) stays unknown, never 0.
struct NetSample {
  std::string node;
  std::string interface;
  std::int64_t timeUnixUs = 0;
  std::uint64_t rxBytes = 0;
  std::uint64_t txBytes = 0;
  std::uint64_t rxPackets = 0;
  std::uint64_t txPackets = 0;
  std::optional<std::uint64_t> rxErrors;
  std::optional<std::uint64_t> txErrors;
  std::optional<std::uint64_t> rxDrops;
  std::optional<std::uint64_t> txDrops;
  std::optional<std::uint64_t> linkBitsPerSecond;
  bool operator==(const NetSample& other) const;  // field by field, NaN equal to NaN (records.h)
};

// The kinds of collective a rank's step reports (lockstep.proto's CollectiveKind).
enum class CollectiveKind {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kAllToAll = 5,
  kBarrier = 6,
  kReduce = 7,
  kGather = 8,
  kScatter = 9,
  kSendRecv = 10,
  kPush = 11,  // to a parameter server
  kPull = 12,  // from it
};

// A rank's collectives of one kind in one step (lockstep.proto).
struct CollectiveTimes {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::uint32_t count = 0;
  std::int64_t timeUs = 0;     // issue to completion, summed
  std::int64_t exposedUs = 0;  // waited on
  std::uint64_t bytes = 0;     // nccl-tests' size (lockstep.proto)
  bool operator==(const CollectiveTimes&) const = default;
};

// One collective (lockstep.proto), on the rank's clock.
struct CollectiveSpan {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::int64_t startUnixUs = 0;
  std::int64_t durationUs = 0;
  std::int64_t exposedUs = 0;
  std::uint64_t bytes = 0;
  bool operator==(const CollectiveSpan&) const = default;
};

struct StepReport {
  std::string jobId;
  std::uint32_t rank = 0;
  std::uint32_t worldSize = 1;
  std::uint32_t attempt = 0;
  std::uint64_t step = 0;
  std::uint32_t epoch = 0;
  std::uint32_t samples = 0;
  float loss = 0.0f;  // NaN: no samples, or not reported
  std::optional<float> globalLoss;
  // The step's split; empty when the sender did not measure it (unknown, not 0).
  std::optional<std::int64_t> dataTimeUs;
  std::optional<std::int64_t> computeTimeUs;
  std::optional<std::int64_t> exposedCommTimeUs;
  std::optional<std::int64_t> allreduceTimeUs;
  std::optional<std::uint64_t> bytesReduced;
  std::int64_t stepTimeUs = 0;
  std::int64_t timeUnixUs = 0;
  double lr = 0.0;
  std::optional<std::uint64_t> tokens;
  std::optional<std::int64_t> optimizerTimeUs;  // the optimizer's part of computeTimeUs
  std::vector<CollectiveTimes> collectives;        // by kind, at most one entry each
  std::vector<CollectiveSpan> collectiveSpans;     // the first ones, one by one
  // What the rank holds of the model's state, in bytes (lockstep.proto); unset: not reported.
  std::optional<std::uint64_t> paramBytes;
  std::optional<std::uint64_t> gradBytes;
  std::optional<std::uint64_t> optimizerStateBytes;
  std::optional<std::uint32_t> staleness;  // asynchronous parameter server: its gradient's
  // The model's FLOPs of this rank's step and how they were known; the precision of its math; the
  // hardware's peak for it there, FLOP/s, which the agent sets (lockstep.proto; docs/kpis.md, MFU).
  std::optional<double> flops;
  std::optional<FlopsBasis> flopsBasis;
  std::optional<Precision> precision;
  std::optional<double> peakFlops;
  bool operator==(const StepReport& other) const;  // field by field, NaN equal to NaN (records.h)
};

// A phase a rank's program named, closed (lockstep.proto): checkpoint, eval, ...
struct PhaseReport {
  std::string jobId;
  std::uint32_t rank = 0;
  std::uint32_t worldSize = 1;
  std::uint32_t attempt = 0;
  std::string name;
  std::int64_t timeUnixUs = 0;  // at its end
  std::int64_t durationUs = 0;
  std::uint64_t step = 0;  // the last step completed before its end; 0: none
  bool operator==(const PhaseReport& other) const;  // field by field (records.h)
  std::int64_t startUs() const { return timeUnixUs - durationUs; }
};

using StreamPayload = std::variant<JobEvent, GpuSample, ProcessSample, StepReport, NetSample, PhaseReport>;

struct StreamMessage {
  std::uint64_t seq = 0;
  std::string node;
  StreamPayload payload;
  bool operator==(const StreamMessage&) const = default;
};

// The job a streamed record is about; empty for a node's own (an idle GPU's sample, its network
// interfaces). protocol/stream.h tells the kinds of records apart.
const std::string& jobOf(const StreamPayload& payload);
// When it was measured (Unix microseconds).
std::int64_t timeOf(const StreamPayload& payload);


// ---- requests and replies ----

struct HelloRequest {
  std::uint32_t protocolVersion = kProtocolVersion;
  std::string clientName;
  bool operator==(const HelloRequest&) const = default;
};
struct StartJobRequest {
  JobSpec spec;
  std::string storeSecret;  // rank 0's agent's, for the others; "" for rank 0's agent
  bool operator==(const StartJobRequest&) const = default;
};
struct StopJobRequest {
  std::string jobId;
  std::uint32_t graceMs = 0;
  bool operator==(const StopJobRequest&) const = default;
};
// At most kMaxJobsLeftOut (validate.h) jobs left out.
struct FetchRequest {
  std::uint64_t afterSeq = 0;
  std::uint32_t maxMessages = 0;
  std::uint32_t waitMs = 0;
  // Jobs whose records the client reads fanned in (docs/fan-in.md): the agent leaves them out.
  std::vector<std::string> jobsLeftOut;
  bool operator==(const FetchRequest&) const = default;
};
// A job at an attempt (lockstep.proto).
struct JobAttempt {
  std::string jobId;
  std::uint32_t attempt = 0;
  auto operator<=>(const JobAttempt&) const = default;
};
// At most kMaxKnownSpecs (validate.h) known specs.
struct ListJobsRequest {
  std::vector<JobAttempt> knownSpecs;  // their statuses come with the spec left out
  bool operator==(const ListJobsRequest&) const = default;
};
struct LogsRequest {
  std::string jobId;
  std::uint32_t rank = 0;
  std::uint32_t maxBytes = 0;
  bool operator==(const LogsRequest&) const = default;
};

// A job's KPIs fanned in at its supervising agent (lockstep.proto, docs/fan-in.md).
inline constexpr std::uint32_t kMaxFrameRanks = 1024;
inline constexpr std::size_t kMaxFrameEvents = 256;
struct FrameRequest {
  std::string jobId;
  std::uint32_t ranksFrom = 0;
  std::uint32_t ranksCount = 0;  // at most kMaxFrameRanks
  std::uint64_t eventsAfter = 0;
  bool nodeBlocks = false;  // and the job's nodes as heatmap blocks (kpi/frame.h)
  // The moment of the frame the caller holds, from the same request (0: none): that frame again
  // comes back without its KPIs (FrameReply::kpis empty), its events as ever, so that asking ten
  // times a second costs little between two frames. A job's last frame always comes whole.
  std::int64_t heldUnixUs = 0;
  bool operator==(const FrameRequest&) const = default;
};
struct StacksRequest {
  std::string jobId;
  std::optional<std::uint32_t> rank;  // unset: every rank the agent runs
  bool operator==(const StacksRequest&) const = default;
};

struct Request {
  std::uint64_t requestId = 0;
  std::variant<HelloRequest, StartJobRequest, StopJobRequest, FetchRequest, ListJobsRequest, LogsRequest, StacksRequest,
               FrameRequest>
      body;
  bool operator==(const Request&) const = default;
};

// The state of a job's part on one agent (agent/src/jobs), and of each of its ranks. Every edge:
//
//   from      to        when
//   starting  running   every rank of the part was spawned and the start answered
//                       (JobManager::announceStart); a rank: its process was spawned
//   starting  running   re-adopted: the agent stopped while starting, and on starting again found
//                       every rank's keeper alive (job_table.cpp)
//   starting  failed    re-adopted, but a rank's keeper was gone
//   running   finished  every rank exited 0 (JobManager::finishIfDone)
//   running   failed    a rank exited otherwise, or the stall rule or the supervisor failed it
//                       (JobManager::failJob: the other ranks get SIGTERM, then SIGKILL)
//   running   stopped   StopJob or the end of the Slurm allocation; the ranks are reaped
//
// finished, failed and stopped are final. A part that could not be spawned is not kept: its start
// is refused. An elastic restart is a new attempt (JobSpec.attempt), whose parts start again.
// A job across nodes takes combinedState of its parts.
enum class JobState { kStarting = 1, kRunning = 2, kFinished = 3, kFailed = 4, kStopped = 5 };
std::string_view jobStateName(JobState state);
// The state of a job from its parts (one per node): failed if any failed, running while any runs,
// starting while any starts (or none is known), stopped if any was stopped, else finished. The
// history and the supervisor use this one rule; clients show jobOutcome, the supervisor's verdict
// first.
JobState combinedState(const std::vector<JobState>& parts);
// Who a job belongs to, from its parts' owners (the Unix user each node runs it as): the one user,
// or the distinct ones joined with ", " when nodes map the key to different users; "" when none
// says (an agent from before owners).
std::string combinedOwner(const std::vector<std::string>& parts);
// Finished, failed or stopped: nothing of it runs or starts any more.
constexpr bool jobStateEnded(JobState state) { return state != JobState::kRunning && state != JobState::kStarting; }

struct StartJobReply {
  std::string jobId;
  std::uint32_t rendezvousPort = 0;
  std::string storeSecret;  // the store's secret, when this agent hosts the job's store
  bool operator==(const StartJobReply&) const = default;
};
struct StopJobReply {
  std::string jobId;
  JobState state = JobState::kStopped;
  bool operator==(const StopJobReply&) const = default;
};

struct ErrorReply {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  bool operator==(const ErrorReply&) const = default;
};

struct FetchReply {
  std::uint64_t instanceId = 0;
  std::uint64_t firstSeq = 0;
  std::uint64_t lastSeq = 0;
  std::vector<StreamMessage> messages;
  std::uint64_t jobsVersion = 0;  // changes when the agent takes on a job (lockstep.proto)
  bool operator==(const FetchReply&) const = default;
};

struct RankStatus {
  std::uint32_t rank = 0;
  std::uint32_t localRank = 0;
  std::optional<std::uint32_t> gpuIndex;
  std::uint32_t pid = 0;
  JobState state = JobState::kRunning;
  std::optional<std::int32_t> exitCode;
  std::optional<std::int32_t> signal;
  bool exitUnknown = false;
  bool operator==(const RankStatus&) const = default;
};

// What the supervising agent did with a job (client/supervisor.h decides, agent/src/jobs/
// supervision.cpp carries it out). Every edge:
//
//   from        to          when
//   none        following   rank 0's agent (JobSpec.agents[0]) started its part of the job
//   none        standby     the second agent started its part: it mirrors the first's supervision
//   following   restarting  an attempt lost ranks or a node, or stalled with --on-stall restart,
//                           and restarts remain (--max-restarts)
//   restarting  following   the new attempt was placed and started
//   restarting  ended       it could not be placed (too few ranks, agents unreachable)
//   following   ended       the job finished, failed or was stopped (Supervision.outcome says which)
//   standby     following   the first agent stopped answering or no longer supervises: the standby
//                           takes over where the job stands
//   standby     ended       the first agent's supervision ended
//
// ended is final; none is every other agent's (and a job launched without agents).
enum class SupervisionState { kNone = 0, kFollowing = 1, kRestarting = 2, kEnded = 3, kStandby = 4 };

struct Supervision {
  SupervisionState state = SupervisionState::kNone;
  JobState outcome = JobState::kRunning;  // once ended
  std::string message;                    // what happened, in words
  std::vector<std::string> attempts;      // one line per attempt that ended, and why the last was not restarted
  bool operator==(const Supervision&) const = default;
};

// A job's state as clients show it: its supervisor's verdict once its supervision ended (it saw every
// part, and a stop asked of it ends the job stopped however a part then ended: a rank of the user's
// own program may fail as its peers go), else its parts' combined (combinedState).
JobState jobOutcome(const Supervision& supervision, const std::vector<JobState>& parts);
// Whether a job is over, so that a client following it may stop: its supervisor's verdict is in,
// or, where no agent supervises it, every part ended. Parts that all ended under a supervision that
// goes on are a job about to restart, or about to be judged.
bool jobOver(const Supervision& supervision, const std::vector<JobState>& parts);
// Whether the agent whose part carries `supervision` still decides how the job ends (it supervises
// it or stands by to): a stop goes to it too, though its own part ended.
bool decidesOutcome(const Supervision& supervision);
// Whether the job's supervisor is restarting it: its parts ended, failed as a rule, and it runs again.
inline bool restarting(const Supervision& supervision) { return supervision.state == SupervisionState::kRestarting; }
// A job's state in a word, as clients show it: its state's name (jobOutcome), but "restarting" while
// restarting (not a JobState: nothing keeps it, and the history has the attempt's end).
std::string_view jobStateWord(const Supervision& supervision, JobState state);

// Where a rank is, from its progress record, as its agent saw it (durations by the agent's clock).
struct RankProgress {
  std::uint32_t rank = 0;
  bool recorded = false;      // the rank writes a progress record
  bool reportsSteps = false;  // it reports steps: a stall can be judged
  std::uint64_t step = 0;
  std::string phase;
  bool announced = false;
  std::int64_t phaseMs = 0;
  std::uint64_t collectives = 0;
  bool inCollective = false;
  std::uint32_t bucket = 0, buckets = 0;
  std::int64_t stillMs = 0;      // since its progress last moved
  std::int64_t allowanceMs = 0;  // how long it may stay still
  std::string processState;
  std::uint32_t collectiveKind = 0;  // of the newest collective entered: CollectiveKind's value (0: not said)
  bool operator==(const RankProgress&) const = default;
};

struct Stall {
  std::int64_t sinceUnixUs = 0;
  std::string message;
  std::vector<std::uint32_t> ranks;  // those that did not reach where the others wait
  bool operator==(const Stall&) const = default;
};

struct RankEvidence {
  std::uint32_t rank = 0;
  std::uint32_t pid = 0;
  std::string node;
  std::int64_t timeUnixUs = 0;
  RankProgress progress;
  std::string processState;
  std::optional<bool> cpuMoving;
  std::string threads;
  std::string pythonStacks;
  std::string nativeBacktrace;
  std::string logTail;
  std::string note;
  bool operator==(const RankEvidence&) const = default;
};

struct StacksReply {
  std::string jobId;
  std::vector<RankEvidence> ranks;
  bool operator==(const StacksReply&) const = default;
};

struct JobStatus {
  JobSpec spec;
  JobState state = JobState::kStarting;
  std::vector<RankStatus> ranks;
  std::int64_t startedUnixUs = 0;
  std::int64_t endedUnixUs = 0;
  std::string message;
  std::uint32_t rendezvousPort = 0;
  Supervision supervision;  // filled by the supervising agent only
  std::vector<RankProgress> progress;  // this agent's ranks
  std::optional<Stall> stall;          // while this agent sees the job stalled
  std::string owner;                   // the Unix user its ranks run as on this agent's node
  std::vector<std::uint32_t> cpus;     // the cores its ranks hold here (docs/fences.md)
  std::uint64_t memoryLimitBytes = 0;  // its ranks' memory limits here together; 0: unbounded
  // The spec holds only its jobId and attempt: the client said it has the rest (ListJobsRequest).
  bool specOmitted = false;
  // Its agent was asked to stop it (StopJob, Slurm's end) before it ended. A part stopped without it
  // stopped at its trainer ranks' stop vote: a rank given SIGTERM or SIGINT elsewhere started it.
  bool stopAsked = false;
  bool operator==(const JobStatus&) const = default;
};

struct JobsReply {
  std::vector<JobStatus> jobs;
  bool operator==(const JobsReply&) const = default;
};

struct LogsReply {
  std::string jobId;
  std::uint32_t rank = 0;
  std::string text;
  bool truncated = false;
  bool operator==(const LogsReply&) const = default;
};

struct FrameReply {
  std::string jobId;
  std::int64_t timeUnixUs = 0;
  bool ended = false;
  JobState state = JobState::kRunning;  // the job's, as its supervision says: its outcome once ended
  std::string kpis;                   // a KpiFrame: kpi/frame.h reads it; empty: the one held (FrameRequest::heldUnixUs)
  std::vector<StreamMessage> events;  // at most kMaxFrameEvents, each a JobEvent of the job
  std::uint64_t lastEvent = 0;
  std::optional<Stall> stall;
  bool operator==(const FrameReply&) const = default;
};

struct Reply {
  std::uint64_t requestId = 0;
  std::variant<ErrorReply, NodeHello, StartJobReply, StopJobReply, FetchReply, JobsReply, LogsReply, StacksReply,
               FrameReply>
      body;
  bool operator==(const Reply&) const = default;
};

}  // namespace lockstep
