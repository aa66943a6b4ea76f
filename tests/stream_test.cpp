// Issue 31: the stream's spine. Each record's one description of its fields (protocol/records.h)
// against the schema, through the codec and JSON lines; the one reader (kpi/stream.h) that routes a
// job's records to its job and a node's to its node; the node tracker's figures; natural order.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "lockstep/common/natural.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/stream.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/record_json.h"
#include "lockstep/protocol/records.h"
#include "lockstep/protocol/validate.h"
#include "lockstep/v1/lockstep.pb.h"

namespace lockstep {
namespace {

using google::protobuf::FieldDescriptor;

// The schema's C++ type of a struct member's type (an enum travels as an enum).
template <class T>
FieldDescriptor::CppType cppTypeOf() {
  using V = std::remove_cv_t<T>;
  if constexpr (records::IsOptional<V>::value) return cppTypeOf<typename records::IsOptional<V>::Value>();
  else if constexpr (std::is_same_v<V, std::string>) return FieldDescriptor::CPPTYPE_STRING;
  else if constexpr (std::is_enum_v<V>) return FieldDescriptor::CPPTYPE_ENUM;
  else if constexpr (std::is_same_v<V, float>) return FieldDescriptor::CPPTYPE_FLOAT;
  else if constexpr (std::is_same_v<V, double>) return FieldDescriptor::CPPTYPE_DOUBLE;
  else if constexpr (std::is_same_v<V, std::int32_t>) return FieldDescriptor::CPPTYPE_INT32;
  else if constexpr (std::is_same_v<V, std::int64_t>) return FieldDescriptor::CPPTYPE_INT64;
  else if constexpr (std::is_same_v<V, std::uint32_t>) return FieldDescriptor::CPPTYPE_UINT32;
  else if constexpr (std::is_same_v<V, std::uint64_t>) return FieldDescriptor::CPPTYPE_UINT64;
  else return FieldDescriptor::CPPTYPE_BOOL;
}

// R's description against `message`, and the descriptions of the lists it holds against theirs.
template <class R>
void expectDescribes(const google::protobuf::Descriptor* message) {
  EXPECT_EQ(message->name(), records::Description<R>::kName);
  std::set<std::string> described;
  records::forEachField<R>([&](const auto& f) {
    using T = typename std::decay_t<decltype(f)>::Type;
    const std::string name(f.name);
    described.insert(name);
    const auto* fd = message->FindFieldByName(name);
    ASSERT_NE(fd, nullptr) << message->name() << " has no field " << name;
    EXPECT_EQ(fd->is_repeated(), records::IsList<T>::value) << message->name() << "." << name;
    if constexpr (records::IsList<T>::value) {
      ASSERT_NE(fd->message_type(), nullptr) << message->name() << "." << name << " is not a list of messages";
      expectDescribes<typename records::IsList<T>::Value>(fd->message_type());
      return;
    }
    EXPECT_EQ(fd->cpp_type(), cppTypeOf<T>()) << message->name() << "." << name;
    EXPECT_EQ(fd->has_presence(), records::IsOptional<T>::value) << message->name() << "." << name << ": optional in one, not the other";
  });
  for (int i = 0; i < message->field_count(); ++i) {
    EXPECT_TRUE(described.count(message->field(i)->name())) << message->name() << "." << message->field(i)->name() << " is not described";
  }
}

template <class R>
void expectDescribesItsMessage() {
  const auto* payload = v1::StreamMessage::descriptor()->FindFieldByName(std::string(records::Description<R>::kStreamField));
  ASSERT_NE(payload, nullptr) << records::Description<R>::kStreamField;
  ASSERT_NE(payload->message_type(), nullptr);
  expectDescribes<R>(payload->message_type());
}

TEST(Records, EachDescriptionNamesEveryFieldOfItsSchemaMessageWithItsTypeAndPresence) {
  expectDescribesItsMessage<JobEvent>();
  expectDescribesItsMessage<GpuSample>();
  expectDescribesItsMessage<ProcessSample>();
  expectDescribesItsMessage<NetSample>();
  expectDescribesItsMessage<StepReport>();
  expectDescribesItsMessage<PhaseReport>();
  EXPECT_EQ(v1::StreamMessage::descriptor()->FindOneofByName("payload")->field_count(),
            static_cast<int>(std::variant_size_v<StreamPayload>))
      << "a payload of the schema that StreamPayload does not hold";
}

NetSample netSample(std::int64_t t, std::uint64_t rx, std::uint64_t tx) {
  NetSample n;
  n.node = "node2";
  n.interface = "eth0";
  n.timeUnixUs = t;
  n.rxBytes = rx;
  n.txBytes = tx;
  n.rxPackets = rx / 1000;
  n.txPackets = tx / 1000;
  n.rxErrors = 0u;
  n.txErrors = 0u;
  n.linkBitsPerSecond = 10'000'000'000ull;
  return n;
}

std::vector<StreamPayload> everyKind() {
  JobEvent e;
  e.jobId = "j";
  e.kind = JobEventKind::kRankExited;
  e.timeUnixUs = 5;
  e.rank = 3u;
  e.exitCode = 1;
  e.message = "rank 3 exited";
  e.step = 7u;
  GpuSample g;
  g.node = "node2";
  g.gpuIndex = 1;
  g.timeUnixUs = 6;
  g.utilizationPct = 99.5f;
  g.energyMillijoules = 123ull;
  ProcessSample p;
  p.jobId = "j";
  p.rank = 3;
  p.pid = 42;
  p.timeUnixUs = 7;
  p.rssBytes = 1ull << 33;
  StepReport r;
  r.jobId = "j";
  r.rank = 1;
  r.worldSize = 2;
  r.step = 12;
  r.loss = NAN;
  r.computeTimeUs = 10;
  r.tokens = 4096ull;
  r.timeUnixUs = 8;
  r.optimizerTimeUs = 3;
  r.paramBytes = 7'454'720ull;
  r.gradBytes = 7'455'232ull;
  r.optimizerStateBytes = 1ull << 33;
  r.staleness = 7;
  r.collectives = {{CollectiveKind::kAllGather, 2, 700, 300, 1ull << 33}, {CollectiveKind::kBarrier, 1, 5, 5, 0}};
  r.collectiveSpans = {{CollectiveKind::kAllGather, 1, 400, 200, 1ull << 32}, {CollectiveKind::kAllGather, 500, 300, 100, 1ull << 32}};
  const PhaseReport phase{"j", 1, 2, 1, "checkpoint", 10, 9, 12};
  return {e, g, p, r, netSample(9, 1000, 2000), JobEvent{"k", JobEventKind::kStarted, 1, {}, {}, {}, "", "", {}}, phase};
}

TEST(Records, EveryKindTripsThroughTheCodecAndItsJsonLineKeepingUnknownsUnknown) {
  std::uint64_t seq = 0;
  for (const auto& payload : everyKind()) {
    const StreamMessage m{++seq, "node2", payload};
    auto back = decodeStreamMessage(encode(m));
    ASSERT_TRUE(back) << back.error().message;
    EXPECT_EQ(*back, m) << "seq " << seq;
    std::visit(
        [&](const auto& record) {
          using R = std::decay_t<decltype(record)>;
          auto line = fromJsonLine<R>(toJsonLine(record), "line");
          ASSERT_TRUE(line) << line.error().message;
          EXPECT_EQ(*line, record) << toJsonLine(record);
        },
        payload);
  }
  // An unknown time is null in the line, not 0; a NaN loss is null and reads back as NaN.
  const std::string line = toJsonLine(std::get<StepReport>(everyKind()[3]));
  EXPECT_NE(line.find("\"data_time_us\":null"), std::string::npos) << line;
  EXPECT_NE(line.find("\"loss\":null"), std::string::npos) << line;
  EXPECT_NE(line.find("\"tokens\":4096"), std::string::npos) << "the trainer's lines used to leave tokens out: " << line;
}

TEST(Records, ALineWithoutAnOptionalFieldReadsItAsUnknownAndAWrongFieldIsNamed) {
  // A --metrics-out line of an earlier Lockstep had no "tokens".
  const std::string old = R"({"job_id":"j","rank":0,"world_size":1,"attempt":0,"step":3,"epoch":0,"samples":64,"loss":0.5,)"
                          R"("global_loss":null,"data_time_us":1,"compute_time_us":2,"exposed_comm_time_us":3,)"
                          R"("allreduce_time_us":4,"bytes_reduced":5,"step_time_us":6,"time_unix_us":7,"lr":0.01})";
  auto r = fromJsonLine<StepReport>(old, "step report line");
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_FALSE(r->tokens.has_value());
  EXPECT_EQ(r->bytesReduced, 5u);
  auto bad = fromJsonLine<NetSample>(R"({"node":"n","interface":"eth0","time_unix_us":1,"rx_bytes":-1})", "network line");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().message, "not a network line: \"rx_bytes\" must be a whole number from 0");
}

// Issue 42: a step's collectives, by kind and one by one, in a line and through the checks.
TEST(Records, AStepsCollectivesAreNamedByKindInALineAndCheckedWhenDecoded) {
  StepReport r = std::get<StepReport>(everyKind()[3]);
  const std::string line = toJsonLine(r);
  EXPECT_NE(line.find(R"("collectives":[{"kind":"all_gather","count":2,"time_us":700,"exposed_us":300,"bytes":8589934592})"),
            std::string::npos) << line;
  std::string wrong = line;
  wrong.replace(wrong.find("\"barrier\""), 9, "\"gossip\"");
  auto bad = fromJsonLine<StepReport>(wrong, "step report line");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("\"collectives\" must be a list of objects whose fields are right: \"kind\" must be one of "
                                     "all_reduce, reduce_scatter, all_gather"), std::string::npos) << bad.error().message;

  const auto refused = [&](const StepReport& report) {
    auto decoded = decodeStreamMessage(encode(StreamMessage{1, "", report}));
    return decoded ? std::string() : decoded.error().message;
  };
  StepReport twice = r;
  twice.collectives.push_back(twice.collectives.front());
  EXPECT_NE(refused(twice).find("lists all_gather twice"), std::string::npos) << refused(twice);
  StepReport unknown = r;
  unknown.collectiveSpans[0].kind = static_cast<CollectiveKind>(99);
  EXPECT_NE(refused(unknown).find("collective kind 99 is unknown"), std::string::npos) << refused(unknown);
  StepReport negative = r;
  negative.collectives[0].exposedUs = -1;
  EXPECT_NE(refused(negative).find("all_gather exposed time is negative"), std::string::npos) << refused(negative);
  StepReport many = r;
  many.collectiveSpans.assign(kMaxCollectiveSpans + 1, r.collectiveSpans[0]);
  EXPECT_NE(refused(many).find("65 collective spans; at most 64"), std::string::npos) << refused(many);
  StepReport hostile = r;  // far more than any list may hold: read no further than one past the bound
  hostile.collectiveSpans.assign(100000, r.collectiveSpans[0]);
  EXPECT_NE(refused(hostile).find("65 collective spans"), std::string::npos) << refused(hostile);
}

TEST(Records, EqualityIsFieldByFieldWithNanEqualToNan) {
  NetSample a = netSample(1, 2, 3), b = a;
  EXPECT_EQ(a, b);
  b.rxDrops = 0u;  // known 0 is not unknown
  EXPECT_NE(a, b);
  GpuSample g1, g2;
  g1.utilizationPct = NAN;
  g2.utilizationPct = NAN;
  EXPECT_EQ(g1, g2);
  g2.utilizationPct.reset();
  EXPECT_NE(g1, g2);
}

TEST(NaturalOrder, NumbersInNamesCompareAsNumbers) {
  std::vector<std::string> nodes;
  for (int i = 12; i >= 1; --i) nodes.push_back("node" + std::to_string(i));
  std::mt19937 random(7);
  std::shuffle(nodes.begin(), nodes.end(), random);
  std::sort(nodes.begin(), nodes.end(), NaturalLess{});
  std::vector<std::string> expected;
  for (int i = 1; i <= 12; ++i) expected.push_back("node" + std::to_string(i));
  EXPECT_EQ(nodes, expected);
  EXPECT_TRUE(naturalLess("eth9", "eth10"));
  EXPECT_TRUE(naturalLess("gpu-a", "gpu-b"));
  EXPECT_TRUE(naturalLess("rack2-node10", "rack10-node2"));
  EXPECT_TRUE(naturalLess("node", "node1"));
  EXPECT_FALSE(naturalLess("node02", "node02"));
  // Strict: equal numbers with other zeros still have an order, one way only.
  EXPECT_NE(naturalLess("node2", "node02"), naturalLess("node02", "node2"));
  EXPECT_TRUE(naturalLess("node02", "node3"));
}

TEST(NodeTracker, RatesTotalsAndSeriesFromTheKernelsCounters) {
  kpi::NodeTracker node("node2", kpi::NodeSettings{1.0, 100});
  const std::int64_t t0 = 1'700'000'000'000'000;
  // 5 samples a second, 125 MB/s in (1 Gb/s), 12.5 MB/s out, for 3 s.
  for (int i = 0; i <= 15; ++i) {
    node.onNet("node2", netSample(t0 + i * 200'000, 25'000'000ull * i, 2'500'000ull * i));
  }
  auto k = node.snapshot();
  ASSERT_EQ(k.interfaces.size(), 1u);
  EXPECT_DOUBLE_EQ(k.interfaces[0].rxBytesPerSecond, 125e6);
  EXPECT_DOUBLE_EQ(*k.interfaces[0].linkUse, 0.1);
  auto totals = node.totals();
  ASSERT_EQ(totals.size(), 1u);
  EXPECT_EQ(totals[0].rxBytes, 375'000'000u);
  EXPECT_EQ(totals[0].txBytes, 37'500'000u);
  EXPECT_DOUBLE_EQ(totals[0].seconds, 3.0);
  EXPECT_DOUBLE_EQ(totals[0].peakRxBytesPerSecond, 125e6);
  const auto& series = node.networkSeries().at("eth0");
  EXPECT_EQ(series.size(), 3u) << "one point per second at the most";
  // The interface was recreated: its counters start over. No rate across it, nothing added.
  node.onNet("node2", netSample(t0 + 3'200'000, 1000, 100));
  EXPECT_TRUE(node.snapshot().interfaces.empty());
  EXPECT_EQ(node.totals()[0].rxBytes, 375'000'000u);
  node.onNet("node2", netSample(t0 + 3'400'000, 5'001'000, 100));
  EXPECT_EQ(node.totals()[0].rxBytes, 380'000'000u) << "counting resumes from the new counters";
}

TEST(NodeTracker, AGpuKeepsItsNewestSampleAndItsLastEnergyReading) {
  kpi::NodeTracker node("node2");
  GpuSample g;
  g.node = "node2";
  g.gpuIndex = 3;
  g.timeUnixUs = 1;
  g.energyMillijoules = 1000ull;
  g.powerMilliwatts = 100u;
  node.onGpu("node2", g);
  g.timeUnixUs = 2;
  g.energyMillijoules.reset();
  g.powerMilliwatts = 200u;
  node.onGpu("node2", g);
  const auto k = node.snapshot();
  ASSERT_EQ(k.gpus.size(), 1u);
  EXPECT_EQ(k.gpus[0].powerMilliwatts, 200u);
  EXPECT_EQ(k.gpus[0].energyMillijoules, 1000u);
}

TEST(StreamReader, AJobsRecordsReachItsJobAndANodesRecordsReachItsNode) {
  JobSpec spec;
  spec.jobId = "j";
  spec.worldSize = 2;
  kpi::JobTracker job(spec);
  int asked = 0;
  kpi::StreamReader reader([&](const std::string& id) -> RecordSink* {
    ++asked;
    return id == "j" ? &job : nullptr;
  });
  std::vector<StreamMessage> batch;
  std::uint64_t seq = 0;
  for (std::uint32_t rank = 0; rank < 2; ++rank) {
    StepReport r;
    r.jobId = "j";
    r.rank = rank;
    r.worldSize = 2;
    r.step = 1;
    r.samples = 10;
    r.stepTimeUs = 1000;
    r.timeUnixUs = 1'000'000;
    batch.push_back({++seq, "node10", r});
  }
  GpuSample held;
  held.node = "node10";
  held.jobId = "j";
  held.gpuIndex = 0;
  held.utilizationPct = 80.0f;
  held.timeUnixUs = 1'000'000;
  GpuSample idle = held;
  idle.jobId.clear();
  idle.gpuIndex = 1;
  StepReport other;
  other.jobId = "not-mine";
  other.step = 1;
  batch.push_back({++seq, "node10", held});
  batch.push_back({++seq, "node10", idle});
  batch.push_back({++seq, "node2", netSample(1, 10, 10)});
  batch.push_back({++seq, "node2", other});
  reader.read(batch);

  const auto k = job.snapshot(1'000'000);
  EXPECT_EQ(k.ranks.size(), 2u);
  ASSERT_EQ(k.gpus.size(), 1u) << "the held GPU is the job's; the idle one is not";
  EXPECT_EQ(asked, 2) << "once per run of a job's messages: j, then not-mine";
  ASSERT_NE(reader.node("node10"), nullptr);
  EXPECT_EQ(reader.node("node10")->snapshot().gpus.size(), 2u) << "the node keeps both of its GPUs";
  ASSERT_NE(reader.node("node2"), nullptr);
  EXPECT_EQ(reader.node("node2")->newestSamples().size(), 1u);
  EXPECT_EQ(reader.takeChangedNodes(), (std::vector<std::string>{"node2", "node10"})) << "in natural order";
  EXPECT_TRUE(reader.takeChangedNodes().empty());
}

}  // namespace
}  // namespace lockstep
