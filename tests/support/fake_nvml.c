/* A stand-in for libnvidia-ml.so.1, for testing the agent's NVML loader on machines without a GPU:
 * two GPUs (LOCKSTEP_FAKE_NVML_GPUS says otherwise, for bench/agent_sampling.sh), the second without
 * power or energy readings. Only the loader is tested with it; real
 * NVML is checked on the GPU machine (bench/gpu/, issue 6). nvmlInit (v1) fails on purpose, so a
 * loader that does not prefer the _v2 symbols fails the test. */
#include <stdio.h>
#include <stdlib.h>

typedef void* nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
enum { OK = 0, NOT_SUPPORTED = 3, UNINITIALIZED = 1 };

int nvmlInit(void) { return UNINITIALIZED; }
int nvmlInit_v2(void) { return OK; }
int nvmlShutdown(void) { return OK; }
const char* nvmlErrorString(int rc) { return rc == NOT_SUPPORTED ? "Not Supported" : "Unknown Error"; }
static unsigned int gpus(void) {
  const char* n = getenv("LOCKSTEP_FAKE_NVML_GPUS");
  const int v = n ? atoi(n) : 2;
  return v > 0 && v <= 64 ? (unsigned int)v : 2;
}
int nvmlDeviceGetCount_v2(unsigned int* count) { *count = gpus(); return OK; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  *device = (void*)(unsigned long)(index + 1);
  return index < gpus() ? OK : NOT_SUPPORTED;
}
static unsigned int indexOf(nvmlDevice_t d) { return (unsigned int)((unsigned long)d - 1); }
int nvmlDeviceGetName(nvmlDevice_t d, char* name, unsigned int length) {
  snprintf(name, length, "Fake GPU %u", indexOf(d));
  return OK;
}
int nvmlDeviceGetUUID(nvmlDevice_t d, char* uuid, unsigned int length) {
  snprintf(uuid, length, "GPU-fake-%u", indexOf(d));
  return OK;
}
int nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t* m) {
  m->total = 80ull << 30;
  m->used = (indexOf(d) + 1ull) << 30;
  m->free = m->total - m->used;
  return OK;
}
int nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* u) {
  u->gpu = 50 + indexOf(d);
  u->memory = 10;
  return OK;
}
int nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int* mw) {
  if (indexOf(d) == 1) return NOT_SUPPORTED;
  *mw = 300000;
  return OK;
}
int nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long* mj) {
  if (indexOf(d) == 1) return NOT_SUPPORTED;
  *mj = 123456;
  return OK;
}
int nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int* c) {
  (void)d;
  (void)sensor;
  *c = 60;
  return OK;
}
int nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int* mhz) {
  (void)d;
  (void)type;
  *mhz = 1980;
  return OK;
}
