#pragma once
// One description of each streamed record's fields (issue 31): its name in the schema (and in JSON
// lines), the struct member, and the history's SQLite column where that is named otherwise. The
// codec (protocol/src/stream_codec.cpp, through protobuf's reflection), equality, the JSON lines
// (record_json.h) and the history's tables (history/src/record_rows.h) all walk these lists, so a
// field is added to a record in three places: the schema, the struct and the line here. A test
// (tests/stream_test.cpp, Records.*) checks that each list names every field of its schema
// message, with a matching type and presence.

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep::records {

template <class Record, class T>
struct Field {
  using Type = T;
  std::string_view name;    // the schema's field name, and the JSON key
  T Record::*member;
  std::string_view column;  // the history's column, where it differs from `name`

  constexpr std::string_view sqlColumn() const { return column.empty() ? name : column; }
  constexpr const T& of(const Record& r) const { return r.*member; }
  constexpr T& of(Record& r) const { return r.*member; }
};

template <class Record, class T>
constexpr Field<Record, T> field(std::string_view name, T Record::*member, std::string_view column = {}) {
  return Field<Record, T>{name, member, column};
}

template <class T>
struct IsList : std::false_type {};
template <class T>
struct IsList<std::vector<T>> : std::true_type {
  using Value = T;
};

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {
  using Value = T;
};

// Description<R>::kName (the schema's message name), ::kStreamField (its field of StreamMessage's
// payload) and ::kFields, for each streamed record.
template <class R>
struct Description;

template <>
struct Description<JobEvent> {
  static constexpr std::string_view kName = "JobEvent";
  static constexpr std::string_view kStreamField = "job_event";  // in StreamMessage
  static constexpr auto kFields = std::tuple{
      field("job_id", &JobEvent::jobId),
      field("kind", &JobEvent::kind),
      field("time_unix_us", &JobEvent::timeUnixUs, "time_us"),
      field("rank", &JobEvent::rank),
      field("exit_code", &JobEvent::exitCode),
      field("signal", &JobEvent::signal),
      field("message", &JobEvent::message),
      field("log_tail", &JobEvent::logTail),
      field("step", &JobEvent::step),
  };
};

template <>
struct Description<GpuSample> {
  static constexpr std::string_view kName = "GpuSample";
  static constexpr std::string_view kStreamField = "gpu_sample";  // in StreamMessage
  static constexpr auto kFields = std::tuple{
      field("node", &GpuSample::node),
      field("gpu_index", &GpuSample::gpuIndex, "gpu"),
      field("time_unix_us", &GpuSample::timeUnixUs, "time_us"),
      field("job_id", &GpuSample::jobId),
      field("utilization_pct", &GpuSample::utilizationPct, "utilization"),
      field("memory_used_bytes", &GpuSample::memoryUsedBytes, "memory_bytes"),
      field("power_mw", &GpuSample::powerMilliwatts),
      field("energy_mj", &GpuSample::energyMillijoules),
      field("temperature_c", &GpuSample::temperatureC),
      field("sm_clock_mhz", &GpuSample::smClockMhz),
  };
};

template <>
struct Description<ProcessSample> {
  static constexpr std::string_view kName = "ProcessSample";
  static constexpr std::string_view kStreamField = "process_sample";  // in StreamMessage
  static constexpr auto kFields = std::tuple{
      field("job_id", &ProcessSample::jobId),
      field("rank", &ProcessSample::rank),
      field("pid", &ProcessSample::pid),
      field("time_unix_us", &ProcessSample::timeUnixUs, "time_us"),
      field("cpu_pct", &ProcessSample::cpuPct),
      field("rss_bytes", &ProcessSample::rssBytes),
  };
};

template <>
struct Description<NetSample> {
  static constexpr std::string_view kName = "NetSample";
  static constexpr std::string_view kStreamField = "net_sample";  // in StreamMessage
  static constexpr auto kFields = std::tuple{
      field("node", &NetSample::node),
      field("interface", &NetSample::interface),
      field("time_unix_us", &NetSample::timeUnixUs, "time_us"),
      field("rx_bytes", &NetSample::rxBytes),
      field("tx_bytes", &NetSample::txBytes),
      field("rx_packets", &NetSample::rxPackets),
      field("tx_packets", &NetSample::txPackets),
      field("rx_errors", &NetSample::rxErrors),
      field("tx_errors", &NetSample::txErrors),
      field("rx_drops", &NetSample::rxDrops),
      field("tx_drops", &NetSample::txDrops),
      field("link_bits_per_second", &NetSample::linkBitsPerSecond),
  };
};

template <>
struct Description<StepReport> {
  static constexpr std::string_view kName = "StepReport";
  static constexpr std::string_view kStreamField = "step_report";  // in StreamMessage
  static constexpr auto kFields = std::tuple{
      field("job_id", &StepReport::jobId),
      field("rank", &StepReport::rank),
      field("world_size", &StepReport::worldSize),
      field("attempt", &StepReport::attempt),
      field("step", &StepReport::step),
      field("epoch", &StepReport::epoch),
      field("samples", &StepReport::samples),
      field("loss", &StepReport::loss),
      field("global_loss", &StepReport::globalLoss),
      field("data_time_us", &StepReport::dataTimeUs, "data_us"),
      field("compute_time_us", &StepReport::computeTimeUs, "compute_us"),
      field("exposed_comm_time_us", &StepReport::exposedCommTimeUs, "exposed_us"),
      field("allreduce_time_us", &StepReport::allreduceTimeUs, "allreduce_us"),
      field("bytes_reduced", &StepReport::bytesReduced),
      field("step_time_us", &StepReport::stepTimeUs, "step_us"),
      field("time_unix_us", &StepReport::timeUnixUs, "time_us"),
      field("lr", &StepReport::lr),
      field("tokens", &StepReport::tokens),
      field("optimizer_time_us", &StepReport::optimizerTimeUs, "optimizer_us"),
      field("collectives", &StepReport::collectives),
      field("collective_spans", &StepReport::collectiveSpans),
      field("param_bytes", &StepReport::paramBytes),
      field("grad_bytes", &StepReport::gradBytes),
      field("optimizer_state_bytes", &StepReport::optimizerStateBytes),
      field("staleness", &StepReport::staleness),
      field("flops", &StepReport::flops),
      field("flops_basis", &StepReport::flopsBasis),
      field("precision", &StepReport::precision),
      field("peak_flops", &StepReport::peakFlops),
  };
};

// Messages a record holds a list of: their fields are described the same way, and a list of them
// is one field of the record (a repeated message in the schema, a JSON array in lines and in the
// history's column).
template <>
struct Description<CollectiveTimes> {
  static constexpr std::string_view kName = "CollectiveTimes";
  static constexpr auto kFields = std::tuple{
      field("kind", &CollectiveTimes::kind),
      field("count", &CollectiveTimes::count),
      field("time_us", &CollectiveTimes::timeUs),
      field("exposed_us", &CollectiveTimes::exposedUs),
      field("bytes", &CollectiveTimes::bytes),
  };
};

template <>
struct Description<CollectiveSpan> {
  static constexpr std::string_view kName = "CollectiveSpan";
  static constexpr auto kFields = std::tuple{
      field("kind", &CollectiveSpan::kind),
      field("start_unix_us", &CollectiveSpan::startUnixUs),
      field("duration_us", &CollectiveSpan::durationUs),
      field("exposed_us", &CollectiveSpan::exposedUs),
      field("bytes", &CollectiveSpan::bytes),
  };
};

template <>
struct Description<PhaseReport> {
  static constexpr std::string_view kName = "PhaseReport";
  static constexpr std::string_view kStreamField = "phase_report";  // in StreamMessage
  static constexpr auto kFields = std::tuple{
      field("job_id", &PhaseReport::jobId),
      field("rank", &PhaseReport::rank),
      field("world_size", &PhaseReport::worldSize),
      field("attempt", &PhaseReport::attempt),
      field("name", &PhaseReport::name),
      field("time_unix_us", &PhaseReport::timeUnixUs, "time_us"),
      field("duration_us", &PhaseReport::durationUs),
      field("step", &PhaseReport::step),
  };
};

// Calls f(field) for each field of R, in the schema's order.
template <class R, class F>
constexpr void forEachField(F&& f) {
  std::apply([&](const auto&... each) { (f(each), ...); }, Description<R>::kFields);
}

template <class R>
constexpr std::size_t fieldCount() {
  return std::tuple_size_v<std::remove_cv_t<decltype(Description<R>::kFields)>>;
}

namespace detail {
template <class T>
bool sameValue(const T& a, const T& b) {
  if constexpr (IsOptional<T>::value) {
    return a.has_value() == b.has_value() && (!a || sameValue(*a, *b));
  } else if constexpr (std::is_floating_point_v<T>) {
    return a == b || (std::isnan(a) && std::isnan(b));  // a NaN loss is the same NaN after a round trip
  } else {
    return a == b;
  }
}
}  // namespace detail

// Field by field, with NaN equal to NaN: what a record's operator== means.
template <class R>
bool same(const R& a, const R& b) {
  bool equal = true;
  forEachField<R>([&](const auto& f) { equal = equal && detail::sameValue(f.of(a), f.of(b)); });
  return equal;
}

}  // namespace lockstep::records
