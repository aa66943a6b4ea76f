// The job history under the largest stream the app is sized for: 8 nodes x 8 GPUs, 64 ranks at
// 10 steps/s, GPU and process samples at 5 Hz (1,280 messages/s, as bench/app_load.cpp). Writes
// `--seconds` of that stream in the batches the app's recorder gets (one per agent per fetch),
// then reads it back the ways the app and reports do. Prints rates and their ratio to the live
// rate (headroom), the file size per hour of such a job, and what downsampling saves.
//
//   build/bin/lockstep-bench-history [--seconds 180] [--nodes 8] [--batch-nodes 1] [--dir DIR]
//
// --nodes 128 is the 1,024-GPU stream (20,480 messages/s); --batch-nodes 128 writes all the nodes'
// batches of a tick in one transaction, as the app's recorder does (a transaction per 50 ms).
//
// Samples older than a minute count as past the raw horizon, so the last line shows downsampling.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "lockstep/history/history.h"

namespace {

using namespace lockstep;
using Clock = std::chrono::steady_clock;

int nodeCount = 8;  // --nodes
constexpr int kGpusPerNode = 8, kStepsPerSecond = 10, kSampleHz = 5;
constexpr std::int64_t kT0 = 1'800'000'000'000'000;

double seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

JobSpec spec() {
  JobSpec s;
  s.jobId = "bench";
  s.layers = {1024, 4096, 4096, 1000};
  s.dataset = SyntheticDataset{.samples = 1 << 20, .dim = 1024, .classes = 1000};
  s.worldSize = nodeCount * kGpusPerNode;
  s.steps = 1'000'000;
  s.backend = Backend::kCuda;
  for (std::uint32_t r = 0; r < s.worldSize; ++r) {
    s.ranks.push_back(RankPlacement{r, "node-" + std::to_string(r / kGpusPerNode), r % kGpusPerNode, r % kGpusPerNode});
  }
  return s;
}

// One node's messages for one tenth of a second: a step report per rank, and half the time a
// GPU and a process sample per rank.
std::vector<StreamMessage> batch(const JobSpec& s, int node, int tick) {
  std::vector<StreamMessage> out;
  const std::int64_t t = kT0 + std::int64_t{tick} * 100'000;
  const std::string name = "node-" + std::to_string(node);
  for (int g = 0; g < kGpusPerNode; ++g) {
    const auto rank = static_cast<std::uint32_t>(node * kGpusPerNode + g);
    StepReport r;
    r.jobId = s.jobId;
    r.rank = rank;
    r.worldSize = s.worldSize;
    r.step = static_cast<std::uint64_t>(tick + 1);
    r.samples = 128;
    r.loss = 2.0f;
    r.globalLoss = 2.0f;
    r.dataTimeUs = 1'000;
    r.computeTimeUs = 80'000 + g * 100;
    r.exposedCommTimeUs = 9'000;
    r.stepTimeUs = 100'000;
    r.timeUnixUs = t;
    out.push_back(StreamMessage{0, name, r});
    if (tick % (kStepsPerSecond / kSampleHz) == 0) {
      GpuSample gs;
      gs.node = name;
      gs.gpuIndex = static_cast<std::uint32_t>(g);
      gs.jobId = s.jobId;
      gs.timeUnixUs = t;
      gs.utilizationPct = 90.0f;
      gs.memoryUsedBytes = 60ull << 30;
      gs.powerMilliwatts = 600'000;
      gs.energyMillijoules = static_cast<std::uint64_t>(tick) * 60'000;
      out.push_back(StreamMessage{0, name, gs});
      out.push_back(StreamMessage{0, name, ProcessSample{s.jobId, rank, 1000 + rank, t, 100.0f, 8ull << 30}});
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int duration = 180;
  int batchNodes = 1;
  std::string dir = (std::filesystem::temp_directory_path() / "lockstep-bench-history").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--seconds") duration = std::atoi(argv[i + 1]);
    else if (a == "--nodes") nodeCount = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--batch-nodes") batchNodes = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--dir") dir = argv[i + 1];
  }
  std::filesystem::remove_all(dir);
  const std::string path = dir + "/history.db";
  auto h = history::History::open(path, history::Options{.rawHorizonSeconds = 60, .bucketSeconds = 60});
  if (!h) {
    std::fprintf(stderr, "%s\n", h.error().message.c_str());
    return 1;
  }
  const JobSpec s = spec();
  for (int n = 0; n < nodeCount; ++n) {
    JobStatus status;
    status.spec = s;
    status.state = JobState::kRunning;
    status.startedUnixUs = kT0;
    if (!h->recordJob("node-" + std::to_string(n), status)) return 1;
  }

  const int ticks = duration * kStepsPerSecond;
  std::uint64_t messages = 0;
  auto start = Clock::now();
  for (int tick = 0; tick < ticks; ++tick) {
    for (int first = 0; first < nodeCount; first += batchNodes) {
      std::vector<StreamMessage> b;
      for (int n = first; n < std::min(nodeCount, first + batchNodes); ++n) {
        auto one = batch(s, n, tick);
        b.insert(b.end(), one.begin(), one.end());
      }
      if (auto r = h->recordMessages(b); !r) {
        std::fprintf(stderr, "%s\n", r.error().message.c_str());
        return 1;
      }
      messages += b.size();
    }
  }
  const double writeSeconds = seconds(start);
  const double liveRate = static_cast<double>(messages) / duration;
  const double writeRate = static_cast<double>(messages) / writeSeconds;
  const auto bytes = std::filesystem::file_size(path) +
                     (std::filesystem::exists(path + "-wal") ? std::filesystem::file_size(path + "-wal") : 0);

  start = Clock::now();
  auto tracker = h->tracker("bench");
  const double replaySeconds = seconds(start);
  if (!tracker) return 1;
  const auto k = (*tracker)->snapshot(kT0 + std::int64_t{duration} * 1'000'000);

  start = Clock::now();
  std::uint64_t steps = 0;
  if (!h->forEachStep("bench", [&](const StepReport&, const std::string&) { ++steps; })) return 1;
  const double stepsSeconds = seconds(start);

  auto compact = h->compact(kT0 + std::int64_t{duration} * 1'000'000);
  if (!compact) return 1;

  std::printf("stream: %d nodes x %d GPUs, %d steps/s, samples at %d Hz: %.0f messages/s live, %d s of it\n", nodeCount,
              kGpusPerNode, kStepsPerSecond, kSampleHz, liveRate, duration);
  std::printf("write:   %.0f messages/s, a transaction per %d node(s) per step -> %.1fx the live rate\n", writeRate,
              batchNodes, writeRate / liveRate);
  std::printf("size:    %.1f MB for %d s -> %.2f GB per hour of such a job (raw)\n", static_cast<double>(bytes) / 1e6,
              duration, static_cast<double>(bytes) / 1e9 * 3600 / duration);
  std::printf("replay:  %.2f s to rebuild the KPIs of %llu messages (%.0f messages/s; %.1fx faster than it ran); "
              "throughput %.0f samples/s\n",
              replaySeconds, static_cast<unsigned long long>(messages), static_cast<double>(messages) / replaySeconds,
              duration / replaySeconds, k.samplesPerSecond.value_or(0));
  std::printf("csv:     %.0f step rows/s read (%llu rows)\n", static_cast<double>(steps) / stepsSeconds,
              static_cast<unsigned long long>(steps));
  std::printf("compact: GPU samples %llu -> %llu rows, process samples %llu -> %llu rows (all but the last minute, into 1-minute buckets)\n",
              static_cast<unsigned long long>(compact->gpuRowsBefore), static_cast<unsigned long long>(compact->gpuRowsAfter),
              static_cast<unsigned long long>(compact->processRowsBefore),
              static_cast<unsigned long long>(compact->processRowsAfter));
  std::filesystem::remove_all(dir);
  return 0;
}
