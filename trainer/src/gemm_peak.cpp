#include "gemm_peak.h"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace lockstep::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// Large enough that the kernel, not the call, sets the rate; small enough to sit in the caches a
// core has to itself (3 matrices of 1 MiB), as the trainer's layers' blocks do.
constexpr int kN = 512;

// One thread on `cpu`: its best rate over `seconds` of back-to-back products.
double bestRateOn(int cpu, double seconds) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
  const auto size = static_cast<std::size_t>(kN) * kN;
  std::vector<float> a(size, 0.5f), b(size, 0.25f), c(size, 0.0f);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  double best = 0;
  for (int round = 0; Clock::now() < end || round < 3; ++round) {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kN, kN, kN, 1.0f, a.data(), kN, b.data(), kN, 0.0f, c.data(), kN);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (took > 0) best = std::max(best, 2.0 * kN * kN * static_cast<double>(kN) / took);
  }
  return best;
}

// OpenBLAS keeps a fixed number of buffers for the threads that call it (Debian's build: for 64
// CPUs and more); beyond, it stops the process. Measured on at most this many CPUs of the node's.
constexpr std::size_t kMaxMeasuredCpus = 64;

std::vector<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return {0};
  for (int cpu = 0; cpu < CPU_SETSIZE && cpus.size() < kMaxMeasuredCpus; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

}  // namespace

GemmPeak measureGemmPeak(double seconds) {
  openblas_set_num_threads(1);  // one thread per core, each calling OpenBLAS on its own
  const std::vector<int> cpus = allowedCpus();
  std::vector<double> rates(cpus.size(), 0.0);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cpus.size(); ++i) {
    threads.emplace_back([&, i] { rates[i] = bestRateOn(cpus[i], seconds); });
  }
  for (auto& t : threads) t.join();
  GemmPeak peak;
  peak.cores = static_cast<unsigned>(cpus.size());
  for (const double r : rates) peak.flopsPerCore += r / static_cast<double>(rates.size());
  peak.corename = openblas_get_corename();
  return peak;
}

std::string gemmPeakJson(const GemmPeak& peak) {
  std::string corename;
  for (const char c : peak.corename) {
    if (c >= 0x20 && c != '"' && c != '\\' && c != 0x7f) corename += c;
  }
  char text[256];
  std::snprintf(text, sizeof text, "{\"flops_per_core\": %.6g, \"cores\": %u, \"corename\": \"%s\"}", peak.flopsPerCore,
                peak.cores, corename.c_str());
  return text;
}

}  // namespace lockstep::trainer
