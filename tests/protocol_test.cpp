// Issue 2: the v1 schema's codec round-trips every message and refuses bad ones with clear errors.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>

#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/names.h"
#include "lockstep/protocol/validate.h"
#include "lockstep/v1/lockstep.pb.h"

namespace lockstep {
namespace {

JobSpec validSpec() {
  JobSpec s;
  s.jobId = "job-1";
  s.name = "mnist-like";
  s.layers = {784, 1024, 1024, 10};
  s.dataset = SyntheticDataset{65536, 784, 10, 1};
  s.steps = 200;
  s.optimizer.momentum = 0.9;
  s.targetLoss = 0.5;
  s.worldSize = 2;
  s.ranks = {{0, "node-a", 0, std::nullopt}, {1, "node-b", 0, std::nullopt}};
  s.rendezvousHost = "10.0.0.1";
  s.rendezvousPort = 29500;
  s.prices = {2.5, 0.05, 0.3, "EUR"};
  s.agents = {{"node-a", "10.0.0.1:7700", std::string(40, 'a')}, {"node-b", "10.0.0.2:7700", std::string(40, 'b')}};
  return s;
}

// Issue 13: a job whose ranks run the user's own program.
JobSpec validCommandSpec() {
  JobSpec s;
  s.jobId = "own-1";
  s.worldSize = 2;
  s.ranks = {{0, "node-a", 0, std::nullopt}, {1, "node-a", 1, std::nullopt}};
  s.command = CommandSpec{{"python3", "train.py", "--epochs", "3", ""}, "/home/me/project",
                          {{"PYTHONUNBUFFERED", "1"}, {"DATA", "a=b c"}}};
  s.maxRestarts = 2;  // the program resumes itself: no checkpoint directory of the trainer's
  s.prices = {0, 0.04, 0, "USD"};
  return s;
}

StepReport validReport() {
  StepReport r;
  r.jobId = "job-1";
  r.rank = 1;
  r.worldSize = 2;
  r.step = 7;
  r.samples = 64;
  r.loss = 2.25f;
  r.globalLoss = 2.5f;
  r.dataTimeUs = 10;
  r.computeTimeUs = 9000;
  r.exposedCommTimeUs = 400;
  r.allreduceTimeUs = 3000;
  r.bytesReduced = 7'454'760;
  r.stepTimeUs = 9410;
  r.timeUnixUs = 1'764'460'800'000'000;
  r.lr = 0.01;
  return r;
}

template <class T>
T roundTripStream(const T& payload) {
  StreamMessage in{42, "node-a", payload};
  auto out = decodeStreamMessage(encode(in));
  EXPECT_TRUE(out.ok()) << (out.ok() ? "" : out.error().message);
  EXPECT_EQ(out->seq, 42u);
  EXPECT_EQ(out->node, "node-a");
  return std::get<T>(out->payload);
}

TEST(ProtocolRoundTrip, StartJobRequestKeepsEveryField) {
  Request in{7, StartJobRequest{validSpec(), ""}};
  auto npySpec = validSpec();
  npySpec.dataset = NpyDataset{"/data/x.npy", "/data/y.npy"};
  npySpec.layers = {32, 10};
  npySpec.backend = Backend::kCuda;
  npySpec.precision = Precision::kBf16;
  npySpec.ranks = {{0, "gpu-1", 0, 3u}, {1, "gpu-1", 1, 5u}};
  npySpec.agents = {{"gpu-1", "gpu-1:7700", std::string(40, 'k')}};
  npySpec.targetLoss.reset();
  for (const Request& request : {in, Request{8, StartJobRequest{npySpec, ""}}}) {
    auto out = decodeRequest(encode(request));
    ASSERT_TRUE(out.ok()) << out.error().message;
    EXPECT_EQ(*out, request);
  }
}

TEST(ProtocolRoundTrip, ACommandJobKeepsItsProgramAndNeedsNoModel) {
  const Request in{9, StartJobRequest{validCommandSpec(), ""}};
  auto out = decodeRequest(encode(in));
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, in);
  auto json = jobSpecFromJson(jobSpecToJson(validCommandSpec()));
  ASSERT_TRUE(json.ok()) << json.error().message;
  EXPECT_EQ(*json, validCommandSpec());
  EXPECT_EQ(validCommandSpec().globalBatch(), 0u);  // only the program knows its batch
}

TEST(ProtocolRoundTrip, AStepReportWithoutTimingsKeepsThemUnknown) {
  StepReport r = validReport();
  r.dataTimeUs.reset();
  r.computeTimeUs.reset();
  r.exposedCommTimeUs.reset();
  r.allreduceTimeUs.reset();
  r.bytesReduced.reset();
  r.tokens = 4096;
  const StepReport out = roundTripStream(r);
  EXPECT_EQ(out, r);
  EXPECT_FALSE(out.computeTimeUs.has_value());
  // A measured 0 stays a 0.
  r.exposedCommTimeUs = 0;
  EXPECT_EQ(*roundTripStream(r).exposedCommTimeUs, 0);
}

TEST(ProtocolRoundTrip, OtherRequestsAndReplies) {
  for (const Request& r : {Request{1, HelloRequest{1, "lockstepctl"}}, Request{2, StopJobRequest{"job-1", 5000}},
                           Request{3, FetchRequest{123456789, 500, 200, {"big-job", "other-job"}}}, Request{4, ListJobsRequest{}},
                           Request{5, LogsRequest{"job-1", 3, 65536}}}) {
    auto out = decodeRequest(encode(r));
    ASSERT_TRUE(out.ok()) << out.error().message;
    EXPECT_EQ(*out, r);
  }
  NodeHello hello{1, "0.1.0", "gpu-node-1", 96, 1ull << 40, {{0, "NVIDIA H200", "GPU-abc", 141ull << 30}}, "", 99,
                  "node-a", 0xfeedu, 5};
  hello.cpuCorePeakFlops = 106.4e9;
  hello.cpuPeakBasis = "one core's sgemm measured on node-a on 2026-12-06 (Haswell kernels, 96 cores at once)";
  JobStatus job{validSpec(), JobState::kFailed, {{0, 0, std::nullopt, 4242, JobState::kFailed, std::nullopt, 9, false},
                                                 {1, 1, 3u, 4243, JobState::kStopped, std::nullopt, std::nullopt, true}},
                100, 200, "rank 0 was killed by signal 9", 29500, {}};
  job.owner = "alice";
  JobStatus supervised = job;
  supervised.supervision = {SupervisionState::kEnded, JobState::kFailed, "no restarts left",
                            {"attempt 0 with 2 ranks: rank 0 on node-a was killed", "not restarted: no restarts left"}};
  FetchReply fetch{7, 3, 5, {StreamMessage{4, "node-a", validReport()}, StreamMessage{5, "node-a", JobEvent{"job-1", JobEventKind::kStarted, 1, {}, {}, {}, "", "", {}}}}};
  for (const Reply& r : {Reply{1, hello}, Reply{2, StartJobReply{"job-1", 29500, ""}}, Reply{3, StopJobReply{"job-1", JobState::kStopped}},
                         Reply{4, ErrorReply{ErrorCode::kNotFound, "no job 'x'"}}, Reply{5, fetch}, Reply{6, JobsReply{{job}}}, Reply{61, JobsReply{}},
                         Reply{62, JobsReply{{job, supervised}}},
                         Reply{7, LogsReply{"job-1", 1, "line\n", true}}}) {
    auto out = decodeReply(encode(r));
    ASSERT_TRUE(out.ok()) << out.error().message;
    EXPECT_EQ(*out, r);
  }
}

// Issue 46 §1: a job's frame from its supervising agent (docs/fan-in.md), and what is refused.
TEST(ProtocolRoundTrip, AFrameKeepsItsEventsAndStallAndRefusesWhatIsNotItsJobs) {
  const Request ask{8, FrameRequest{"job-1", 64, 1024, 17, true, 1700000000000123}};
  auto asked = decodeRequest(encode(ask));
  ASSERT_TRUE(asked.ok()) << asked.error().message;
  EXPECT_EQ(*asked, ask);
  v1::Request tooMany;
  tooMany.mutable_frame()->set_job_id("job-1");
  tooMany.mutable_frame()->set_ranks_count(kMaxFrameRanks + 1);
  asked = decodeRequest(tooMany.SerializeAsString());
  ASSERT_FALSE(asked.ok());
  EXPECT_NE(asked.error().message.find("ranks_count is over 1024; ask for the ranks in view"), std::string::npos)
      << asked.error().message;

  const JobEvent started{"job-1", JobEventKind::kStarted, 1, {}, {}, {}, "", "", {}};
  FrameReply frame{"job-1", 1700000000000000, true, JobState::kFailed, std::string("\x0a\x05job-1", 7),
                   {StreamMessage{1, "node-a", started}, StreamMessage{2, "node-b", started}}, 2,
                   Stall{1700000000000000, "rank 1 did not reach the all-reduce", {1}}};
  auto back = decodeReply(encode(Reply{9, frame}));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, (Reply{9, frame}));

  FrameReply another = frame;
  another.events[1].payload = JobEvent{"job-2", JobEventKind::kStarted, 1, {}, {}, {}, "", "", {}};
  back = decodeReply(encode(Reply{9, another}));
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.error().message.find("an event that is not one of job job-1's"), std::string::npos) << back.error().message;
  FrameReply sample = frame;
  sample.events[0].payload = validReport();
  EXPECT_FALSE(decodeReply(encode(Reply{9, sample})).ok()) << "a frame carries events, not records";
  FrameReply backwards = frame;
  std::swap(backwards.events[0], backwards.events[1]);
  back = decodeReply(encode(Reply{9, backwards}));
  ASSERT_FALSE(back.ok()) << "a client that follows the numbers would ask for what it has";
  EXPECT_NE(back.error().message.find("not numbered upwards to its last (2)"), std::string::npos) << back.error().message;
  FrameReply pastItsLast = frame;
  pastItsLast.lastEvent = 1;
  EXPECT_FALSE(decodeReply(encode(Reply{9, pastItsLast})).ok());
  FrameReply flood = frame;
  flood.events.assign(kMaxFrameEvents + 1, frame.events[0]);
  back = decodeReply(encode(Reply{9, flood}));
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.error().message.find("more than 256 events"), std::string::npos) << back.error().message;
}

// A client polling its agents' jobs says which specs it holds; their statuses come back with the
// spec left out, and decode to the job and attempt alone without being taken for a bad spec.
TEST(ProtocolRoundTrip, AJobListLeavesOutTheSpecsTheClientHolds) {
  const Request ask{8, ListJobsRequest{{{"job-1", 0}, {"job-2", 3}}}};
  auto request = decodeRequest(encode(ask));
  ASSERT_TRUE(request.ok()) << request.error().message;
  EXPECT_EQ(*request, ask);

  JobStatus omitted{};
  omitted.spec.jobId = "job-2";
  omitted.spec.attempt = 3;
  omitted.specOmitted = true;
  omitted.state = JobState::kRunning;
  JobStatus full{};
  full.spec = validSpec();
  full.state = JobState::kRunning;
  const Reply reply{9, JobsReply{{full, omitted}}};
  auto out = decodeReply(encode(reply));
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(*out, reply);
  // Without the flag the same stub is a spec, and a bad one.
  omitted.specOmitted = false;
  EXPECT_FALSE(decodeReply(encode(Reply{10, JobsReply{{omitted}}})).ok());

  // Bounded, and each a job id.
  ListJobsRequest many;
  for (std::size_t i = 0; i <= kMaxKnownSpecs; ++i) many.knownSpecs.push_back({"job-" + std::to_string(i), 0});
  auto tooMany = decodeRequest(encode(Request{11, many}));
  ASSERT_FALSE(tooMany.ok());
  EXPECT_NE(tooMany.error().message.find("more than 4096 known specs"), std::string::npos) << tooMany.error().message;
  EXPECT_FALSE(decodeRequest(encode(Request{12, ListJobsRequest{{{"no spaces allowed", 0}}}})).ok());
}

// Issue 46 §1: a client that watches jobs fanned in names them in its fetches; bounded, each a job id.
TEST(ProtocolRoundTrip, AFetchNamesTheJobsItLeavesOut) {
  const Request ask{13, FetchRequest{7, 100, 50, {"wide-1", "wide-2"}}};
  auto request = decodeRequest(encode(ask));
  ASSERT_TRUE(request.ok()) << request.error().message;
  EXPECT_EQ(*request, ask);
  FetchRequest many{0, 0, 0, {}};
  for (std::size_t i = 0; i <= kMaxJobsLeftOut; ++i) many.jobsLeftOut.push_back("job-" + std::to_string(i));
  auto tooMany = decodeRequest(encode(Request{14, many}));
  ASSERT_FALSE(tooMany.ok());
  EXPECT_NE(tooMany.error().message.find("fetch: more than 64 jobs left out"), std::string::npos) << tooMany.error().message;
  auto badId = decodeRequest(encode(Request{15, FetchRequest{0, 0, 0, {"no spaces allowed"}}}));
  ASSERT_FALSE(badId.ok());
}

// Issue 46: the largest jobs run today take 16,384 GPUs, 8 to a node. Such a job is a valid spec,
// and its StartJob, placing every rank on nodes with long names, fits in one message; twice that is
// the bound, said so.
TEST(ProtocolRoundTrip, AJobOf16384RanksOn2048NodesIsValidAndFitsOneMessage) {
  JobSpec big = validSpec();
  big.agents.clear();
  big.ranks.clear();
  big.worldSize = 16384;
  for (std::uint32_t r = 0; r < big.worldSize; ++r) {
    char node[80];
    std::snprintf(node, sizeof node, "gpu-rack%03u-node%04u.training-cluster.example.com", r / 256, r / 8);
    big.ranks.push_back({r, node, r % 8, r % 8});
  }
  ASSERT_TRUE(validateJobSpec(big).ok()) << validateJobSpec(big).error().message;
  const std::string bytes = encode(Request{1, StartJobRequest{big, std::string(64, 'a')}});
  EXPECT_LT(bytes.size(), kMaxMessageBytes / 2);
  auto back = decodeRequest(bytes);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(std::get<StartJobRequest>(back->body).spec, big);

  // The largest spec a job may have, on the longest node names, kept as JSON (the history's and the
  // agent's own records) reads back; as a request it is too large for one message.
  JobSpec largest = big;
  largest.worldSize = 32768;
  largest.ranks.clear();
  for (std::uint32_t r = 0; r < largest.worldSize; ++r) {
    largest.ranks.push_back({r, std::string(240, 'n') + std::to_string(r / 8), r % 8, r % 8});
  }
  ASSERT_TRUE(validateJobSpec(largest).ok()) << validateJobSpec(largest).error().message;
  auto json = jobSpecFromJson(jobSpecToJson(largest));
  ASSERT_TRUE(json.ok()) << json.error().message;
  EXPECT_EQ(*json, largest);
  EXPECT_GT(encode(Request{2, StartJobRequest{largest, std::string(64, 'a')}}).size(), kMaxMessageBytes);

  big.worldSize = 32769;
  const auto refused = validateJobSpec(big);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("32768"), std::string::npos) << refused.error().message;
}

TEST(ProtocolRoundTrip, StreamedPayloads) {
  const StepReport report = validReport();
  EXPECT_EQ(roundTripStream(report), report);

  StepReport empty = validReport();  // a rank without samples in the epoch's last step
  empty.samples = 0;
  empty.loss = NAN;
  EXPECT_TRUE(std::isnan(roundTripStream(empty).loss));

  GpuSample gpu{"node-a", 3, 1000, "job-1", 97.0f, 80ull << 30, 650000u, 123456789ull, 61, 1980u};
  EXPECT_EQ(roundTripStream(gpu), gpu);
  GpuSample noPower = gpu;  // a GPU without power readings keeps "unknown", not 0
  noPower.powerMilliwatts.reset();
  noPower.energyMillijoules.reset();
  const auto back = roundTripStream(noPower);
  EXPECT_FALSE(back.powerMilliwatts.has_value());
  EXPECT_FALSE(back.energyMillijoules.has_value());

  ProcessSample proc{"job-1", 1, 4242, 1000, 99.5f, 512ull << 20};
  EXPECT_EQ(roundTripStream(proc), proc);
  // A node's interface: what the driver does not say (speed, an IB port's transmit errors) stays unknown.
  NetSample net{"node-a", "ib:mlx5_0/1", 1000, 4'000'000'000'000ull, 7, 3, 2, 1u, std::nullopt, std::nullopt, 0u,
                200'000'000'000ull};
  EXPECT_EQ(roundTripStream(net), net);
  net.linkBitsPerSecond.reset();
  EXPECT_FALSE(roundTripStream(net).linkBitsPerSecond.has_value());
  EXPECT_EQ(jobOf(StreamPayload(net)), "");
  EXPECT_EQ(jobOf(StreamPayload(proc)), "job-1");
  EXPECT_EQ(timeOf(StreamPayload(net)), 1000);
  JobEvent event{"job-1", JobEventKind::kFailed, 1000, 1u, 3, std::nullopt, "rank 1 failed", "tail...", 17u};
  EXPECT_EQ(roundTripStream(event), event);
}

TEST(ProtocolJson, JobSpecRoundTripsThroughJson) {
  const JobSpec spec = validSpec();
  const std::string json = jobSpecToJson(spec);
  EXPECT_NE(json.find("\"batchPerRank\": 64"), std::string::npos) << json;
  EXPECT_NE(json.find("\"OPTIMIZER_KIND_SGD\""), std::string::npos) << json;
  auto back = jobSpecFromJson(json);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, spec);
}

TEST(ProtocolJson, BadJobFilesSayWhatIsWrong) {
  auto notJson = jobSpecFromJson("{ layers: [1, 2");
  ASSERT_FALSE(notJson.ok());
  EXPECT_NE(notJson.error().message.find("not a lockstep.v1.JobSpec in JSON"), std::string::npos);
  auto unknownField = jobSpecFromJson(R"({"jobId": "a", "bogusField": 3})");
  ASSERT_FALSE(unknownField.ok());
  auto invalid = jobSpecFromJson(R"({"jobId": "a", "backend": "BACKEND_CPU", "activation": "ACTIVATION_RELU",
      "precision": "PRECISION_FP32", "layers": [4, 2], "dataset": {"synthetic": {"samples": "10", "dim": 4, "classes": 2}},
      "batchPerRank": 8, "accumSteps": 1, "optimizer": {"kind": "OPTIMIZER_KIND_SGD", "lr": 0.1}, "bucketMb": 25,
      "timeoutS": 60, "worldSize": 1})");
  ASSERT_FALSE(invalid.ok());
  EXPECT_NE(invalid.error().message.find("exactly one of steps and epochs"), std::string::npos) << invalid.error().message;
}

// ---- rejection ----

struct Rejection {
  const char* name;
  std::function<void(JobSpec&)> breakIt;
  const char* expectedText;
};

void PrintTo(const Rejection& r, std::ostream* os) { *os << r.name; }

// `base`, broken as the case says, is refused by the decoder with the case's text.
void expectRefused(JobSpec base, const Rejection& r) {
  r.breakIt(base);
  auto out = decodeRequest(encode(Request{1, StartJobRequest{base, ""}}));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(out.error().message.find(r.expectedText), std::string::npos) << out.error().message;
}

class JobSpecRejection : public ::testing::TestWithParam<Rejection> {};

TEST_P(JobSpecRejection, DecodeRefusesWithAClearMessage) { expectRefused(validSpec(), GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Protocol, JobSpecRejection,
    ::testing::Values(
        Rejection{"EmptyJobId", [](JobSpec& s) { s.jobId = ""; }, "job id"},
        Rejection{"JobIdWithSlash", [](JobSpec& s) { s.jobId = "../etc"; }, "job id"},
        Rejection{"OneLayer", [](JobSpec& s) { s.layers = {784}; }, "layers has 1 sizes"},
        Rejection{"ZeroWidth", [](JobSpec& s) { s.layers = {784, 0, 10}; }, "layer size 1 is 0"},
        Rejection{"DimMismatch", [](JobSpec& s) { s.layers = {512, 1024, 10}; }, "first layer size is 512"},
        Rejection{"ClassMismatch", [](JobSpec& s) { s.layers = {784, 1024, 7}; }, "last layer size is 7"},
        Rejection{"ZeroBatch", [](JobSpec& s) { s.batchPerRank = 0; }, "batch per rank is 0"},
        Rejection{"NegativeLr", [](JobSpec& s) { s.optimizer.lr = -1; }, "lr is -1"},
        Rejection{"NanLr", [](JobSpec& s) { s.optimizer.lr = NAN; }, "lr is"},
        Rejection{"MomentumOne", [](JobSpec& s) { s.optimizer.momentum = 1.0; }, "momentum is 1"},
        // Found by the fuzzer: an SGD job carrying a NaN AdamW setting decoded, then failed to round-trip.
        Rejection{"NanBeta2UnderSgd", [](JobSpec& s) { s.optimizer.beta2 = NAN; }, "beta2 is nan; it must be a finite number"},
        Rejection{"StepsAndEpochs", [](JobSpec& s) { s.epochs = 3; }, "exactly one of steps and epochs"},
        Rejection{"NeitherStepsNorEpochs", [](JobSpec& s) { s.steps = 0; }, "exactly one of steps and epochs"},
        Rejection{"CheckpointWithoutDir", [](JobSpec& s) { s.checkpointEvery = 10; }, "checkpoint directory"},
        Rejection{"PlacementsDontMatchWorld", [](JobSpec& s) { s.worldSize = 3; }, "places 2 ranks"},
        Rejection{"RankPlacedTwice", [](JobSpec& s) { s.ranks[1].rank = 0; }, "placed twice"},
        Rejection{"CudaRankWithoutGpu", [](JobSpec& s) { s.backend = Backend::kCuda; s.precision = Precision::kBf16; }, "has no GPU"},
        Rejection{"CpuBf16", [](JobSpec& s) { s.precision = Precision::kBf16; }, "fp32 only"},
        // Issue 46: fp16 and fp8 are what an own program's reports may say, not what the trainer computes in.
        Rejection{"TrainerFp16",
                  [](JobSpec& s) {
                    s.backend = Backend::kCuda;
                    s.precision = Precision::kFp16;
                    for (auto& r : s.ranks) r.gpuIndex = r.rank;
                  },
                  "the trainer computes in fp32, tf32 or bf16, not fp16; use --precision bf16"},
        Rejection{"NegativePrice", [](JobSpec& s) { s.prices.gpuHour = -1; }, "price per GPU-hour"},
        Rejection{"ZeroTimeout", [](JobSpec& s) { s.timeoutS = 0; }, "timeout"},
        Rejection{"HugeBucket", [](JobSpec& s) { s.bucketMb = 1e9; }, "bucket size"},
        // Issue 15: the job's agents, the first of which supervises it.
        Rejection{"AgentKeyTooShort", [](JobSpec& s) { s.agents[1].publicKey = "abc"; }, "node-b's public key is not 40"},
        Rejection{"AgentTwice", [](JobSpec& s) { s.agents[1].node = "node-a"; }, "node-a's agent twice"},
        Rejection{"RankOnNodeWithoutAgent", [](JobSpec& s) { s.agents.pop_back(); }, "rank 1's node node-b is not among"},
        Rejection{"AgentWithoutAddress", [](JobSpec& s) { s.agents[0].address = ""; }, "job agent address"}),
    [](const auto& param) { return std::string(param.param.name); });

class CommandSpecRejection : public ::testing::TestWithParam<Rejection> {};

TEST_P(CommandSpecRejection, DecodeRefusesWithAClearMessage) { expectRefused(validCommandSpec(), GetParam()); }

INSTANTIATE_TEST_SUITE_P(
    Protocol, CommandSpecRejection,
    ::testing::Values(
        Rejection{"NoProgram", [](JobSpec& s) { s.command->argv.clear(); }, "the command is empty"},
        Rejection{"EmptyProgram", [](JobSpec& s) { s.command->argv[0] = ""; }, "the command is empty"},
        Rejection{"RelativeWorkingDir", [](JobSpec& s) { s.command->workingDir = "project"; }, "is relative"},
        Rejection{"MalformedEnvName", [](JobSpec& s) { s.command->env.push_back({"1BAD", "x"}); }, "'1BAD' is malformed"},
        Rejection{"EnvNameWithEquals", [](JobSpec& s) { s.command->env.push_back({"A=B", "x"}); }, "is malformed"},
        Rejection{"EnvSetsRank", [](JobSpec& s) { s.command->env.push_back({"RANK", "3"}); }, "RANK is set by the agent"},
        Rejection{"EnvSetsLockstep", [](JobSpec& s) { s.command->env.push_back({"LOCKSTEP_REPORT", "x"}); },
                  "LOCKSTEP_REPORT is set by the agent"},
        Rejection{"EnvTwice", [](JobSpec& s) { s.command->env.push_back({"DATA", "again"}); }, "DATA is given twice"},
        Rejection{"NulInArgument", [](JobSpec& s) { s.command->argv[1] = std::string("a\0b", 3); }, "NUL byte"},
        Rejection{"HugeArgument", [](JobSpec& s) { s.command->argv[1] = std::string(200 * 1024, 'x'); },
                  "command argument 1 is 204800 bytes long"},
        Rejection{"TooManyArguments", [](JobSpec& s) { s.command->argv.resize(5000, "x"); }, "5000 arguments"},
        Rejection{"TooLargeInAll", [](JobSpec& s) { s.command->argv.resize(20, std::string(100 * 1024, 'x')); },
                  "the limit is 1048576"},
        Rejection{"TrainerLayers", [](JobSpec& s) { s.layers = {4, 2}; }, "pass such settings to your program"},
        Rejection{"TrainerSteps", [](JobSpec& s) { s.steps = 10; }, "pass such settings to your program"}),
    [](const auto& param) { return std::string(param.param.name); });

TEST(ProtocolRejection, GarbageBytes) {
  auto out = decodeRequest(std::string("\xff\xff\xff\xff garbage", 13));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("not a valid lockstep.v1 message"), std::string::npos) << out.error().message;
}

TEST(ProtocolRejection, OversizedMessageIsRefusedBeforeParsing) {
  const std::string big(kMaxMessageBytes + 1, '\0');
  auto out = decodeStreamMessage(big);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(out.error().message.find("over the limit"), std::string::npos);
}

TEST(ProtocolRejection, MissingBodiesAndRequiredFields) {
  v1::Request noBody;
  noBody.set_request_id(5);
  auto r = decodeRequest(noBody.SerializeAsString());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("no body"), std::string::npos);

  v1::Request noSpec;
  noSpec.mutable_start_job();
  r = decodeRequest(noSpec.SerializeAsString());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("job spec is required"), std::string::npos);

  v1::Request noDataset;
  auto* spec = noDataset.mutable_start_job()->mutable_spec();
  spec->set_job_id("j");
  spec->set_backend(v1::BACKEND_CPU);
  spec->set_activation(v1::ACTIVATION_RELU);
  spec->set_precision(v1::PRECISION_FP32);
  r = decodeRequest(noDataset.SerializeAsString());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("dataset is required"), std::string::npos) << r.error().message;

  v1::StreamMessage noSeq;
  noSeq.mutable_step_report()->set_job_id("j");
  auto s = decodeStreamMessage(noSeq.SerializeAsString());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("sequence number is required"), std::string::npos);
}

TEST(ProtocolRejection, OutOfRangeStreamedValues) {
  StepReport badRank = validReport();
  badRank.rank = 2;  // world size 2
  auto out = decodeStreamMessage(encode(StreamMessage{1, "", badRank}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("outside world size"), std::string::npos) << out.error().message;

  StepReport negative = validReport();
  negative.stepTimeUs = -5;
  EXPECT_FALSE(decodeStreamMessage(encode(StreamMessage{1, "", negative})).ok());
  // Nanoseconds sent as microseconds: a timeline would span decades.
  StepReport nanos = validReport();
  nanos.computeTimeUs = 9'000'000'000'000;
  out = decodeStreamMessage(encode(StreamMessage{1, "", nanos}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("compute time is over a week"), std::string::npos) << out.error().message;

  StepReport negativeOptimizer = validReport();
  negativeOptimizer.optimizerTimeUs = -1;
  out = decodeStreamMessage(encode(StreamMessage{1, "", negativeOptimizer}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("optimizer time is negative"), std::string::npos) << out.error().message;

  StepReport nanoseconds = validReport();
  nanoseconds.timeUnixUs = 1'700'000'000'000'000'000;
  out = decodeStreamMessage(encode(StreamMessage{1, "", nanoseconds}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("step report time 1700000000000000000 is not microseconds since 1970"), std::string::npos)
      << out.error().message;

  // Issue 46: a step's FLOPs, their basis and precision, and the peak, in range and known.
  const std::pair<std::function<void(StepReport&)>, const char*> flopsCases[] = {
      {[](StepReport& r) { r.flops = -1; }, "step report flops is out of range"},
      {[](StepReport& r) { r.flops = NAN; }, "step report flops is out of range"},
      {[](StepReport& r) { r.flops = 1e30; }, "step report flops is out of range"},
      {[](StepReport& r) { r.peakFlops = 0; }, "step report peak is out of range"},
      {[](StepReport& r) { r.peakFlops = 1e18; }, "step report peak is out of range"},
      {[](StepReport& r) { r.precision = static_cast<Precision>(9); }, "step report precision 9 is unknown"},
      {[](StepReport& r) { r.flopsBasis = static_cast<FlopsBasis>(7); }, "step report flops basis 7 is unknown"}};
  for (const auto& [spoil, text] : flopsCases) {
    StepReport bad = validReport();
    spoil(bad);
    out = decodeStreamMessage(encode(StreamMessage{1, "", bad}));
    ASSERT_FALSE(out.ok()) << text;
    EXPECT_NE(out.error().message.find(text), std::string::npos) << out.error().message;
  }
  StepReport counted = validReport();
  counted.flops = 3.5e12;
  counted.flopsBasis = FlopsBasis::kTokens;
  counted.precision = Precision::kFp8;
  counted.peakFlops = 1979e12;
  out = decodeStreamMessage(encode(StreamMessage{1, "", counted}));
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_EQ(std::get<StepReport>(out->payload), counted);

  GpuSample overfull{"node", 0, 0, "", 130.0f, {}, {}, {}, {}, {}};
  out = decodeStreamMessage(encode(StreamMessage{1, "", overfull}));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("GPU utilization % is 130"), std::string::npos) << out.error().message;

  v1::StreamMessage unknownKind;
  unknownKind.set_seq(1);
  unknownKind.mutable_job_event()->set_job_id("j");
  unknownKind.mutable_job_event()->set_kind(static_cast<v1::JobEventKind>(99));
  out = decodeStreamMessage(unknownKind.SerializeAsString());
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("job event kind"), std::string::npos);
}

// Issue 35: a phase a program named, as a rank pushes it to its agent.
TEST(ProtocolRejection, APhaseReportNeedsANameOfAtMost64PrintableBytesAndASaneDuration) {
  const PhaseReport good{"job-1", 1, 2, 0, "checkpoint \xc3\xa9", 1'700'000'000'000'000, 250'000, 40};
  EXPECT_EQ(roundTripStream(good), good);
  EXPECT_EQ(jobOf(StreamPayload(good)), "job-1");
  EXPECT_EQ(timeOf(StreamPayload(good)), good.timeUnixUs);
  const auto refused = [](const std::function<void(PhaseReport&)>& change, const std::string& why) {
    PhaseReport p{"job-1", 1, 2, 0, "eval", 1'700'000'000'000'000, 250'000, 40};
    change(p);
    const auto out = decodeStreamMessage(encode(StreamMessage{1, "", p}));
    ASSERT_FALSE(out.ok()) << why;
    EXPECT_NE(out.error().message.find(why), std::string::npos) << out.error().message;
  };
  refused([](PhaseReport& p) { p.name.clear(); }, "phase report name is required");
  refused([](PhaseReport& p) { p.name = std::string(65, 'x'); }, "phase report name is 65 bytes long; the limit is 64");
  refused([](PhaseReport& p) { p.name = "eval\nrm -rf"; }, "phase report name has a control character");
  refused([](PhaseReport& p) { p.durationUs = -1; }, "phase report duration is negative");
  refused([](PhaseReport& p) { p.durationUs = 8LL * 24 * 3600 * 1'000'000; }, "phase report duration is over a week");
  refused([](PhaseReport& p) { p.rank = 2; }, "phase report rank 2 is outside world size 2");
  refused([](PhaseReport& p) { p.jobId = "../x"; }, "job id '../x' must not start with '.' or '-'");
  // Nanoseconds for microseconds would put the phase centuries out (and near overflow).
  refused([](PhaseReport& p) { p.timeUnixUs = 1'700'000'000'000'000'000; }, "is not microseconds since 1970");
  refused([](PhaseReport& p) { p.timeUnixUs = -1; }, "is not microseconds since 1970");
  // Not UTF-8: protobuf's parser refuses it on the wire; the C library checks it before sending.
  for (const char* name : {"\xc3", "\xc0\xaf", "\xed\xa0\x80", "ok\xff"}) {  // cut in two, overlong '/', a surrogate
    PhaseReport p = good;
    p.name = name;
    const auto checked = validatePhaseReport(p);
    ASSERT_FALSE(checked.ok()) << name;
    EXPECT_EQ(checked.error().message, "phase report name is not UTF-8");
  }
  PhaseReport fourBytes{"job-1", 1, 2, 0, "eval \xf0\x9f\x93\x88", 1'700'000'000'000'000, 1, 40};
  EXPECT_EQ(roundTripStream(fourBytes), fourBytes);
}

TEST(ProtocolValidation, TheDefaultSpecIsValidOnceItHasLayersAndSteps) {
  JobSpec s;
  s.jobId = "x";
  s.layers = {784, 10};
  s.steps = 1;
  EXPECT_TRUE(validateJobSpec(s).ok());
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

// Issue 15: one table per enum turns it into text and back (flags, checkpoints, reports, the app).
template <typename E>
void expectRoundTrip() {
  for (const auto& n : namesOf(E{})) {
    EXPECT_EQ(named<E>(n.name), n.value) << n.name;
    EXPECT_EQ(nameOf(n.value), n.name);
    EXPECT_FALSE(n.title.empty());
  }
  EXPECT_FALSE(named<E>("no-such-name").has_value());
}

// A job's state and end, as clients read them from its parts and its supervisor (lockstepctl's
// status, stop, watch and start --wait; the app; the history).
TEST(JobStates, AJobIsWhatItsSupervisorSaysOnceItsVerdictIsInElseWhatItsPartsSay) {
  using S = JobState;
  EXPECT_EQ(combinedState({S::kStopped, S::kFailed}), S::kFailed);
  EXPECT_EQ(combinedState({S::kStopped, S::kRunning}), S::kRunning);
  EXPECT_EQ(combinedState({}), S::kStarting);
  Supervision none, following{SupervisionState::kFollowing}, standby{SupervisionState::kStandby},
      ended{SupervisionState::kEnded, S::kStopped, "stopped on request"};
  EXPECT_EQ(jobOutcome(ended, {S::kStopped, S::kFailed}), S::kStopped) << "the verdict over its parts";
  EXPECT_EQ(jobOutcome(following, {S::kStopped, S::kFailed}), S::kFailed);

  // Parts that all ended under a supervision that goes on: a restart, or a verdict, is coming.
  EXPECT_FALSE(jobOver(following, {S::kFailed, S::kStopped}));
  EXPECT_FALSE(jobOver(standby, {S::kFailed, S::kStopped}));
  EXPECT_FALSE(jobOver({SupervisionState::kRestarting}, {S::kFailed}));
  EXPECT_TRUE(jobOver(ended, {S::kFailed, S::kStopped}));
  EXPECT_TRUE(jobOver(none, {S::kFailed, S::kStopped}));
  EXPECT_FALSE(jobOver(none, {S::kFailed, S::kRunning})) << "failed, but a part still runs";
  EXPECT_FALSE(jobOver(none, {})) << "no part known yet";

  EXPECT_TRUE(decidesOutcome(following));
  EXPECT_TRUE(decidesOutcome(standby)) << "it keeps a stop for when it takes over";
  EXPECT_FALSE(decidesOutcome(ended));
  EXPECT_FALSE(decidesOutcome(none));

  // Shown in a word: a job its supervisor restarts is not failed, though its parts are.
  EXPECT_EQ(jobStateWord({SupervisionState::kRestarting}, S::kFailed), "restarting");
  EXPECT_EQ(jobStateWord(following, S::kFailed), "failed");
  EXPECT_EQ(jobStateWord(ended, S::kStopped), "stopped");
}

TEST(EnumNames, EveryNameReadsBackAsItsValue) {
  expectRoundTrip<Backend>();
  expectRoundTrip<Activation>();
  expectRoundTrip<Precision>();
  expectRoundTrip<OptimizerKind>();
  expectRoundTrip<LrScaling>();
  EXPECT_EQ(titleOf(Precision::kBf16), "BF16");
  EXPECT_EQ(namesText<Precision>(), "fp32, tf32, bf16, fp16, fp8");
  expectRoundTrip<FlopsBasis>();
}

}  // namespace
}  // namespace lockstep
