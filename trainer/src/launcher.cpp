#include "launcher.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <optional>
#include <thread>

#include "dataset.h"
#include "lockstep/common/npy.h"
#include "lockstep/common/process.h"
#include "lockstep/common/store.h"

namespace lockstep::trainer {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Result<std::string> selfExecutable() {
  char path[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return errnoError("cannot find this program's path (/proc/self/exe)", errno);
  return std::string(path, static_cast<size_t>(n));
}

}  // namespace

Result<int> runLocalRanks(const jobflags::TrainerOptions& options, const std::vector<std::string>& rankArgs,
                          const std::atomic<int>& stopSignal) {
  const JobSpec& spec = options.spec;
  const std::uint32_t nproc = options.nproc;
  // Catch bad data once, here, rather than N times in the ranks.
  if (const auto* npy = std::get_if<NpyDataset>(&spec.dataset)) LOCKSTEP_TRY(checkNpyDataset(npy->featuresPath, npy->labelsPath, spec.layers.front()));
  if (!options.metricsOut.empty() && !options.resume) {
    const int fd = ::open(options.metricsOut.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errnoError("--metrics-out: cannot create " + options.metricsOut, errno);
    ::close(fd);
  }
  StoreServerOptions storeOptions;
  storeOptions.secret = newStoreSecret();  // the ranks get it in their environment, never argv
  storeOptions.worldSize = nproc;
  LOCKSTEP_ASSIGN_OR_RETURN(auto store, StoreServer::start("127.0.0.1", 0, storeOptions));
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string exe, selfExecutable());
  const std::uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::uint32_t threads = options.threads > 0 ? options.threads : std::max(1u, cores / nproc);

  std::vector<pid_t> running;
  std::vector<pid_t> pidOfRank(nproc, -1);
  auto stopAll = [&](int signal) {
    for (pid_t pid : running) ::kill(pid, signal);
  };
  for (std::uint32_t rank = 0; rank < nproc; ++rank) {
    SpawnOptions spawn;
    spawn.argv.push_back(exe);
    spawn.argv.insert(spawn.argv.end(), rankArgs.begin(), rankArgs.end());
    spawn.env = {{"RANK", std::to_string(rank)},
                 {"WORLD_SIZE", std::to_string(nproc)},
                 {"LOCAL_RANK", std::to_string(rank)},
                 {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
                 {"MASTER_ADDR", "127.0.0.1"},
                 {"MASTER_PORT", std::to_string(store->port())},
                 {"LOCKSTEP_AGENT_STORE", "1"},
                 {"LOCKSTEP_STORE_SECRET", storeOptions.secret},
                 {"OPENBLAS_NUM_THREADS", std::to_string(threads)}};
    spawn.parentDeathSignal = SIGTERM;
    auto pid = spawnProcess(spawn);
    if (!pid) {
      stopAll(SIGKILL);
      for (pid_t p : running) (void)waitProcess(p, milliseconds(5000));
      return pid.error().withContext("cannot start rank " + std::to_string(rank));
    }
    running.push_back(*pid);
    pidOfRank[rank] = *pid;
  }

  // After a failure or a stop request: SIGTERM the ranks still running at `termAt`, SIGKILL at `killAt`.
  std::optional<ExitStatus> firstFailure;
  std::optional<Clock::time_point> termAt, killAt;
  bool forwardedStop = false;
  while (!running.empty()) {
    const auto now = Clock::now();
    if (stopSignal.load() != 0 && !forwardedStop) {
      forwardedStop = true;
      // Ranks finish their step together, checkpoint if asked, and leave.
      termAt = now;
      killAt = now + std::chrono::seconds(spec.timeoutS) + std::chrono::seconds(10);
    }
    if (termAt && now >= *termAt) {
      stopAll(SIGTERM);
      termAt.reset();
    }
    if (killAt && now >= *killAt) {
      std::fprintf(stderr, "[lockstep] ranks still running after the grace period: killing them\n");
      stopAll(SIGKILL);
      killAt.reset();
    }
    LOCKSTEP_ASSIGN_OR_RETURN(auto exited, waitAnyProcess(running, milliseconds(100)));
    if (!exited) continue;
    const auto [pid, status] = *exited;
    std::erase(running, pid);
    const auto rank = static_cast<int>(std::find(pidOfRank.begin(), pidOfRank.end(), pid) - pidOfRank.begin());
    store->noteRankExit(rank, "exited with " + status.describe());
    if (!status.success() && !firstFailure && stopSignal.load() == 0) {
      firstFailure = status;
      std::fprintf(stderr, "[lockstep] rank %d exited with %s\n", rank, status.describe().c_str());
      // Fail fast. A lost peer breaks the others' sockets at once, so they can say what they saw
      // within a few seconds; a rank still waiting in the rendezvous would wait out its timeout.
      termAt = Clock::now() + std::chrono::seconds(5);
      killAt = *termAt + std::chrono::seconds(10);
    }
  }
  if (stopSignal.load() != 0) return 128 + stopSignal.load();
  return firstFailure ? firstFailure->shellCode() : 0;
}

}  // namespace lockstep::trainer
