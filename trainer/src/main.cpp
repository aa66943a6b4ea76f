// lockstep-trainer: one rank of a data-parallel job, or with --nproc N a launcher for N local ranks.

#include <cblas.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <new>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gemm_peak.h"
#include "launcher.h"
#include "lockstep/jobflags/options.h"
#include "trainer.h"

namespace {

std::atomic<int> g_stopSignal{0};

constexpr double kGemmPeakSeconds = 1.0;

void onStopSignal(int signal) { g_stopSignal.store(signal); }

void installSignalHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: blocking waits return early and see the stop
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

// OpenBLAS 0.3.21 (Debian 12) does not recognise recent Intel CPUs and falls back to its slowest
// kernels (measured 6x slower here, docs/benchmarks.md). OpenBLAS picks its kernels when it is
// loaded, before main, from OPENBLAS_CORETYPE; so when the user did not choose and the CPU can run
// faster kernels than those picked, set the variable and start again.
void preferFastBlasKernels(char** argv) {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const std::string picked = openblas_get_corename();
  auto pickedIs = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (strcasecmp(picked.c_str(), n) == 0) return true;
    return false;
  };
  const char* better = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq")) {
    if (!pickedIs({"SkylakeX", "Cooperlake", "SapphireRapids"})) better = "SkylakeX";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    if (!pickedIs({"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})) better = "Haswell";
  }
  if (better == nullptr) return;
  ::setenv("OPENBLAS_CORETYPE", better, 1);
  ::execv("/proc/self/exe", argv);
  // exec failed: carry on with the kernels we have.
#else
  (void)argv;
#endif
}

int exitCodeFor(const lockstep::Error& error) {
  using lockstep::ErrorCode;
  switch (error.code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kPermissionDenied:
      return 2;
    case ErrorCode::kPeerLost:
    case ErrorCode::kTimeout:
    case ErrorCode::kUnavailable:
      return 3;
    default:
      return 1;
  }
}

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "lockstep-trainer: error: out of memory: use a smaller model, batch or data set\n");
    return 1;
  }
}

int run(int argc, char** argv) {
  using namespace lockstep::trainer;
  using namespace lockstep::jobflags;
  preferFastBlasKernels(argv);
  const std::vector<std::string> args(argv + 1, argv + argc);

  auto parsed = parseTrainerArgs(args);
  if (!parsed) {
    std::fprintf(stderr, "lockstep-trainer: error: %s\n", parsed.error().message.c_str());
    return 2;
  }
  TrainerOptions options = std::move(parsed).value();
  if (options.help) {
    std::fputs(trainerUsage().c_str(), stdout);
    return 0;
  }
  if (options.version) {
    std::printf("lockstep-trainer %s\n", LOCKSTEP_VERSION);
    return 0;
  }
  if (options.gemmPeak) {
    std::printf("%s\n", gemmPeakJson(measureGemmPeak(kGemmPeakSeconds)).c_str());
    return 0;
  }
  if (options.spec.backend == lockstep::Backend::kCuda && !cudaBackendBuilt()) {
    std::fprintf(stderr,
                 "lockstep-trainer: error: this build has no CUDA backend (it was built without the CUDA toolkit); "
                 "use --backend cpu\n");
    return 2;
  }
  installSignalHandlers();

  if (options.nproc > 0) {
    auto code = runLocalRanks(options, withoutNproc(args), g_stopSignal);
    if (!code) {
      std::fprintf(stderr, "lockstep-trainer: error: %s\n", code.error().message.c_str());
      return exitCodeFor(code.error());
    }
    return *code;
  }

  auto env = distEnvFromEnvironment();
  if (!env) {
    std::fprintf(stderr, "lockstep-trainer: error: %s\n", env.error().message.c_str());
    return 2;
  }
  const unsigned rank = env->rank;
  auto runner = std::make_unique<RankRunner>(options, *env, g_stopSignal);
  auto result = runner->run();
  if (!result) {
    std::fprintf(stderr, "lockstep-trainer: rank %u: error: %s\n", rank, result.error().message.c_str());
    const int code = g_stopSignal.load() != 0 ? 128 + g_stopSignal.load() : exitCodeFor(result.error());
    if (runner->commBroken()) {
      // The communication thread may be blocked in a failed collective; tearing down would wait
      // for its timeout. Everything worth keeping (metrics lines, checkpoints) is already on disk.
      std::fflush(nullptr);
      runner->waitForPeersToLeave(std::chrono::seconds(3));
      ::_exit(code);
    }
    return code;
  }
  const RunSummary& s = *result;
  if (s.stoppedBySignal != 0) {
    if (rank == 0) std::fprintf(stderr, "[lockstep] stopped by signal %d after step %llu\n", s.stoppedBySignal,
                                static_cast<unsigned long long>(s.stepsDone));
    return 128 + s.stoppedBySignal;
  }
  if (rank == 0 && !options.quiet) {
    std::fprintf(stderr,
                 "[lockstep] done: steps %llu..%llu in %.1f s, %.0f samples/s, final loss %.4f, exposed communication "
                 "%.1f%% of step time%s\n",
                 static_cast<unsigned long long>(s.firstStep + 1), static_cast<unsigned long long>(s.stepsDone),
                 s.seconds, s.samplesPerSecond, s.finalLoss, 100.0 * s.exposedCommFraction,
                 s.droppedReports ? (", " + std::to_string(s.droppedReports) + " reports dropped").c_str() : "");
  }
  return 0;
}
