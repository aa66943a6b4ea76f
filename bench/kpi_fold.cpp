// lockstep-bench-kpi-fold: what the KPI engine costs per message and per publication at thousands
// of GPUs, on one thread: the app's ingest thread (app/src/Ingest.cpp) and a job's supervising
// agent both fold every rank's stream into a JobTracker (and the app a Timeline) and work the
// KPIs out from it several times a second.
//
//   build/bin/lockstep-bench-kpi-fold [--agents 512,2048] [--gpus 8] [--seconds 20]
//
// For each size, side by side in one run: the synthetic job of lockstep-bench-app (a rank per GPU
// at 10 steps/s, GPU and process samples at 5 Hz, one batch per agent per 100 ms), `--seconds` of
// it folded as fast as one thread takes it through the same reader and LiveJob the ingest thread
// uses, with the KPIs worked out (JobTracker::snapshot, what a publication costs) every 100 ms of
// stream time. Prints messages per second folded, the fold's cost per message, a publication's
// cost, and how much of a core the live stream would take (the stream's rate at the fold's cost,
// plus 10 publications a second). Then what reaches a client each way (issue 46 §1,
// docs/fan-in.md): the stream's bytes per second (every record, as encoded on the wire), against a
// frame of the job's KPIs with 64 ranks' rows (and the slowest ranks') as the supervising agent
// sends it, one a second (as lockstepctl watch --fan-in asks), and what making and reading one costs.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "Ingest.h"
#include "lockstep/common/clock.h"
#include "lockstep/kpi/frame.h"
#include "lockstep/kpi/stream.h"
#include "lockstep/protocol/codec.h"
#include "process_figures.h"
#include "synthetic_stream.h"

namespace {

using namespace lockstep;
using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Figures {
  double messages = 0, foldSeconds = 0, publishSeconds = 0, maxPublishSeconds = 0, rssGrowthMb = 0;
  int publications = 0;
  double streamBytesPerSecond = 0;  // every record, encoded (outside the timed parts)
  double frameBytes = 0, frameMakeMs = 0, frameReadMs = 0;
};

constexpr std::uint32_t kFrameRows = 64;

// A frame of the job's KPIs at `now`, as an agent makes it and a client reads it.
void frameFigures(const kpi::JobTracker& tracker, std::int64_t now, Figures& f) {
  kpi::JobKpis k = tracker.snapshot(now);
  const auto ranks = std::move(k.ranks);  // as the supervision keeps a frame: its rows apart
  const auto gpus = std::move(k.gpus);
  const auto t0 = Clock::now();
  const std::string bytes = kpi::encodeFrame(kpi::withRanks(k, ranks, gpus, 0, kFrameRows));
  const auto t1 = Clock::now();
  const auto back = kpi::decodeFrame(bytes);
  const auto t2 = Clock::now();
  const std::size_t asked = std::min<std::size_t>(kFrameRows, ranks.size());  // and the slowest ranks' rows
  if (!back || back->ranks.size() < asked || back->ranks.size() > asked + kpi::kSlowestRanks) {
    std::fprintf(stderr, "the frame did not read back\n");
    std::exit(1);
  }
  f.frameBytes = static_cast<double>(bytes.size());
  f.frameMakeMs = seconds(t1 - t0) * 1e3;
  f.frameReadMs = seconds(t2 - t1) * 1e3;
}

Figures run(int agents, int gpus, double streamSeconds) {
  constexpr double kTick = 0.1, kStepsPerSecond = 10;
  constexpr int kSampleHz = 5;
  bench::SyntheticStream stream(agents, gpus, kStepsPerSecond);
  const double rss0 = bench::rssMegabytes();
  app::LiveJob live(stream.job(), kpi::Settings{});
  kpi::StreamReader reader([&](const std::string& id) -> RecordSink* { return id == bench::SyntheticStream::kJobId ? &live : nullptr; },
                           kpi::kNewestOnly);
  const auto ticks = static_cast<int>(streamSeconds / kTick);
  const std::int64_t end = unixMicrosNow();
  const std::int64_t start = end - static_cast<std::int64_t>(ticks) * 100'000;
  Figures f;
  for (int t = 1; t <= ticks; ++t) {
    const int samples = t % (10 / kSampleHz) == 0 ? 1 : 0;
    const std::int64_t now = start + static_cast<std::int64_t>(t) * 100'000;
    stream.startTick(kTick);
    std::vector<std::vector<StreamMessage>> batches;
    for (int a = 0; a < agents; ++a) batches.push_back(stream.batchOf(a, 1, samples, now));
    stream.endTick(1);
    const auto t0 = Clock::now();
    for (const auto& batch : batches) reader.read(batch);
    const auto t1 = Clock::now();
    live.read([&](const kpi::JobTracker& tracker) { return tracker.snapshot(now); });
    const auto t2 = Clock::now();
    for (const auto& batch : batches) f.messages += static_cast<double>(batch.size());
    for (const auto& batch : batches) {
      for (const auto& m : batch) f.streamBytesPerSecond += static_cast<double>(encode(m).size()) / (ticks * kTick);
    }
    f.foldSeconds += seconds(t1 - t0);
    f.publishSeconds += seconds(t2 - t1);
    f.maxPublishSeconds = std::max(f.maxPublishSeconds, seconds(t2 - t1));
    ++f.publications;
  }
  f.rssGrowthMb = bench::rssMegabytes() - rss0;
  live.read([&](const kpi::JobTracker& tracker) { frameFigures(tracker, end, f); return 0; });
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes{512, 2048};
  int gpus = 8;
  double streamSeconds = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--agents" && value) {
      sizes.clear();
      for (const char* p = value; *p;) {
        sizes.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
      ++i;
    } else if (a == "--gpus" && value) {
      gpus = std::atoi(value);
      ++i;
    } else if (a == "--seconds" && value) {
      streamSeconds = std::atof(value);
      ++i;
    } else {
      std::fprintf(stderr, "usage: lockstep-bench-kpi-fold [--agents 512,2048] [--gpus 8] [--seconds 20]\n");
      return 2;
    }
  }
  std::printf("%8s %8s %12s %10s %12s %14s %14s %12s %10s %12s %10s %12s %10s %8s %8s\n", "agents", "GPUs", "messages",
              "msgs/s", "fold us/msg", "publish ms", "publish max", "live core", "RSS +MB", "stream MB/s", "frame KB",
              "frames KB/s", "ratio", "make ms", "read ms");
  for (const int agents : sizes) {
    if (agents < 1 || gpus < 1 || streamSeconds < 1) {
      std::fprintf(stderr, "--agents, --gpus and --seconds must be positive (seconds at least 1)\n");
      return 2;
    }
    const Figures f = run(agents, gpus, streamSeconds);
    const double perMessage = f.foldSeconds / f.messages;
    const double publishMs = f.publishSeconds / f.publications * 1e3;
    // Live: the stream's messages per second at the fold's cost, and 10 publications a second.
    const double core = f.messages / streamSeconds * perMessage + 10 * publishMs / 1e3;
    const double framesPerSecond = f.frameBytes;  // one a second
    std::printf("%8d %8d %12.0f %10.0f %12.3f %14.2f %14.2f %11.0f%% %10.0f %12.1f %10.1f %12.1f %9.0fx %8.2f %8.2f\n",
                agents, agents * gpus, f.messages, f.messages / f.foldSeconds, perMessage * 1e6, publishMs,
                f.maxPublishSeconds * 1e3, core * 100, f.rssGrowthMb, f.streamBytesPerSecond / 1e6, f.frameBytes / 1e3,
                framesPerSecond / 1e3, f.streamBytesPerSecond / framesPerSecond, f.frameMakeMs, f.frameReadMs);
    std::fflush(stdout);
  }
  return 0;
}
