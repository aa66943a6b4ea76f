// Gloo all-reduce between two local processes: the unbound-buffer API (gloo::allreduce) against
// the bound-buffer algorithm over synchronous pairs that lockstep-trainer uses, on idle cores and
// on cores busy with a GEMM thread (at normal priority, and at SCHED_IDLE as lockstep's compute
// thread runs while buckets are in flight). Prints median and p90 milliseconds per all-reduce.
//
//   build/bin/lockstep-bench-gloo [iterations]

#include <cblas.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

void sum(float* x, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] += y[i];
}
void sumInto(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<float*>(c);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

enum class Load { kIdle, kBusy, kBusyYielding };
const char* loadName(Load l) {
  return l == Load::kIdle ? "idle cores" : l == Load::kBusy ? "busy cores" : "busy, compute at SCHED_IDLE";
}

// A thread that keeps one core busy with GEMMs, like a rank's compute thread.
class Burner {
 public:
  explicit Burner(Load load) {
    if (load == Load::kIdle) return;
    thread_ = std::thread([this, load] {
      if (load == Load::kBusyYielding) {
        sched_param none{};
        sched_setscheduler(0, SCHED_IDLE, &none);
      }
      std::vector<float> a(64 * 1024, 1.0f), b(1024 * 1024, 1.0f), c(64 * 1024);
      while (!stop_) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 64, 1024, 1024, 1.0f, a.data(), 1024, b.data(), 1024,
                    0.0f, c.data(), 1024);
      }
    });
  }
  ~Burner() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

template <class F>
void measure(int rank, const char* what, Load load, size_t floats, int iterations, F&& allreduce) {
  Burner burner(load);
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    allreduce();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  if (rank == 0) {
    std::printf("%-44s %-30s %9.2f MB %8.3f ms %8.3f ms\n", what, loadName(load), floats * 4 / 1e6,
                ms[ms.size() / 2], ms[ms.size() * 9 / 10]);
    std::fflush(stdout);
  }
}

int runRank(int rank, const std::string& storeDir, int iterations) {
  gloo::rendezvous::FileStore store(storeDir);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, 2);
  context->setTimeout(std::chrono::seconds(60));
  context->connectFullMesh(store, device);
  const std::vector<size_t> sizes = {1u << 18, 1863690};  // 1 MiB; the reference MLP's gradients
  std::vector<float> data(sizes.back(), 1.0f);
  const Load loads[] = {Load::kIdle, Load::kBusy, Load::kBusyYielding};

  uint32_t tag = 0;
  for (size_t n : sizes) {
    for (Load load : loads) {
      measure(rank, "gloo::allreduce (unbound, event loop)", load, n, iterations, [&] {
        gloo::AllreduceOptions opts(context);
        opts.setOutput(data.data(), n);
        opts.setReduceFunction(gloo::AllreduceOptions::Func(&sumInto));
        opts.setTag(tag++);
        gloo::allreduce(opts);
      });
    }
  }
  // Synchronous mode is one-way: the unbound API needs the event loop, so it was measured first.
  gloo::ReductionFunction<float> fn(gloo::SUM, &sum);
  std::vector<std::unique_ptr<gloo::AllreduceHalvingDoubling<float>>> algorithms;
  for (size_t n : sizes) {
    algorithms.push_back(std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
        context, std::vector<float*>{data.data()}, static_cast<int>(n), &fn));
  }
  context->getPair(1 - rank)->setSync(true, false);
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (Load load : loads) {
      measure(rank, "AllreduceHalvingDoubling (bound, sync pairs)", load, sizes[i], iterations,
              [&] { algorithms[i]->run(); });
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 40;
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  const std::string dir = (std::filesystem::temp_directory_path() / ("lockstep-bench-gloo-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  std::printf("%-44s %-30s %12s %11s %11s\n", "all-reduce", "load", "size", "median", "p90");
  std::fflush(stdout);  // or the children print the buffered header again
  pid_t children[2];
  for (int rank = 0; rank < 2; ++rank) {
    children[rank] = fork();
    if (children[rank] == 0) _exit(runRank(rank, dir, iterations));
  }
  int failed = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failed |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(dir);
  return failed;
}
