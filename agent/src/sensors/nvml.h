#pragma once
// GPU facts and samples through NVML, loaded at run time with dlopen("libnvidia-ml.so.1") and
// never linked: a node without NVIDIA's driver is a CPU-only node, not an error. Only the types
// and functions used are declared here. A metric the GPU does not support stays unknown (an empty
// optional), never 0. Thread-safe after load (NVML is); one instance per process.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep::agent {

struct GpuReading {
  std::optional<float> utilizationPct;
  std::optional<std::uint64_t> memoryUsedBytes;
  std::optional<std::uint32_t> powerMilliwatts;
  std::optional<std::uint64_t> energyMillijoules;
  std::optional<std::int32_t> temperatureC;
  std::optional<std::uint32_t> smClockMhz;
};

class Nvml {
 public:
  // Loads and initialises NVML from `library` (the soname; the unversioned name can be the CUDA
  // toolkit's stub). Returns nullptr and says why in `why` when there is no usable NVML.
  static std::unique_ptr<Nvml> load(const std::string& library, std::string* why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  const std::vector<GpuInfo>& gpus() const { return gpus_; }
  // The fast metrics (utilization, memory, power, temperature, SM clock: microseconds each) and,
  // when asked, the energy counter, which costs milliseconds per call on some drivers.
  GpuReading read(std::uint32_t index, bool withEnergy) const;

  struct Api;

 private:
  Nvml(void* handle, std::unique_ptr<Api> api);
  void* handle_;
  std::unique_ptr<Api> api_;
  std::vector<void*> devices_;
  std::vector<GpuInfo> gpus_;
};

}  // namespace lockstep::agent
