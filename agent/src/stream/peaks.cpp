#include "stream/peaks.h"

#include "lockstep/common/clock.h"
#include "lockstep/kpi/peaks.h"
#include "lockstep/present/present.h"
#include "lockstep/protocol/names.h"

namespace lockstep::agent {
namespace {

constexpr std::size_t kMaxKnown = 65536;  // ranks' peaks kept; beyond, all forgotten and found again
constexpr std::size_t kMaxJobsSaid = 1024;
constexpr std::size_t kMaxSaidPerJob = 16;  // a job whose parts differ in more ways is told no more

}  // namespace

Peaks::Peaks(std::string node, std::vector<GpuInfo> gpus, std::chrono::milliseconds resay)
    : node_(std::move(node)), gpus_(std::move(gpus)), resay_(resay) {}

void Peaks::setCpu(CpuPeak cpu) {
  cpu_ = std::move(cpu);
  known_.clear();  // CPU ranks' peaks change; their new basis is said again
  said_.clear();
}

std::optional<JobEvent> Peaks::stamp(StepReport& report, const Hardware& hardware) {
  report.peakFlops.reset();
  if (!report.flops) return std::nullopt;  // a job that counts no FLOPs has no MFU to take
  if (known_.size() >= kMaxKnown) known_.clear();
  const auto key = std::make_tuple(report.jobId, report.rank, report.attempt,
                                   report.precision ? static_cast<int>(*report.precision) : 0);
  auto it = known_.find(key);
  if (it == known_.end()) {
    const auto computesOn = hardware();
    if (!computesOn) return std::nullopt;
    it = known_.emplace(key, peakOf(*computesOn, report.precision)).first;
  }
  report.peakFlops = it->second.flops;
  if (said_.size() >= kMaxJobsSaid && !said_.contains(report.jobId)) said_.clear();
  const auto now = std::chrono::steady_clock::now();
  Said& said = said_.try_emplace(report.jobId, Said{{}, now}).first->second;
  if (now - said.at >= resay_) said = Said{{}, now};  // time to say it again
  if (said.bases.size() >= kMaxSaidPerJob || !said.bases.insert(it->second.basis).second) return std::nullopt;
  JobEvent event;
  event.jobId = report.jobId;
  event.kind = JobEventKind::kPeak;
  event.rank = report.rank;
  event.timeUnixUs = unixMicrosNow();
  event.message = it->second.basis;
  return event;
}

Peaks::Peak Peaks::peakOf(const RankHardware& hardware, std::optional<Precision> precision) const {
  return hardware.gpuIndex ? gpuPeakOf(*hardware.gpuIndex, precision) : cpuPeakOf(hardware.cores, precision);
}

Peaks::Peak Peaks::gpuPeakOf(std::uint32_t gpu, std::optional<Precision> precision) const {
  std::string name = "GPU " + std::to_string(gpu);
  for (const auto& g : gpus_) {
    if (g.index == gpu) name = g.name;
  }
  if (!precision) {
    return {std::nullopt, "no peak for " + name + " on " + node_ +
                              ": the rank's reports do not say the precision of its math (lockstep.watch(model, "
                              "precision=...)); MFU unknown"};
  }
  const std::string at = std::string(nameOf(*precision));
  const auto peak = kpi::gpuPeak(name, *precision);
  if (!peak) {
    return {std::nullopt, "no peak for " + name + " at " + at + " on " + node_ +
                              ": not in Lockstep's table of datasheet peaks; MFU unknown"};
  }
  return {peak->flops, present::flopsRate(peak->flops) + " per GPU on " + node_ + ": " + name + " at " + at + " (" +
                           std::string(peak->model) + " datasheet, dense)"};
}

Peaks::Peak Peaks::cpuPeakOf(std::uint32_t cores, std::optional<Precision> precision) const {
  if (precision && *precision != Precision::kFp32) {
    return {std::nullopt, "no CPU peak for " + std::string(nameOf(*precision)) + " on " + node_ +
                              ": only fp32 sgemm is measured; MFU unknown"};
  }
  if (!cpu_.perCore) return {std::nullopt, "no CPU peak on " + node_ + ": " + cpu_.basis + "; MFU unknown"};
  const double flops = *cpu_.perCore * cores;
  return {flops, std::to_string(cores) + (cores == 1 ? " core × " : " cores × ") + present::flopsRate(cpu_.perCore) +
                     " = " + present::flopsRate(flops) + " per rank, fp32: " + cpu_.basis};
}

}  // namespace lockstep::agent
