// What the stream's codec costs per message (issue 31: the records' fields are carried through
// protobuf's reflection, by their one description in protocol/records.h, instead of generated
// setters spelled out by hand). A fetch reply of the app's busiest stream (step reports, GPU and
// process samples, network samples) is encoded and decoded again and again; beside it, in the same
// run, protobuf's own parse and serialization of the same bytes with no conversion, the floor any
// codec pays. Prints microseconds per message and the ratios. Then the same for job specs (issue
// 41: their fields too are carried through reflection, by spec_fields.h): a job list of --jobs
// statuses, each with a full trainer spec on 8 ranks, as `lockstepctl status` and the app read it.
//
//   build/bin/lockstep-bench-codec [--messages N] [--rounds R] [--jobs J]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lockstep/protocol/codec.h"
#include "lockstep/v1/lockstep.pb.h"

using namespace lockstep;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<StreamMessage> busyStream(std::size_t n) {
  std::vector<StreamMessage> out;
  for (std::size_t i = 0; out.size() < n; ++i) {
    const auto t = static_cast<std::int64_t>(1'700'000'000'000'000 + i * 1000);
    const std::string node = "node-" + std::to_string(i % 128);
    StepReport r;
    r.jobId = "bench";
    r.rank = static_cast<std::uint32_t>(i % 1024);
    r.worldSize = 1024;
    r.step = i + 1;
    r.samples = 64;
    r.loss = 0.5f;
    r.globalLoss = 0.5f;
    r.dataTimeUs = 100;
    r.computeTimeUs = 9000;
    r.exposedCommTimeUs = 900;
    r.allreduceTimeUs = 3000;
    r.bytesReduced = 7'455'744;
    r.stepTimeUs = 10'000;
    r.timeUnixUs = t;
    r.lr = 0.01;
    out.push_back({out.size() + 1, node, r});
    GpuSample g;
    g.node = node;
    g.gpuIndex = static_cast<std::uint32_t>(i % 8);
    g.timeUnixUs = t;
    g.jobId = "bench";
    g.utilizationPct = 97.0f;
    g.memoryUsedBytes = 70ull << 30;
    g.powerMilliwatts = 650'000u;
    g.temperatureC = 61;
    g.smClockMhz = 1980u;
    out.push_back({out.size() + 1, node, g});
    ProcessSample p{"bench", r.rank, 4242, t, 101.0f, 8ull << 30};
    out.push_back({out.size() + 1, node, p});
    if (i % 8 == 0) out.push_back({out.size() + 1, node, NetSample{node, "ib:mlx5_0/1", t, i, i, i, i, 0u, 0u, 0u, 0u, 400'000'000'000ull}});
  }
  out.resize(n);
  return out;
}

// A job list as an agent answers it: `jobs` running trainer jobs, 8 ranks on 2 nodes each.
JobsReply jobList(std::size_t jobs) {
  JobsReply out;
  for (std::size_t i = 0; i < jobs; ++i) {
    JobSpec s;
    s.jobId = "bench-" + std::to_string(i);
    s.name = "mlp sweep " + std::to_string(i);
    s.layers = {1024, 4096, 4096, 4096, 1000};
    s.dataset = NpyDataset{"/data/train-features.npy", "/data/train-labels.npy"};
    s.batchPerRank = 1024;
    s.optimizer = {OptimizerKind::kSgd, 0.05, 0.9, true, 1e-4, 0.9, 0.999, 1e-8, LrScaling::kLinear, 256};
    s.steps = 100'000;
    s.targetLoss = 0.3;
    s.checkpointEvery = 500;
    s.checkpointDir = "/shared/ckpt/bench-" + std::to_string(i);
    s.worldSize = 8;
    for (std::uint32_t r = 0; r < 8; ++r) s.ranks.push_back({r, r < 4 ? "node-a" : "node-b", r % 4, std::nullopt});
    s.rendezvousHost = "10.0.0.1";
    s.rendezvousPort = 29500;
    s.prices = {2.5, 0.05, 0.3, "EUR"};
    s.maxRestarts = 3;
    s.agents = {{"node-a", "10.0.0.1:7700", std::string(40, 'a')}, {"node-b", "10.0.0.2:7700", std::string(40, 'b')}};
    JobStatus j;
    j.spec = std::move(s);
    j.state = JobState::kRunning;
    j.startedUnixUs = 1'700'000'000'000'000;
    j.owner = "alice";
    out.jobs.push_back(std::move(j));
  }
  return out;
}

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

int main(int argc, char** argv) {
  std::size_t messages = 2000, rounds = 300, jobs = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--messages") messages = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--rounds") rounds = std::strtoull(argv[i + 1], nullptr, 10);
    if (flag == "--jobs") jobs = std::strtoull(argv[i + 1], nullptr, 10);
  }
  Reply reply{1, FetchReply{1, 1, messages, busyStream(messages), 1}};
  const std::string bytes = encode(reply);

  std::size_t checked = 0;
  auto start = Clock::now();
  for (std::size_t r = 0; r < rounds; ++r) checked += encode(reply).size();
  const double encodeS = secondsSince(start);
  start = Clock::now();
  for (std::size_t r = 0; r < rounds; ++r) checked += decodeReply(bytes)->requestId;
  const double decodeS = secondsSince(start);

  v1::Reply parsed;
  start = Clock::now();
  for (std::size_t r = 0; r < rounds; ++r) checked += parsed.ParseFromString(bytes) ? 1 : 0;
  const double parseS = secondsSince(start);
  start = Clock::now();
  for (std::size_t r = 0; r < rounds; ++r) checked += parsed.SerializeAsString().size();
  const double serializeS = secondsSince(start);

  const double per = 1e6 / static_cast<double>(messages * rounds);
  std::printf("lockstep-bench-codec: %zu messages a reply (%zu bytes), %zu rounds (checksum %zu)\n", messages,
              bytes.size(), rounds, checked);
  std::printf("%-28s %10s\n", "", "us/message");
  std::printf("%-28s %10.3f\n", "decode (lockstep)", decodeS * per);
  std::printf("%-28s %10.3f\n", "  of which parse (protobuf)", parseS * per);
  std::printf("%-28s %10.3f\n", "encode (lockstep)", encodeS * per);
  std::printf("%-28s %10.3f\n", "  of which serialize", serializeS * per);
  std::printf("ratios: decode / parse %.2fx, encode / serialize %.2fx\n", decodeS / parseS, encodeS / serializeS);
  std::printf("at the app's 1024-GPU stream (20,480 msgs/s): decode %.1f%% of a core\n", decodeS * per * 20480 / 1e4);

  const Reply list{2, jobList(jobs)};
  const std::string listBytes = encode(list);
  start = Clock::now();
  for (std::size_t r = 0; r < rounds; ++r) checked += encode(list).size();
  const double listEncodeS = secondsSince(start);
  start = Clock::now();
  for (std::size_t r = 0; r < rounds; ++r) checked += decodeReply(listBytes)->requestId;
  const double listDecodeS = secondsSince(start);
  const double perJob = 1e6 / static_cast<double>(jobs * rounds);
  std::printf("job list: %zu jobs (%zu bytes), checksum %zu\n", jobs, listBytes.size(), checked);
  std::printf("%-28s %10.3f\n", "decode, us/job", listDecodeS * perJob);
  std::printf("%-28s %10.3f\n", "encode, us/job", listEncodeS * perJob);
  return 0;
}
