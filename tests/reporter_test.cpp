// Issue 42: a native program's own collectives through liblockstep-reporter's C API (issue 46: and
// its step's FLOPs). The program (tests/programs/native_collectives.c) is a real child process
// linked against the library; its reports are read back here on a real PULL socket on loopback.
// (The library cannot be loaded in this process: it carries its own copy of the schema, which
// libprotobuf would register twice.)

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <zmq.hpp>

#include "lockstep/protocol/codec.h"
#include "support/test_support.h"

namespace lockstep::test {
namespace {

const std::string kProgram = LOCKSTEP_NATIVE_COLLECTIVES;

// "name rc" lines, in order.
std::vector<std::pair<std::string, int>> answers(const std::string& out) {
  std::vector<std::pair<std::string, int>> got;
  std::istringstream lines(out);
  std::string name;
  int rc = 0;
  while (lines >> name >> rc) got.emplace_back(name, rc);
  return got;
}

const CollectiveTimes* kindIn(const StepReport& r, CollectiveKind kind) {
  const auto it =
      std::find_if(r.collectives.begin(), r.collectives.end(), [&](const auto& c) { return c.kind == kind; });
  return it == r.collectives.end() ? nullptr : &*it;
}

std::size_t occurrences(const std::string& text, const std::string& part) {
  std::size_t n = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

struct NativeCollectives : ::testing::Test {
  void SetUp() override {
    pull.bind("tcp://127.0.0.1:*");
    pull.set(zmq::sockopt::rcvtimeo, 5000);
    endpoint = pull.get(zmq::sockopt::last_endpoint);
  }
  ProcessResult runProgram() {
    return runProcess(
        {kProgram},
        {{"LOCKSTEP_REPORT", endpoint}, {"LOCKSTEP_JOB_ID", "native-coll"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}}, dir);
  }
  std::vector<StepReport> reports(std::size_t count) {
    std::vector<StepReport> out;
    for (std::size_t i = 0; i < count; ++i) {
      zmq::message_t msg;
      if (!pull.recv(msg)) break;
      auto decoded = decodeStreamMessage(msg.to_string_view());
      EXPECT_TRUE(decoded.ok()) << decoded.error().message;
      if (decoded.ok()) out.push_back(std::get<StepReport>(decoded->payload));
    }
    return out;
  }

  TempDir dir;
  zmq::context_t context{1};
  zmq::socket_t pull{context, zmq::socket_type::pull};
  std::string endpoint;
};

TEST_F(NativeCollectives, EachCallAnswersAndBadInputIsRefusedAndSaidOncePerReason) {
  const auto run = runProgram();
  ASSERT_TRUE(run.status.success()) << run.status.describe() << run.err;
  const std::vector<std::pair<std::string, int>> expected = {
      {"start", 0},        {"start", 0},     {"timed", 0},
      {"totals", 0},       {"kind0", -1},    {"kind13", -1},
      {"kind-again", -1},  {"negative", -1}, {"negative-exposed", -1},
      {"nanoseconds", -1}, {"week", -1},     {"start", 0},
      {"twice", -1},       {"report", 0},    {"report", 0},
      {"report", 0},       {"report", 0},    {"report", 0}};
  EXPECT_EQ(answers(run.out), expected) << run.out;
  EXPECT_EQ(occurrences(run.err, "lockstep: collective not counted: collective kind 0 is unknown"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, " is unknown"), 1u) << "said once per reason: " << run.err;
  EXPECT_EQ(occurrences(run.err, "collective duration -5 is negative"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, " is negative"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, "collective start 1700000000000000000 is not microseconds since 1970"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, "collective time 700000000000000 us is over a week"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, "a collective was started before the last one ended"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, "lockstep: "), 5u) << "nothing else: " << run.err;
}

TEST_F(NativeCollectives, AStepCarriesItsCollectivesByKindAndOneByOne) {
  const auto run = runProgram();
  ASSERT_TRUE(run.status.success()) << run.err;
  const auto got = reports(1);
  ASSERT_EQ(got.size(), 1u);
  const StepReport& r = got[0];
  ASSERT_EQ(r.collectives.size(), 4u) << "all-reduce, all-gather, broadcast, barrier: nothing refused counted";
  EXPECT_EQ(r.collectives[0].kind, CollectiveKind::kAllReduce) << "by kind";

  const auto* allReduce = kindIn(r, CollectiveKind::kAllReduce);
  ASSERT_NE(allReduce, nullptr);
  EXPECT_EQ(allReduce->count, 1u);
  EXPECT_EQ(allReduce->bytes, 4096u);
  EXPECT_GE(allReduce->timeUs, 30'000);
  EXPECT_LT(allReduce->timeUs, 2'000'000);
  EXPECT_EQ(allReduce->exposedUs, allReduce->timeUs) << "blocking: all of it exposed";
  const auto* broadcast = kindIn(r, CollectiveKind::kBroadcast);
  ASSERT_NE(broadcast, nullptr);
  EXPECT_EQ(broadcast->count, 1u);
  EXPECT_EQ(broadcast->bytes, 8u);
  EXPECT_GE(broadcast->timeUs, 10'000);
  const auto* allGather = kindIn(r, CollectiveKind::kAllGather);
  ASSERT_NE(allGather, nullptr);
  EXPECT_EQ(*allGather, (CollectiveTimes{CollectiveKind::kAllGather, 4, 20'000, 1'500, 4u << 20}))
      << "the timed one and the totals";
  const auto* barrier = kindIn(r, CollectiveKind::kBarrier);
  ASSERT_NE(barrier, nullptr);
  EXPECT_EQ(barrier->count, 1u) << "the start refused while it ran is not counted";

  ASSERT_EQ(r.collectiveSpans.size(), 4u) << "the totals have no span";
  EXPECT_EQ(r.collectiveSpans[0].kind, CollectiveKind::kAllReduce);
  EXPECT_EQ(r.collectiveSpans[0].durationUs, allReduce->timeUs);
  EXPECT_EQ(r.collectiveSpans[0].exposedUs, allReduce->timeUs);
  EXPECT_EQ(r.collectiveSpans[0].bytes, 4096u);
  EXPECT_LE(r.collectiveSpans[0].startUnixUs + r.collectiveSpans[0].durationUs,
            r.collectiveSpans[1].startUnixUs + 1'000)
      << "on the rank's clock, one after the other";
  EXPECT_LE(r.collectiveSpans[1].startUnixUs + r.collectiveSpans[1].durationUs, r.timeUnixUs + 1'000);
  EXPECT_EQ(r.collectiveSpans[2], (CollectiveSpan{CollectiveKind::kAllGather, 1700000000000000, 5000, 1200, 1u << 20}));
  EXPECT_EQ(r.collectiveSpans[3].kind, CollectiveKind::kBarrier);

  const std::int64_t exposed = allReduce->exposedUs + broadcast->exposedUs + 1'500 + barrier->exposedUs;
  EXPECT_EQ(r.exposedCommTimeUs, exposed) << "left unknown by the program: the collectives' exposed time";
  EXPECT_GE(r.stepTimeUs, exposed);
}

TEST_F(NativeCollectives, TotalsStartOverEachStepAndSpansStopAt64) {
  const auto run = runProgram();
  ASSERT_TRUE(run.status.success()) << run.err;
  const auto got = reports(5);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_TRUE(got[1].collectives.empty()) << "step 2 issued none";
  EXPECT_TRUE(got[1].collectiveSpans.empty());
  EXPECT_FALSE(got[1].exposedCommTimeUs) << "no collective, nothing said: unknown";

  const StepReport& many = got[2];
  ASSERT_EQ(many.collectives.size(), 1u);
  EXPECT_EQ(many.collectives[0], (CollectiveTimes{CollectiveKind::kSendRecv, 70, 700, 140, 7000}));
  ASSERT_EQ(many.collectiveSpans.size(), 64u) << "the first 64, the totals count all 70";
  EXPECT_EQ(many.exposedCommTimeUs, 7) << "the program's own exposed time is kept";

  const StepReport& capped = got[3];
  EXPECT_EQ(capped.stepTimeUs, 1000);
  EXPECT_EQ(capped.exposedCommTimeUs, 1000) << "capped at the step's time";
  ASSERT_EQ(capped.collectives.size(), 1u) << "the reduce-scatter still open belongs to the next step";
  EXPECT_EQ(capped.collectives[0].kind, CollectiveKind::kAllToAll);

  const StepReport& next = got[4];
  ASSERT_EQ(next.collectives.size(), 1u);
  EXPECT_EQ(next.collectives[0].kind, CollectiveKind::kReduceScatter);
  EXPECT_EQ(next.collectives[0].bytes, 512u);
  EXPECT_EQ(next.collectiveSpans.size(), 1u);
}

TEST_F(NativeCollectives, OutsideLockstepEveryCallIsANoOp) {
  const auto run = runProcess({kProgram}, {}, dir);
  ASSERT_TRUE(run.status.success()) << run.err;
  for (const auto& [name, rc] : answers(run.out)) EXPECT_EQ(rc, 2) << name;
  EXPECT_EQ(run.err, "");
}

// Issue 46: lockstep_step_flops, driven through ctypes by Debian's Python (a second C program would
// need a target of its own), from the library beside the collectives program.
const char* const kFlopsProgram = R"(
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.lockstep_open.restype = ctypes.c_void_p
lib.lockstep_step_flops.argtypes = [ctypes.c_void_p, ctypes.c_double, ctypes.c_int, ctypes.c_int]
lib.lockstep_report.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.lockstep_step_init.argtypes = [ctypes.c_void_p]
lib.lockstep_close.argtypes = [ctypes.c_void_p]
r = lib.lockstep_open()
info = ctypes.create_string_buffer(256)  # lockstep_step_info is 104 bytes

def say(name, rc):
    print(name, rc, flush=True)

def report():
    lib.lockstep_step_init(info)
    ctypes.c_uint32.from_buffer(info, 12).value = 8  # samples
    say("report", lib.lockstep_report(r, info))

say("bf16", lib.lockstep_step_flops(r, 1e12, 0, 3))
report()                                              # 1: declared 1e12, bf16
report()                                              # 2: started over, nothing
say("precision-alone", lib.lockstep_step_flops(r, -1, 0, 1))
report()                                              # 3: fp32, no flops
for name, flops, basis, precision in (("negative", -5, 0, 0), ("nan", float("nan"), 0, 0), ("huge", 1e30, 0, 0),
                                      ("basis", 1e9, 4, 0), ("precision", 1e9, 1, 6), ("negative-again", -7, 0, 0)):
    say(name, lib.lockstep_step_flops(r, flops, basis, precision))
say("layers", lib.lockstep_step_flops(r, 2e9, 3, 0))
report()                                              # 4: 2e9 counted on the layers, no precision
lib.lockstep_close(r)
)";

TEST_F(NativeCollectives, StepFlopsGoWithTheNextReportOnlyAndBadOnesAreRefused) {
  const std::string library =
      (std::filesystem::path(kProgram).parent_path().parent_path() / "lib" / "liblockstep-reporter.so.0").string();
  const Env env = {{"LOCKSTEP_REPORT", endpoint}, {"LOCKSTEP_JOB_ID", "native-flops"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}};
  const auto run = runProcess({"/usr/bin/python3", "-c", kFlopsProgram, library}, env, dir);
  ASSERT_TRUE(run.status.success()) << run.status.describe() << run.err;
  const std::vector<std::pair<std::string, int>> expected = {
      {"bf16", 0},       {"report", 0},    {"report", 0},    {"precision-alone", 0}, {"report", 0},
      {"negative", -1},  {"nan", -1},      {"huge", -1},     {"basis", -1},          {"precision", -1},
      {"negative-again", -1}, {"layers", 0}, {"report", 0}};
  EXPECT_EQ(answers(run.out), expected) << run.out << run.err;
  EXPECT_EQ(occurrences(run.err, "lockstep: flops not noted: "), 4u) << "once per reason: " << run.err;
  EXPECT_EQ(occurrences(run.err, "flops must be a finite count >= 0"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, "flops over 6e22 in one step"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, "basis is not one of LOCKSTEP_FLOPS_*"), 1u) << run.err;
  EXPECT_EQ(occurrences(run.err, "precision is not one of LOCKSTEP_PRECISION_*"), 1u) << run.err;

  const auto got = reports(4);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].flops, 1e12);
  EXPECT_EQ(got[0].flopsBasis, FlopsBasis::kDeclared) << "0: the program's own count";
  EXPECT_EQ(got[0].precision, Precision::kBf16);
  EXPECT_FALSE(got[0].peakFlops) << "the agent's to set";
  EXPECT_FALSE(got[1].flops) << "for one report only";
  EXPECT_FALSE(got[1].flopsBasis);
  EXPECT_FALSE(got[1].precision);
  EXPECT_FALSE(got[2].flops);
  EXPECT_FALSE(got[2].flopsBasis);
  EXPECT_EQ(got[2].precision, Precision::kFp32);
  EXPECT_EQ(got[3].flops, 2e9) << "the refused calls kept nothing";
  EXPECT_EQ(got[3].flopsBasis, FlopsBasis::kLayers);
  EXPECT_FALSE(got[3].precision);
}

TEST_F(NativeCollectives, StepFlopsOutsideLockstepIsANoOp) {
  const std::string library =
      (std::filesystem::path(kProgram).parent_path().parent_path() / "lib" / "liblockstep-reporter.so.0").string();
  const auto run = runProcess({"/usr/bin/python3", "-c", kFlopsProgram, library}, {}, dir);
  ASSERT_TRUE(run.status.success()) << run.err;
  for (const auto& [name, rc] : answers(run.out)) EXPECT_EQ(rc, 2) << name;
  EXPECT_EQ(run.err, "");
}

}  // namespace
}  // namespace lockstep::test
