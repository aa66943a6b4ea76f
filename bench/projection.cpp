// The projection to other rank counts (kpi/projection.h) against measured runs (issue 19): the
// step of a 1-rank run and the all-reduce of a 2-rank run project every rank count; each measured
// run's steady step time and throughput are printed beside the projection, with the error.
//
//   lockstep-bench-projection CORES THREADS ONE.jsonl TWO.jsonl [MORE.jsonl ...]
//
// CORES: this machine's, which every run's ranks shared; THREADS: each rank's BLAS threads (0: the
// trainer's default, cores / ranks). The .jsonl files are the trainer's --metrics-out.
//
// bench/projection.sh runs the reference workload at 1, 2 and 4 CPU ranks and calls this.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lockstep/kpi/projection.h"
#include "metrics.h"

namespace {

using namespace lockstep;

// The run's KPIs over its second half (the first steps warm up).
std::optional<kpi::JobKpis> kpisOf(const std::string& path) {
  auto read = trainer::readStepReports(path);
  if (!read) {
    std::fprintf(stderr, "%s\n", read.error().message.c_str());
    return std::nullopt;
  }
  const std::vector<StepReport>& reports = *read;
  if (reports.size() < 2) {
    std::fprintf(stderr, "%s: fewer than two step reports\n", path.c_str());
    return std::nullopt;
  }
  std::int64_t first = reports.front().timeUnixUs, last = first;
  for (const auto& r : reports) {
    first = std::min(first, r.timeUnixUs);
    last = std::max(last, r.timeUnixUs);
  }
  JobSpec spec;
  spec.jobId = reports.front().jobId;
  kpi::JobTracker tracker(spec, kpi::Settings{static_cast<double>(last - first) / 2e6});
  for (const auto& r : reports) tracker.add(r, "local");
  return tracker.snapshot(last);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s CORES THREADS ONE.jsonl TWO.jsonl [MORE.jsonl ...]\n", argv[0]);
    return 2;
  }
  const auto cores = static_cast<std::uint32_t>(std::strtoul(argv[1], nullptr, 10));
  const auto threads = static_cast<std::uint32_t>(std::strtoul(argv[2], nullptr, 10));
  std::vector<kpi::JobKpis> runs;
  for (int i = 3; i < argc; ++i) {
    auto k = kpisOf(argv[i]);
    if (!k) return 1;
    runs.push_back(*k);
  }
  const JobSpec none;
  const auto one = kpi::scalingInputs(runs[0], none), two = kpi::scalingInputs(runs[1], none);
  if (!one || !two || runs[0].worldSize != 1 || runs[1].worldSize < 2 || !two->busBandwidth) {
    std::fprintf(stderr, "the first run must have 1 rank and the second 2 or more, with timed all-reduces\n");
    return 1;
  }
  // Every run of bench/projection.sh is on this machine: its ranks share its cores.
  kpi::ScalingInputs own = *two;
  own.sharedNode = true;
  own.nodeCores = cores;
  own.threadsPerRank = threads;
  const kpi::ScalingInputs model = kpi::withStepOf(own, *one);
  std::printf("model: 1-rank step %.2f ms; %u-rank step %.2f ms busy + %.2f ms, all-reduce %.0f bytes at %.3f GB/s bus, "
              "%.2f ms exposed; ranks share one node\n",
              *model.aloneUs / 1e3, two->ranks, two->busyUs / 1e3, two->otherUs / 1e3, two->bytesPerStep.value_or(0),
              *two->busBandwidth / 1e9, two->exposedUs / 1e3);
  // What the report, with no 1-rank run to take the 1-rank point from, would project for it.
  if (const auto alone = kpi::project(own, {1}); !alone.empty()) {
    std::printf("from the %u-rank run alone, 1 rank: %.2f ms a step, %.0f samples/s (%+.1f%% against the 1-rank run)\n",
                two->ranks, alone[0].stepUs / 1e3, alone[0].samplesPerSecond,
                (alone[0].samplesPerSecond / runs[0].samplesPerSecond.value_or(NAN) - 1) * 100);
  }
  std::printf("%6s %10s %10s %10s %12s %10s %12s %11s %11s %8s\n", "ranks", "busy ms", "other ms", "exposed ms",
              "proj. exp.", "step ms", "proj. step", "samples/s", "projected", "error");
  for (const auto& k : runs) {
    const auto p = kpi::project(model, {k.worldSize});
    if (p.empty() || !k.meanStepUs || !k.samplesPerSecond) continue;
    const double error = p[0].samplesPerSecond / *k.samplesPerSecond - 1;
    const double busy = k.meanBusyUs.value_or(0), exposed = k.meanExposedUs.value_or(0);
    std::printf("%6u %10.2f %10.2f %10.2f %12.2f %10.2f %12.2f %11.0f %11.0f %+7.1f%%\n", k.worldSize, busy / 1e3,
                std::max(0.0, *k.meanStepUs - busy - exposed) / 1e3, exposed / 1e3, p[0].exposedUs / 1e3, *k.meanStepUs / 1e3,
                p[0].stepUs / 1e3, *k.samplesPerSecond, p[0].samplesPerSecond, error * 100);
  }
  return 0;
}
