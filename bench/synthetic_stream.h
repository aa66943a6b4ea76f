#pragma once
// The stream of one synthetic data-parallel job, as its agents' fetches deliver it: a rank per GPU
// reporting every step, every GPU and rank process sampled, one batch per agent per tick. Shared
// by the app benchmark (app_load.cpp) and the KPI engine's (kpi_fold.cpp), so both measure the
// same load.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "lockstep/protocol/records.h"
#include "lockstep/protocol/types.h"

namespace lockstep::bench {

inline std::string nodeName(int a) { return "node-" + std::to_string(a); }

class SyntheticStream {
 public:
  static constexpr const char* kJobId = "bench-8x8";

  SyntheticStream(int agents, int gpus, double stepsPerSecond)
      : agents_(agents), gpus_(gpus), stepsPerSecond_(stepsPerSecond), seq_(static_cast<std::size_t>(agents), 0) {}

  // The job: bf16 on GPUs, a rank per GPU placed node by node.
  JobSpec job() const {
    JobSpec spec;
    spec.jobId = kJobId;
    spec.backend = Backend::kCuda;
    spec.precision = Precision::kBf16;
    spec.layers = {784, 4096, 4096, 10};
    spec.batchPerRank = 256;
    spec.steps = 1'000'000;
    spec.worldSize = static_cast<std::uint32_t>(agents_ * gpus_);
    spec.prices.gpuHour = 3.5;
    spec.prices.kwh = 0.2;
    for (int a = 0; a < agents_; ++a) {
      // Each node's agent as its launcher reached it (the app fans in only a job with agents).
      spec.agents.push_back({nodeName(a), nodeName(a) + ":7700", std::string(40, 'k')});
      for (int g = 0; g < gpus_; ++g) {
        spec.ranks.push_back({static_cast<std::uint32_t>(a * gpus_ + g), nodeName(a), static_cast<std::uint32_t>(g),
                              static_cast<std::uint32_t>(g)});
      }
    }
    return spec;
  }

  // Agent `a`'s batch: what its ranks and GPUs produced in `steps` steps and `samples` sampling
  // rounds ending at `now`. Rank 13 computes 9 ms longer than the others.
  std::vector<StreamMessage> batchOf(int a, int steps, int samples, std::int64_t now) {
    std::vector<StreamMessage> batch;
    for (int s = 0; s < steps; ++s) {
      for (int g = 0; g < gpus_; ++g) addStep(batch, a, g, step_ + static_cast<std::uint64_t>(s) + 1, now - (steps - 1 - s) * stepUs());
    }
    for (int s = 0; s < samples; ++s) {
      for (int g = 0; g < gpus_; ++g) addSamples(batch, a, g, now);
    }
    return batch;
  }

  // Before a tick's batches: the GPUs drew 700 W for `seconds`. After them: the steps they
  // reported are done.
  void startTick(double seconds) { energy_ += static_cast<std::uint64_t>(700 * 1000 * seconds); }  // mJ
  void endTick(int steps) { step_ += static_cast<std::uint64_t>(steps); }

 private:
  std::int64_t stepUs() const { return static_cast<std::int64_t>(1e6 / stepsPerSecond_); }
  std::uint32_t world() const { return static_cast<std::uint32_t>(agents_ * gpus_); }

  void addStep(std::vector<StreamMessage>& batch, int a, int g, std::uint64_t step, std::int64_t at) {
    const float loss = static_cast<float>(2.3 * std::exp(-static_cast<double>(step) / 3000.0) + 0.1);
    StepReport r;
    r.jobId = kJobId;
    r.rank = static_cast<std::uint32_t>(a * gpus_ + g);
    r.worldSize = world();
    r.step = step;
    r.samples = 256;
    r.loss = loss + static_cast<float>(0.02 * noise_(rng_));
    r.globalLoss = loss;
    r.dataTimeUs = 2000;
    r.computeTimeUs = 70000 + (r.rank == 13 ? 9000 : 0) + static_cast<std::int64_t>(2000 * noise_(rng_));
    r.exposedCommTimeUs = 12000;
    r.optimizerTimeUs = 6000;
    r.allreduceTimeUs = 30000;
    r.bytesReduced = 2ull << 20;
    r.stepTimeUs = *r.dataTimeUs + *r.computeTimeUs + *r.exposedCommTimeUs;
    r.timeUnixUs = at;
    std::uint64_t& seq = seq_[static_cast<std::size_t>(a)];
    batch.push_back({++seq, nodeName(a), r});
    if (step % 100 == 0) {  // each rank's checkpoint, every 100 steps: a named phase on the timeline
      batch.push_back({++seq, nodeName(a), PhaseReport{r.jobId, r.rank, world(), 0, "checkpoint", r.timeUnixUs + 20'000, 15'000, step}});
    }
  }

  void addSamples(std::vector<StreamMessage>& batch, int a, int g, std::int64_t now) {
    std::uint64_t& seq = seq_[static_cast<std::size_t>(a)];
    GpuSample gs;
    gs.node = nodeName(a);
    gs.gpuIndex = static_cast<std::uint32_t>(g);
    gs.timeUnixUs = now;
    gs.jobId = kJobId;
    gs.utilizationPct = static_cast<float>(std::clamp(85 + 5 * noise_(rng_) - (a * gpus_ + g == 13 ? 0 : 3), 0.0, 100.0));
    gs.memoryUsedBytes = 60ull << 30;
    gs.powerMilliwatts = 700000;
    gs.energyMillijoules = energy_;
    gs.temperatureC = 65;
    batch.push_back({++seq, nodeName(a), gs});
    ProcessSample ps;
    ps.jobId = kJobId;
    ps.rank = static_cast<std::uint32_t>(a * gpus_ + g);
    ps.pid = static_cast<std::uint32_t>(1000 + g);
    ps.timeUnixUs = now;
    ps.cpuPct = 100;
    ps.rssBytes = 3ull << 30;
    batch.push_back({++seq, nodeName(a), ps});
  }

  int agents_, gpus_;
  double stepsPerSecond_;
  std::vector<std::uint64_t> seq_;
  std::uint64_t step_ = 0;
  std::uint64_t energy_ = 0;
  std::mt19937 rng_{1};
  std::normal_distribution<double> noise_{0, 1};
};

}  // namespace lockstep::bench
