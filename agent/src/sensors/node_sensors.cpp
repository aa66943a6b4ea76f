#include "sensors/node_sensors.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "base/host.h"
#include "lockstep/common/clock.h"
#include "sensors/netdev.h"

namespace lockstep::agent {
namespace {

constexpr std::size_t kMaxQueued = 100000;  // the loop is stuck: drop the oldest rather than grow

}  // namespace

NodeSensors::NodeSensors(const Nvml* nvml, std::string node, std::uint32_t hz)
    : nvml_(nvml), node_(std::move(node)), hz_(hz), wakeFd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  thread_ = std::thread([this] { run(); });
}

NodeSensors::~NodeSensors() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  stopCv_.notify_all();
  thread_.join();
  ::close(wakeFd_);
}

std::vector<NodeSensors::Sample> NodeSensors::take() {
  std::uint64_t count = 0;
  [[maybe_unused]] ssize_t n = ::read(wakeFd_, &count, sizeof count);
  std::lock_guard lock(mutex_);
  return std::exchange(queue_, {});
}

void NodeSensors::track(std::vector<TrackedRank> ranks, std::map<std::uint32_t, std::string> gpuJobs) {
  std::lock_guard lock(mutex_);
  ranks_ = std::move(ranks);
  gpuJobs_ = std::move(gpuJobs);
}

void NodeSensors::run() {
  const auto period = std::chrono::microseconds(1'000'000 / hz_);
  auto next = std::chrono::steady_clock::now();
  std::uint32_t tick = 0;
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    sampleOnce(tick++ % hz_ == 0);
    lock.lock();
    next += period;
    if (stopCv_.wait_until(lock, next, [this] { return stop_; })) break;
    if (std::chrono::steady_clock::now() > next + period) next = std::chrono::steady_clock::now();  // fell behind
  }
}

void NodeSensors::sampleOnce(bool withEnergy) {
  std::vector<TrackedRank> ranks;
  std::map<std::uint32_t, std::string> gpuJobs;
  {
    std::lock_guard lock(mutex_);
    ranks = ranks_;
    gpuJobs = gpuJobs_;
  }
  std::vector<Sample> samples;
  if (nvml_ != nullptr) {
    for (const auto& gpu : nvml_->gpus()) {
      const GpuReading r = nvml_->read(gpu.index, withEnergy);
      GpuSample s;
      s.node = node_;
      s.gpuIndex = gpu.index;
      s.timeUnixUs = unixMicrosNow();
      if (auto it = gpuJobs.find(gpu.index); it != gpuJobs.end()) s.jobId = it->second;
      s.utilizationPct = r.utilizationPct;
      s.memoryUsedBytes = r.memoryUsedBytes;
      s.powerMilliwatts = r.powerMilliwatts;
      s.energyMillijoules = r.energyMillijoules;
      s.temperatureC = r.temperatureC;
      s.smClockMhz = r.smClockMhz;
      samples.emplace_back(std::move(s));
    }
  }
  const auto now = std::chrono::steady_clock::now();
  std::map<pid_t, CpuMark> seen;
  for (const auto& rank : ranks) {
    const auto stat = readProcStat(rank.pid);
    if (!stat) continue;
    ProcessSample s;
    s.jobId = rank.jobId;
    s.rank = rank.rank;
    s.pid = static_cast<std::uint32_t>(rank.pid);
    s.timeUnixUs = unixMicrosNow();
    s.rssBytes = stat->rssBytes;
    // CPU % needs two readings of the same process; the first sample of a rank has none.
    if (auto it = cpu_.find(rank.pid); it != cpu_.end() && it->second.startTicks == stat->startTicks) {
      const double seconds = std::chrono::duration<double>(now - it->second.at).count();
      if (seconds > 0 && stat->cpuTicks >= it->second.ticks) {
        s.cpuPct = static_cast<float>(100.0 * static_cast<double>(stat->cpuTicks - it->second.ticks) /
                                      static_cast<double>(clockTicksPerSecond()) / seconds);
      }
    }
    seen[rank.pid] = {stat->cpuTicks, stat->startTicks, now};
    samples.emplace_back(std::move(s));
  }
  cpu_ = std::move(seen);
  for (auto& net : readInterfaces(node_)) samples.emplace_back(std::move(net));
  if (samples.empty()) return;
  {
    std::lock_guard lock(mutex_);
    for (auto& s : samples) queue_.push_back(std::move(s));
    if (queue_.size() > kMaxQueued) queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(queue_.size() - kMaxQueued));
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wakeFd_, &one, sizeof one);
}

}  // namespace lockstep::agent
