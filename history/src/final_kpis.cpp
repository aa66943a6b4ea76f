#include "final_kpis.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "sqlite.h"

namespace lockstep::history::detail {
namespace {

// final_kpis' columns (schema.cpp), in one place: the INSERT and the SELECT are built from it.
constexpr std::string_view kColumns[] = {
    "job_id",           "computed_us",   "world_size",        "attempts",         "step",
    "total_steps",      "elapsed_s",     "end_samples_per_s", "comm_overhead",    "scaling_efficiency",
    "scaling_basis",    "gpu_utilization_pct", "load_imbalance", "slowest_rank",  "slowest_cause",
    "last_global_loss", "smoothed_loss", "time_to_convergence_s", "energy_kwh",   "gpu_hours",
    "core_hours",       "cost",          "cost_complete",     "missing_json",     "total_samples",
    "total_tokens",     "bus_bandwidth", "waiting_share",     "straggler_share",  "waiting_cost",
    "straggler_cost",   "waiting_gpu_hours", "straggler_gpu_hours", "bytes_reduced_per_step", "samples_per_rank_step",
    "mean_busy_us",     "mean_exposed_us", "mean_step_us",  "param_bytes_per_rank", "grad_bytes_per_rank",
    "optimizer_state_bytes_per_rank", "staleness_mean", "staleness_p99", "model_flops_per_second", "peak_flops",
    "model_flops_utilization", "flops_basis", "peak_basis"};

// An empty text is stored as NULL: not known.
std::optional<std::string> textOrNull(const std::string& text) {
  return text.empty() ? std::nullopt : std::optional(text);
}

std::string joined(std::string_view prefix) {
  std::string out;
  for (const auto name : kColumns) out += (out.empty() ? "" : ", ") + std::string(prefix) + std::string(name);
  return out;
}

// Reads the named columns of one row.
class Row {
 public:
  explicit Row(const Statement& s) : s_(s) {}
  int at(std::string_view name) const { return s_.column(name); }
  std::int64_t i64(std::string_view name) const { return s_.i64(at(name)); }
  double real(std::string_view name) const { return s_.real(at(name)); }
  std::optional<double> maybeReal(std::string_view name) const { return s_.maybeReal(at(name)); }
  template <class T>
  std::optional<T> maybeInt(std::string_view name) const {
    return s_.maybeInt<T>(at(name));
  }
  std::string text(std::string_view name) const { return s_.text(at(name)); }

 private:
  const Statement& s_;
};

}  // namespace

Result<void> writeFinalKpis(sqlite3* db, const std::string& jobId, const kpi::JobKpis& k, std::int64_t computedUnixUs) {
  auto missing = nlohmann::json::array();
  for (const auto& m : k.missing) missing.push_back(m);
  const std::string sql = "INSERT OR REPLACE INTO final_kpis (" + joined("") + ") VALUES (" + joined(":") + ")";
  LOCKSTEP_ASSIGN_OR_RETURN(auto insert, Statement::prepare(db, sql));
  insert.bind(":job_id", jobId).bind(":computed_us", computedUnixUs).bind(":world_size", k.worldSize);
  insert.bind(":attempts", k.attempts).bind(":step", k.step).bind(":total_steps", k.totalSteps);
  insert.bind(":elapsed_s", k.elapsedSeconds).bind(":end_samples_per_s", k.samplesPerSecond);
  insert.bind(":comm_overhead", k.commOverhead).bind(":scaling_efficiency", k.scalingEfficiency);
  insert.bind(":scaling_basis", static_cast<std::int64_t>(k.scalingBasis));
  insert.bind(":gpu_utilization_pct", k.gpuUtilizationPct).bind(":load_imbalance", k.loadImbalance);
  insert.bind(":slowest_rank", k.slowestRank).bind(":slowest_cause", static_cast<std::int64_t>(k.slowestCause));
  insert.bind(":last_global_loss", k.lastGlobalLoss).bind(":smoothed_loss", k.smoothedLoss);
  insert.bind(":time_to_convergence_s", k.timeToConvergenceSeconds).bind(":energy_kwh", k.energyKwh);
  insert.bind(":gpu_hours", k.gpuHours).bind(":core_hours", k.coreHours).bind(":cost", k.costSoFar);
  insert.bind(":cost_complete", std::int64_t{k.costComplete}).bind(":missing_json", missing.dump());
  insert.bind(":total_samples", k.totalSamples).bind(":total_tokens", k.totalTokens);
  insert.bind(":bus_bandwidth", k.busBandwidth).bind(":waiting_share", k.waitingShare);
  insert.bind(":straggler_share", k.stragglerShare).bind(":waiting_cost", k.waitingCost);
  insert.bind(":straggler_cost", k.stragglerCost).bind(":waiting_gpu_hours", k.waitingGpuHours);
  insert.bind(":straggler_gpu_hours", k.stragglerGpuHours).bind(":bytes_reduced_per_step", k.bytesReducedPerStep);
  insert.bind(":samples_per_rank_step", k.samplesPerRankStep).bind(":mean_busy_us", k.meanBusyUs);
  insert.bind(":mean_exposed_us", k.meanExposedUs).bind(":mean_step_us", k.meanStepUs);
  insert.bind(":param_bytes_per_rank", k.paramBytesPerRank).bind(":grad_bytes_per_rank", k.gradBytesPerRank);
  insert.bind(":optimizer_state_bytes_per_rank", k.optimizerStateBytesPerRank);
  insert.bind(":staleness_mean", k.stalenessMean).bind(":staleness_p99", k.stalenessP99);
  insert.bind(":model_flops_per_second", k.modelFlopsPerSecond).bind(":peak_flops", k.peakFlops);
  insert.bind(":model_flops_utilization", k.mfu).bind(":flops_basis", textOrNull(k.flopsBasis));
  insert.bind(":peak_basis", textOrNull(k.peakBasis));
  return insert.run();
}

Result<std::optional<kpi::JobKpis>> readFinalKpis(sqlite3* db, const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto s, Statement::prepare(db, "SELECT " + joined("") + " FROM final_kpis WHERE job_id = ?1"));
  s.bind(1, jobId);
  LOCKSTEP_ASSIGN_OR_RETURN(bool found, s.step());
  if (!found) return std::optional<kpi::JobKpis>();
  const Row row(s);
  kpi::JobKpis k;
  k.jobId = jobId;
  k.worldSize = static_cast<std::uint32_t>(row.i64("world_size"));
  k.attempts = static_cast<std::uint32_t>(row.i64("attempts"));
  k.step = static_cast<std::uint64_t>(row.i64("step"));
  k.totalSteps = static_cast<std::uint64_t>(row.i64("total_steps"));
  k.elapsedSeconds = row.real("elapsed_s");
  k.samplesPerSecond = row.maybeReal("end_samples_per_s");
  k.commOverhead = row.maybeReal("comm_overhead");
  k.scalingEfficiency = row.maybeReal("scaling_efficiency");
  k.scalingBasis = static_cast<kpi::ScalingBasis>(row.i64("scaling_basis"));
  k.gpuUtilizationPct = row.maybeReal("gpu_utilization_pct");
  k.loadImbalance = row.maybeReal("load_imbalance");
  k.slowestRank = row.maybeInt<std::uint32_t>("slowest_rank");
  k.slowestCause = static_cast<kpi::SlowCause>(row.i64("slowest_cause"));
  k.lastGlobalLoss = row.maybeReal("last_global_loss");
  k.smoothedLoss = row.maybeReal("smoothed_loss");
  k.timeToConvergenceSeconds = row.maybeReal("time_to_convergence_s");
  k.energyKwh = row.maybeReal("energy_kwh");
  k.gpuHours = row.maybeReal("gpu_hours");
  k.coreHours = row.maybeReal("core_hours");
  k.costSoFar = row.maybeReal("cost");
  k.costProjected = k.costSoFar;
  k.costComplete = row.i64("cost_complete") != 0;
  k.busBandwidth = row.maybeReal("bus_bandwidth");
  k.waitingShare = row.maybeReal("waiting_share");
  k.stragglerShare = row.maybeReal("straggler_share");
  k.waitingCost = row.maybeReal("waiting_cost");
  k.stragglerCost = row.maybeReal("straggler_cost");
  k.waitingGpuHours = row.maybeReal("waiting_gpu_hours");
  k.stragglerGpuHours = row.maybeReal("straggler_gpu_hours");
  k.bytesReducedPerStep = row.maybeReal("bytes_reduced_per_step");
  k.samplesPerRankStep = row.maybeReal("samples_per_rank_step");
  k.meanBusyUs = row.maybeReal("mean_busy_us");
  k.meanExposedUs = row.maybeReal("mean_exposed_us");
  k.meanStepUs = row.maybeReal("mean_step_us");
  k.paramBytesPerRank = row.maybeReal("param_bytes_per_rank");
  k.gradBytesPerRank = row.maybeReal("grad_bytes_per_rank");
  k.optimizerStateBytesPerRank = row.maybeReal("optimizer_state_bytes_per_rank");
  k.stalenessMean = row.maybeReal("staleness_mean");
  k.stalenessP99 = row.maybeReal("staleness_p99");
  k.modelFlopsPerSecond = row.maybeReal("model_flops_per_second");
  k.peakFlops = row.maybeReal("peak_flops");
  k.mfu = row.maybeReal("model_flops_utilization");
  k.flopsBasis = row.text("flops_basis");
  k.peakBasis = row.text("peak_basis");
  const auto totalSamples = row.maybeInt<std::uint64_t>("total_samples");
  k.totalSamples = totalSamples.value_or(0);
  k.totalTokens = row.maybeInt<std::uint64_t>("total_tokens");
  if (k.elapsedSeconds > 0 && totalSamples) k.meanSamplesPerSecond = static_cast<double>(*totalSamples) / k.elapsedSeconds;
  const auto missing = nlohmann::json::parse(row.text("missing_json"), nullptr, false);
  if (missing.is_array()) {
    for (const auto& m : missing) {
      if (m.is_string()) k.missing.push_back(m.get<std::string>());
    }
  }
  return std::optional(std::move(k));
}

}  // namespace lockstep::history::detail
