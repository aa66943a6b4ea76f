#include "sensors/nvml.h"

#include <dlfcn.h>

namespace lockstep::agent {
namespace {

// From nvml.h (NVIDIA), the subset used here.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kSuccess = 0;
constexpr int kTemperatureGpu = 0;
constexpr int kClockSm = 1;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

template <class Fn>
Fn symbol(void* handle, std::initializer_list<const char*> names) {
  // Newest version first: the unversioned names are the oldest ABI.
  for (const char* name : names) {
    if (void* p = ::dlsym(handle, name)) return reinterpret_cast<Fn>(p);
  }
  return nullptr;
}

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*errorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*deviceCount)(unsigned int*) = nullptr;
  nvmlReturn_t (*handleByIndex)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*memoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  // Optional: a GPU or driver without them still reports the rest.
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*energy)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*) = nullptr;

  std::string describe(nvmlReturn_t rc) const {
    const char* text = errorString ? errorString(rc) : nullptr;
    return text ? text : "NVML error " + std::to_string(rc);
  }
};

std::unique_ptr<Nvml> Nvml::load(const std::string& library, std::string* why) {
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    *why = "NVML not found (" + library + "): a CPU-only node";
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  api->init = symbol<decltype(api->init)>(handle, {"nvmlInit_v2", "nvmlInit"});
  api->shutdown = symbol<decltype(api->shutdown)>(handle, {"nvmlShutdown"});
  api->errorString = symbol<decltype(api->errorString)>(handle, {"nvmlErrorString"});
  api->deviceCount = symbol<decltype(api->deviceCount)>(handle, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
  api->handleByIndex =
      symbol<decltype(api->handleByIndex)>(handle, {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  api->name = symbol<decltype(api->name)>(handle, {"nvmlDeviceGetName"});
  api->uuid = symbol<decltype(api->uuid)>(handle, {"nvmlDeviceGetUUID"});
  api->memoryInfo = symbol<decltype(api->memoryInfo)>(handle, {"nvmlDeviceGetMemoryInfo"});
  api->utilization = symbol<decltype(api->utilization)>(handle, {"nvmlDeviceGetUtilizationRates"});
  api->power = symbol<decltype(api->power)>(handle, {"nvmlDeviceGetPowerUsage"});
  api->energy = symbol<decltype(api->energy)>(handle, {"nvmlDeviceGetTotalEnergyConsumption"});
  api->temperature = symbol<decltype(api->temperature)>(handle, {"nvmlDeviceGetTemperature"});
  api->clock = symbol<decltype(api->clock)>(handle, {"nvmlDeviceGetClockInfo"});
  if (!api->init || !api->shutdown || !api->deviceCount || !api->handleByIndex || !api->name || !api->uuid ||
      !api->memoryInfo) {
    ::dlclose(handle);
    *why = library + " lacks required NVML functions (too old a driver?): a CPU-only node";
    return nullptr;
  }
  if (const nvmlReturn_t rc = api->init(); rc != kSuccess) {
    *why = "NVML did not start (" + api->describe(rc) + "): a CPU-only node";
    ::dlclose(handle);
    return nullptr;
  }
  std::unique_ptr<Nvml> nvml(new Nvml(handle, std::move(api)));
  unsigned int count = 0;
  if (const nvmlReturn_t rc = nvml->api_->deviceCount(&count); rc != kSuccess) {
    *why = "NVML cannot count GPUs (" + nvml->api_->describe(rc) + ")";
    return nvml;
  }
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t device = nullptr;
    if (nvml->api_->handleByIndex(i, &device) != kSuccess) continue;
    GpuInfo info;
    info.index = i;
    char text[96] = {};
    if (nvml->api_->name(device, text, sizeof text) == kSuccess) info.name = text;
    char uuid[96] = {};
    if (nvml->api_->uuid(device, uuid, sizeof uuid) == kSuccess) info.uuid = uuid;
    nvmlMemory_t memory{};
    if (nvml->api_->memoryInfo(device, &memory) == kSuccess) info.memoryTotalBytes = memory.total;
    nvml->devices_.resize(i + 1, nullptr);
    nvml->devices_[i] = device;
    nvml->gpus_.push_back(std::move(info));
  }
  why->clear();
  return nvml;
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api) : handle_(handle), api_(std::move(api)) {}

Nvml::~Nvml() {
  api_->shutdown();
  ::dlclose(handle_);
}

GpuReading Nvml::read(std::uint32_t index, bool withEnergy) const {
  GpuReading r;
  if (index >= devices_.size() || devices_[index] == nullptr) return r;
  nvmlDevice_t device = devices_[index];
  nvmlUtilization_t utilization{};
  if (api_->utilization && api_->utilization(device, &utilization) == kSuccess) {
    r.utilizationPct = static_cast<float>(utilization.gpu);
  }
  nvmlMemory_t memory{};
  if (api_->memoryInfo(device, &memory) == kSuccess) r.memoryUsedBytes = memory.used;
  unsigned int value = 0;
  if (api_->power && api_->power(device, &value) == kSuccess) r.powerMilliwatts = value;
  if (api_->temperature && api_->temperature(device, kTemperatureGpu, &value) == kSuccess) {
    r.temperatureC = static_cast<std::int32_t>(value);
  }
  if (api_->clock && api_->clock(device, kClockSm, &value) == kSuccess) r.smClockMhz = value;
  unsigned long long energy = 0;
  if (withEnergy && api_->energy && api_->energy(device, &energy) == kSuccess) r.energyMillijoules = energy;
  return r;
}

}  // namespace lockstep::agent
