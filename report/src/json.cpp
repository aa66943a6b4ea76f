// The JSON report (docs/report.schema.json). An unknown value is null, never 0.

#include <cmath>
#include <nlohmann/json.hpp>

#include "lockstep/alerts/urls.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/names.h"
#include "lockstep/report/report.h"
#include "network.h"
#include "projection.h"
#include "text.h"

namespace lockstep::report {
namespace {

using Json = nlohmann::ordered_json;

Json number(const std::optional<double>& value) {
  if (!value || !std::isfinite(*value)) return nullptr;
  return *value;
}

// Byte counts are whole numbers, though the KPI engine keeps them as doubles.
Json byteCount(const std::optional<double>& value) {
  if (!value || !std::isfinite(*value)) return nullptr;
  return static_cast<std::int64_t>(std::llround(*value));
}

Json number(double value) { return std::isfinite(value) ? Json(value) : Json(nullptr); }

// Words that may not have been said: null then, never "".
Json text(const std::string& value) { return value.empty() ? Json(nullptr) : Json(value); }

// Model FLOPs utilization (docs/kpis.md, MFU), a job's or a rank's: null where unknown.
template <class Kpis>
void addFlops(Json& j, const Kpis& k) {
  j["model_flops_utilization"] = number(k.mfu);
  j["model_flops_per_second"] = number(k.modelFlopsPerSecond);
  j["peak_flops"] = number(k.peakFlops);
}

template <class T>
Json optional(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}

// A time as both an ISO-8601 UTC string and microseconds; 0 (not yet) is null in both.
void time(Json& object, const std::string& name, std::int64_t unixUs) {
  object[name] = unixUs > 0 ? Json(detail::isoTime(unixUs)) : Json(nullptr);
  object[name + "_unix_us"] = unixUs > 0 ? Json(unixUs) : Json(nullptr);
}

std::string causeName(kpi::SlowCause cause) {
  switch (cause) {
    case kpi::SlowCause::kDataWait:
      return "data_wait";
    case kpi::SlowCause::kCompute:
      return "compute";
    case kpi::SlowCause::kCommunication:
      return "communication";
    case kpi::SlowCause::kUnknown:
      break;
  }
  return "unknown";
}

std::string basisName(kpi::ScalingBasis basis) {
  switch (basis) {
    case kpi::ScalingBasis::kCalibrated:
      return "calibrated";
    case kpi::ScalingBasis::kEstimatedFromCompute:
      return "estimated_from_compute";
    case kpi::ScalingBasis::kUnknown:
      break;
  }
  return "unknown";
}

Json points(const std::vector<kpi::Point>& series) {
  Json out = Json::array();
  for (const auto& p : series) {
    if (std::isfinite(p.x) && std::isfinite(p.y)) out.push_back(Json::array({p.x, p.y}));
  }
  return out;
}

Json jobJson(const history::JobRecord& job) {
  Json j;
  j["id"] = job.spec.jobId;
  j["name"] = job.spec.name;
  j["state"] = std::string(jobStateName(job.state));
  time(j, "started_at", job.startedUnixUs);
  time(j, "ended_at", job.endedUnixUs);
  j["message"] = job.message;
  j["slurm_job_id"] = job.spec.slurmJobId.empty() ? Json() : Json(job.spec.slurmJobId);
  j["owner"] = job.owner;
  j["spec"] = Json::parse(jobSpecToJson(job.spec), nullptr, /*allow_exceptions=*/false);
  if (j["spec"].is_discarded()) j["spec"] = Json::object();
  // A webhook's path and query are its secret, and a report is passed around (docs/alerts.md).
  if (j["spec"].contains("notify")) {
    for (auto& url : j["spec"]["notify"]) url = alerts::redactUrl(url.get<std::string>());
  }
  j["parts"] = Json::array();
  for (const auto& p : job.parts) {
    Json part;
    part["node"] = p.node;
    part["state"] = std::string(jobStateName(p.state));
    time(part, "started_at", p.startedUnixUs);
    time(part, "ended_at", p.endedUnixUs);
    part["message"] = p.message;
    part["owner"] = p.owner;
    j["parts"].push_back(std::move(part));
  }
  j["nodes"] = Json::array();
  for (const auto& n : job.nodes) {
    Json node;
    node["node"] = n.node;
    node["host"] = n.host;
    node["cpu_cores"] = n.cpuCores;
    node["memory_total_bytes"] = n.memoryTotalBytes;
    node["agent_version"] = n.agentVersion;
    node["gpus"] = Json::array();
    for (const auto& g : n.gpus) {
      node["gpus"].push_back(
          Json{{"index", g.index}, {"name", g.name}, {"uuid", g.uuid}, {"memory_total_bytes", g.memoryTotalBytes}});
    }
    j["nodes"].push_back(std::move(node));
  }
  return j;
}

const char* boundName(CommBound bound) {
  switch (bound) {
    case CommBound::kStraggler: return "straggler";
    case CommBound::kBandwidth: return "bandwidth";
    case CommBound::kLatency: return "latency";
    case CommBound::kUndetermined: break;
  }
  return "undetermined";
}

// Each kind of collective over the window (docs/kpis.md), in kCollectiveKindNames' order.
Json collectivesJson(const std::vector<kpi::CollectiveKpis>& kinds) {
  Json out = Json::array();
  for (const auto& c : kinds) {
    out.push_back(Json{{"kind", std::string(nameOf(c.kind))},
                       {"per_step", number(c.perStep)},
                       {"time_share", number(c.timeShare)},
                       {"exposed_share", number(c.exposedShare)},
                       {"bytes_per_step", number(c.bytesPerStep)},
                       {"bus_bandwidth_bytes_per_second", number(c.busBandwidth)}});
  }
  return out;
}

// The share of the exposed collective time in the step's first and last collective; null unknown.
Json exposedEndsJson(const kpi::ExposedEnds& e) {
  const auto kind = [](const kpi::Maybe& share, CollectiveKind k) {
    return share ? Json(std::string(nameOf(k))) : Json(nullptr);
  };
  return Json{{"first_kind", kind(e.firstShare, e.firstKind)},
              {"first_share", number(e.firstShare)},
              {"last_kind", kind(e.lastShare, e.lastKind)},
              {"last_share", number(e.lastShare)}};
}

Json kpisJson(const ReportData& data) {
  const kpi::JobKpis& k = data.kpis;
  Json j;
  j["world_size"] = k.worldSize;
  j["attempts"] = k.attempts;
  j["step"] = k.step;
  j["total_steps"] = k.totalSteps > 0 ? Json(k.totalSteps) : Json(nullptr);
  j["elapsed_seconds"] = number(k.elapsedSeconds);
  j["mean_samples_per_second"] = number(data.meanSamplesPerSecond);
  j["samples_per_second"] = number(k.samplesPerSecond);
  j["tokens_per_second"] = number(k.tokensPerSecond);
  j["total_samples"] = k.totalSamples;
  j["total_tokens"] = optional(k.totalTokens);
  j["comm_overhead"] = number(k.commOverhead);
  j["alg_bandwidth_bytes_per_second"] = number(k.algBandwidth);
  j["bus_bandwidth_bytes_per_second"] = number(k.busBandwidth);
  j["bytes_reduced_per_step"] = number(k.bytesReducedPerStep);
  j["param_bytes_per_rank"] = byteCount(k.paramBytesPerRank);
  j["grad_bytes_per_rank"] = byteCount(k.gradBytesPerRank);
  j["optimizer_state_bytes_per_rank"] = byteCount(k.optimizerStateBytesPerRank);
  j["staleness_mean"] = number(k.stalenessMean);
  j["staleness_p99"] = number(k.stalenessP99);
  addFlops(j, k);
  j["flops_basis"] = text(k.flopsBasis);
  j["peak_basis"] = text(k.peakBasis);
  j["straggler_wait_share"] = number(k.stragglerWaitShare);
  j["arrival_skew_us"] = number(k.arrivalSkewUs);
  j["collectives"] = collectivesJson(k.collectives);
  j["exposed_ends"] = exposedEndsJson(k.exposedEnds);
  const auto diagnosis = diagnoseCommunication(k, data.job.spec, data.bandwidthReference);
  j["communication_bound"] = diagnosis ? Json(boundName(diagnosis->bound)) : Json(nullptr);
  j["communication_advice"] = diagnosis ? Json(diagnosis->advice) : Json(nullptr);
  const auto buckets = data.job.spec.isCommand() ? ddpBucketAdvice(k) : std::nullopt;
  j["ddp_bucket_advice"] = buckets ? Json{{"bucket_cap_mb", buckets->capMb},
                                          {"expected_exposed_us", buckets->expectedExposedUs},
                                          {"current_exposed_us", buckets->currentExposedUs}}
                                   : Json(nullptr);
  j["waiting_share"] = number(k.waitingShare);
  j["straggler_share"] = number(k.stragglerShare);
  j["waiting_cost"] = number(k.waitingCost);
  j["straggler_cost"] = number(k.stragglerCost);
  j["waiting_gpu_hours"] = number(k.waitingGpuHours);
  j["straggler_gpu_hours"] = number(k.stragglerGpuHours);
  j["scaling_efficiency"] = number(k.scalingEfficiency);
  j["scaling_basis"] = k.scalingEfficiency ? Json(basisName(k.scalingBasis)) : Json(nullptr);
  j["gpu_utilization_pct"] = number(k.gpuUtilizationPct);
  j["load_imbalance"] = number(k.loadImbalance);
  j["initial_load_imbalance"] = number(k.initialLoadImbalance);
  j["slowest_rank"] = optional(k.slowestRank);
  j["slowest_cause"] = k.slowestRank ? Json(causeName(k.slowestCause)) : Json(nullptr);
  j["last_global_loss"] = number(k.lastGlobalLoss);
  j["smoothed_loss"] = number(k.smoothedLoss);
  j["time_to_convergence_seconds"] = number(k.timeToConvergenceSeconds);
  j["eta_seconds"] = number(k.etaSeconds);
  j["energy_kwh"] = number(k.energyKwh);
  j["gpu_hours"] = number(k.gpuHours);
  j["core_hours"] = number(k.coreHours);
  const bool priced = data.job.spec.prices.anySet();
  // Without prices the cost is unknown, not free.
  j["cost_so_far"] = priced ? number(k.costSoFar) : Json(nullptr);
  j["cost_projected"] = priced ? number(k.costProjected) : Json(nullptr);
  j["cost_complete"] = priced && k.costComplete;
  j["currency"] = data.job.spec.prices.currency;
  j["missing"] = data.missing;
  return j;
}

Json rankJson(const kpi::RankKpis& r) {
  Json j;
  j["rank"] = r.rank;
  j["node"] = r.node;
  j["attempt"] = r.attempt;
  j["step"] = r.step;
  j["epoch"] = r.epoch;
  j["samples_per_second"] = number(r.samplesPerSecond);
  j["comm_overhead"] = number(r.commOverhead);
  j["alg_bandwidth_bytes_per_second"] = number(r.algBandwidth);
  j["bus_bandwidth_bytes_per_second"] = number(r.busBandwidth);
  j["collectives"] = collectivesJson(r.collectives);
  j["mean_data_us"] = number(r.meanDataUs);
  j["mean_compute_us"] = number(r.meanComputeUs);
  j["mean_exposed_us"] = number(r.meanExposedUs);
  j["mean_step_us"] = number(r.meanStepUs);
  j["samples_per_step"] = number(r.samplesPerStep);
  j["loss"] = number(r.loss);
  j["cpu_pct"] = number(r.cpuPct);
  j["rss_bytes"] = byteCount(r.rssBytes);
  j["param_bytes"] = byteCount(r.paramBytes);
  j["grad_bytes"] = byteCount(r.gradBytes);
  j["optimizer_state_bytes"] = byteCount(r.optimizerStateBytes);
  j["staleness_mean"] = number(r.stalenessMean);
  j["staleness_p99"] = number(r.stalenessP99);
  addFlops(j, r);
  return j;
}

Json gpuJson(const kpi::GpuKpis& g) {
  Json j;
  j["node"] = g.node;
  j["index"] = g.index;
  j["utilization_pct"] = number(g.utilizationPct);
  j["mean_utilization_pct"] = number(g.meanUtilizationPct);
  j["memory_used_bytes"] = byteCount(g.memoryUsedBytes);
  j["power_watts"] = number(g.powerWatts);
  j["temperature_c"] = number(g.temperatureC);
  j["energy_kwh"] = number(g.energyKwh);
  return j;
}

Json eventJson(const JobEvent& e) {
  Json j;
  time(j, "time", e.timeUnixUs);
  j["kind"] = std::string(jobEventKindName(e.kind));
  j["rank"] = optional(e.rank);
  j["exit_code"] = optional(e.exitCode);
  j["signal"] = optional(e.signal);
  j["step"] = optional(e.step);
  j["message"] = e.message;
  j["log_tail"] = e.logTail;
  return j;
}

// Each change of the job's alerts as its own JSON (alerts/alert.h: what the webhooks got), and the
// webhooks that did not take one: the pair `lockstepctl alerts --json` gives.
Json alertsJson(const std::vector<alerts::Alert>& changes) {
  Json out = Json::array();
  for (const auto& a : changes) {
    Json j = Json::parse(alerts::alertJson(a), nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) out.push_back(std::move(j));
  }
  return out;
}

Json undeliveredJson(const std::vector<JobEvent>& events) {
  Json out = Json::array();
  for (const auto& e : events) out.push_back(Json{{"time_us", e.timeUnixUs}, {"message", e.message}});
  return out;
}

// What more ranks would buy (kpi/projection.h): empty when the job's steps cannot be projected.
Json projectionJson(const ReportData& data) {
  Json out = Json::array();
  const auto projected = detail::projection(data);
  if (!projected) return out;
  const bool priced = data.job.spec.prices.anySet();
  for (const auto& p : projected->rows) {
    out.push_back(Json{{"ranks", p.ranks},
                       {"measured", p.ranks == projected->in.ranks},
                       {"step_ms", number(p.stepUs / 1e3)},
                       {"exposed_ms", number(p.exposedUs / 1e3)},
                       {"samples_per_second", number(p.samplesPerSecond)},
                       {"scaling_efficiency", number(p.efficiency)},
                       {"cost_per_job", priced ? number(p.costPerJob) : Json(nullptr)}});
  }
  return out;
}

}  // namespace

std::string json(const ReportData& data) {
  Json root;
  root["schema"] = "lockstep.report.v1";
  time(root, "generated_at", data.generatedUnixUs);
  root["job"] = jobJson(data.job);
  root["kpis"] = kpisJson(data);
  root["ranks"] = Json::array();
  for (const auto& r : data.kpis.ranks) root["ranks"].push_back(rankJson(r));
  root["gpus"] = Json::array();
  for (const auto& g : data.kpis.gpus) root["gpus"].push_back(gpuJson(g));

  Json series;
  series["throughput"] = points(data.throughput);
  series["loss"] = points(data.loss);
  series["step_time"] = Json::array();
  for (const auto& s : data.stepSplits) {
    series["step_time"].push_back(Json{{"step", s.step},
                                       {"data_ms", number(s.dataMs)},
                                       {"compute_ms", number(s.computeMs)},
                                       {"exposed_ms", number(s.exposedMs)}});
  }
  series["utilization_source"] = data.utilizationIsGpu ? "gpu" : "cpu";
  series["utilization"] = Json::array();
  for (const auto& u : data.utilization)
    series["utilization"].push_back(Json{{"name", u.name}, {"points", points(u.points)}});
  root["series"] = std::move(series);

  root["projection"] = projectionJson(data);
  root["network"] = detail::networkJson(data);
  root["events"] = Json::array();
  for (const auto& e : data.events) root["events"].push_back(eventJson(e));
  root["alerts"] = alertsJson(data.alerts);
  root["undelivered"] = undeliveredJson(data.undeliveredAlerts);
  root["recommendations"] = data.recommendations;
  // Replace invalid UTF-8 (a rank's log tail can hold anything) instead of throwing.
  return root.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace lockstep::report
