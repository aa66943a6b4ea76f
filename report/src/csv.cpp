#include "csv.h"

#include <optional>
#include <type_traits>

#include "lockstep/protocol/records.h"
#include "lockstep/report/report.h"
#include "text.h"

namespace lockstep::report {
namespace detail {
namespace {

template <class T>
std::string cell(const std::optional<T>& value) {
  return value ? std::to_string(*value) : std::string();
}

}  // namespace

std::string csvField(std::string_view text) {
  if (text.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(text);
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
  return out;
}

Result<std::string> stepsCsv(const history::History& history, const std::string& jobId) {
  // An unmeasured value is an empty field, never 0.
  std::string out =
      "job_id,node,rank,attempt,step,epoch,world_size,samples,loss,global_loss,lr,data_us,compute_us,"
      "exposed_comm_us,allreduce_us,bytes_reduced,step_us,time_unix_us,tokens,optimizer_us\r\n";
  LOCKSTEP_TRY(history.forEachStep(jobId, [&](const StepReport& r, const std::string& node) {
    out += csvField(r.jobId) + ',' + csvField(node) + ',' + std::to_string(r.rank) + ',' + std::to_string(r.attempt) +
           ',' + std::to_string(r.step) + ',' + std::to_string(r.epoch) + ',' + std::to_string(r.worldSize) + ',' +
           std::to_string(r.samples) + ',' + shortest(r.loss) + ',' + (r.globalLoss ? shortest(*r.globalLoss) : "") +
           ',' + shortest(r.lr) + ',' + cell(r.dataTimeUs) + ',' + cell(r.computeTimeUs) + ',' +
           cell(r.exposedCommTimeUs) + ',' + cell(r.allreduceTimeUs) + ',' + cell(r.bytesReduced) + ',' +
           std::to_string(r.stepTimeUs) + ',' + std::to_string(r.timeUnixUs) + ',' + cell(r.tokens) + ',' +
           cell(r.optimizerTimeUs) + "\r\n";
  }));
  return out;
}

Result<std::string> gpuCsv(const history::History& history, const std::string& jobId) {
  std::string out =
      "job_id,node,gpu,time_unix_us,span_us,utilization_pct,memory_used_bytes,power_mw,energy_mj,temperature_c,"
      "sm_clock_mhz\r\n";
  LOCKSTEP_TRY(history.forEachGpuSample(jobId, [&](const history::StoredGpuSample& stored) {
    const GpuSample& s = stored.sample;
    out += csvField(jobId) + ',' + csvField(s.node) + ',' + std::to_string(s.gpuIndex) + ',' +
           std::to_string(s.timeUnixUs) + ',' + std::to_string(stored.spanUs) + ',' +
           (s.utilizationPct ? shortest(*s.utilizationPct) : "") + ',' + cell(s.memoryUsedBytes) + ',' +
           cell(s.powerMilliwatts) + ',' + cell(s.energyMillijoules) + ',' + cell(s.temperatureC) + ',' +
           cell(s.smClockMhz) + "\r\n";
  }));
  return out;
}

Result<std::string> networkCsv(const history::History& history, const std::string& jobId) {
  std::string out;
  records::forEachField<NetSample>([&](const auto& f) { out += (out.empty() ? "" : ",") + std::string(f.name); });
  out += "\r\n";
  LOCKSTEP_TRY(history.forEachNetSample(jobId, [&](const NetSample& s) {
    std::string row;
    records::forEachField<NetSample>([&](const auto& f) {
      using T = typename std::decay_t<decltype(f)>::Type;
      if (!row.empty()) row += ',';
      if constexpr (std::is_same_v<T, std::string>) {
        row += csvField(f.of(s));
      } else if constexpr (records::IsOptional<T>::value) {
        row += cell(f.of(s));
      } else {
        row += std::to_string(f.of(s));
      }
    });
    out += row + "\r\n";
  }));
  return out;
}

}  // namespace detail

namespace {
// report.csv -> report-SUFFIX.csv
std::string besideCsv(const std::string& path, const std::string& suffix) {
  const std::size_t slash = path.rfind('/');
  const std::size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) {
    return path + "-" + suffix + ".csv";
  }
  return path.substr(0, dot) + "-" + suffix + path.substr(dot);
}
}  // namespace

std::string gpuCsvPath(const std::string& path) { return besideCsv(path, "gpus"); }
std::string networkCsvPath(const std::string& path) { return besideCsv(path, "network"); }

}  // namespace lockstep::report
