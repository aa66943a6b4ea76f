#include "sensors/cpu_peak.h"

#include <sched.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "lockstep/common/files.h"
#include "lockstep/common/process.h"
#include "lockstep/present/present.h"

namespace lockstep::agent {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// The trainer measures for a second; starting it and its threads is the rest.
constexpr std::chrono::seconds kMeasureTimeout{60};

// What makes a kept figure this machine's: its CPU and how many cores the agent may use.
struct Machine {
  std::string cpu;
  unsigned cores = 0;
};

Machine thisMachine() {
  Machine m;
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      m.cpu = trim(line.substr(line.find(':') + 1));
      break;
    }
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) m.cores = static_cast<unsigned>(CPU_COUNT(&set));
  return m;
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &utc);
  return text;
}

std::string measuredBasis(const std::string& node, const Json& kept) {
  return "one core's sgemm measured on " + node + " on " + kept.value("measured", std::string("?")) + " (" +
         kept.value("corename", std::string("?")) + " kernels, " + std::to_string(kept.value("cores", 0u)) +
         " cores at once)";
}

// The trainer's measurement: the peak, or why there is none, and what to keep of it.
CpuPeakMeter::Measured measure(const CpuPeakSettings& s) {
  const auto run = runCommand({s.trainer, "--gemm-peak"}, kMeasureTimeout, 4096);
  if (!run) return {{std::nullopt, "the sgemm measurement failed on " + s.node + ": " + run.error().message}, ""};
  Json out = Json::parse(run->out, nullptr, false);
  if (!run->status.success() || !out.is_object() || !out.contains("flops_per_core") ||
      !out["flops_per_core"].is_number() || !(out["flops_per_core"].get<double>() > 0)) {
    return {{std::nullopt, "the sgemm measurement failed on " + s.node + ": " + s.trainer + " --gemm-peak ended with " +
                               run->status.describe() + " and printed '" + trim(run->out + run->err).substr(0, 200) + "'"},
            ""};
  }
  const Machine m = thisMachine();
  out["cpu"] = m.cpu;
  out["cores"] = m.cores;
  out["measured"] = today();
  return {{out["flops_per_core"].get<double>(), measuredBasis(s.node, out)}, out.dump() + "\n"};
}

}  // namespace

CpuPeakMeter::CpuPeakMeter(CpuPeakSettings settings, Log& log) : settings_(std::move(settings)), log_(log) {
  if (settings_.gflops) {
    peak_ = {*settings_.gflops * 1e9, "one core's " + present::flopsRate(*settings_.gflops * 1e9) + " as --cpu-peak sets on " + settings_.node};
  } else if (settings_.off) {
    peak_ = {std::nullopt, "cpu-peak = off on " + settings_.node};
  } else if (auto found = kept()) {
    peak_ = *found;
  } else {
    peak_ = {std::nullopt, "not yet measured on " + settings_.node};
    needed_ = true;
  }
}

std::string CpuPeakMeter::keptPath() const { return (fs::path(settings_.stateDir) / "cpu-peak.json").string(); }

std::optional<CpuPeak> CpuPeakMeter::kept() const {
  auto text = readFile(keptPath(), 4096);
  if (!text) return std::nullopt;
  const Json kept = Json::parse(*text, nullptr, false);
  const Machine m = thisMachine();
  if (!kept.is_object() || kept.value("cpu", std::string()) != m.cpu || kept.value("cores", 0u) != m.cores) return std::nullopt;
  const double perCore = kept.value("flops_per_core", 0.0);
  if (!(perCore > 0)) return std::nullopt;
  return CpuPeak{perCore, measuredBasis(settings_.node, kept)};
}

void CpuPeakMeter::tick(bool jobsRunning) {
  if (measuring_) {
    disturbed_ = disturbed_ || jobsRunning;
    return;
  }
  if (!needed_ || jobsRunning) return;
  const auto started = running_.submit(1, [s = settings_] { return measure(s); },
                                       Error{ErrorCode::kResourceExhausted, "busy"}, "measure the CPU's sgemm peak");
  if (!started) {
    log_.info(started.error().message);
    return;
  }
  needed_ = false;
  measuring_ = true;
  disturbed_ = false;
  log_.info("measuring one core's sgemm peak on every core at once (" + settings_.trainer + " --gemm-peak), once");
}

std::optional<CpuPeak> CpuPeakMeter::take() {
  std::optional<Measured> done;
  for (auto& d : running_.take()) done = std::move(d.result);
  if (!done) return std::nullopt;
  measuring_ = false;
  if (disturbed_) {
    // A job's ranks shared the cores: the figure is low, and the job was slowed. Measured again
    // once the node is idle.
    needed_ = true;
    log_.info("a job ran while the CPU's sgemm peak was measured: the figure is dropped and measured again when idle");
    return std::nullopt;
  }
  if (!done->keep.empty()) (void)writeFileAtomic(keptPath(), done->keep, 0644);  // kept or not, it holds for this run
  const std::optional<CpuPeak> out = done->peak;
  peak_ = *out;
  log_.info(peak_.perCore ? "CPU peak: " + present::flopsRate(peak_.perCore) + " per core, " + peak_.basis
                          : "CPU peak unknown: " + peak_.basis);
  return out;
}

}  // namespace lockstep::agent
