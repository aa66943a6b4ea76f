// One core's sgemm rate with OpenBLAS on one thread: the CPU's ceiling for the model FLOPs
// utilization of a CPU job (issue 46), as the trainer's GEMMs meet it. Run it with the
// OPENBLAS_CORETYPE the trainer picks (bench/cpu_reference.py does). Prints one JSON line:
// {"gflops": best rate over the run, "corename": the kernels in force, "n": the square size}.
//
//   build/bin/lockstep-bench-sgemm [seconds] [n]

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  const int n = argc > 2 ? std::atoi(argv[2]) : 1024;
  if (!(seconds > 0 && seconds <= 600) || n < 64 || n > 8192) {
    std::fprintf(stderr, "usage: lockstep-bench-sgemm [seconds 0-600] [n 64-8192]\n");
    return 2;
  }
  openblas_set_num_threads(1);
  const auto size = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a(size, 0.5f), b(size, 0.25f), c(size, 0.0f);
  using Clock = std::chrono::steady_clock;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  double best = 0;
  for (int round = 0; Clock::now() < end || round < 3; ++round) {
    const auto start = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    best = std::max(best, 2.0 * n * n * static_cast<double>(n) / took / 1e9);
  }
  std::printf("{\"gflops\": %.2f, \"corename\": \"%s\", \"n\": %d}\n", best, openblas_get_corename(), n);
  return 0;
}
