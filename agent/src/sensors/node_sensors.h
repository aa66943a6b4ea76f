#pragma once
// The node's sensors (not the trainer's batch sampler): GPUs (NVML), rank processes (/proc) and
// the node's network interfaces (netdev.h), sampled at a fixed rate on a thread of their own, so
// that slow NVML calls never hold the agent's event loop. The energy counter, which costs
// milliseconds per call on some drivers, is read once a second. Samples queue up until the loop
// takes them; an eventfd says when there are some.

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "jobs/jobs.h"
#include "sensors/nvml.h"

namespace lockstep::agent {

class NodeSensors {
 public:
  using Sample = std::variant<GpuSample, ProcessSample, NetSample>;

  NodeSensors(const Nvml* nvml, std::string node, std::uint32_t hz);
  ~NodeSensors();
  NodeSensors(const NodeSensors&) = delete;
  NodeSensors& operator=(const NodeSensors&) = delete;

  // Readable when samples are waiting.
  int wakeFd() const { return wakeFd_; }
  std::vector<Sample> take();

  // What to sample: the running ranks and which job holds each GPU. From the event loop.
  void track(std::vector<TrackedRank> ranks, std::map<std::uint32_t, std::string> gpuJobs);

 private:
  void run();
  void sampleOnce(bool withEnergy);

  const Nvml* nvml_;
  const std::string node_;
  const std::uint32_t hz_;
  int wakeFd_;
  std::mutex mutex_;
  std::condition_variable stopCv_;
  bool stop_ = false;
  std::vector<TrackedRank> ranks_;
  std::map<std::uint32_t, std::string> gpuJobs_;
  std::vector<Sample> queue_;
  struct CpuMark {
    std::uint64_t ticks = 0;
    std::uint64_t startTicks = 0;
    std::chrono::steady_clock::time_point at;
  };
  std::map<pid_t, CpuMark> cpu_;  // the sensors' thread only
  std::thread thread_;
};

}  // namespace lockstep::agent
