#pragma once
// Where each streamed record is kept: its table, and the table's own leading columns before the
// record's fields (record_rows.h). Private to history/.

#include <string_view>

#include "lockstep/protocol/types.h"

namespace lockstep::history::detail {

// A node's own samples (its network) are a job's from the job's start until this long after its
// end: kept while a recorded job runs on the node, replayed with the job, deleted with it.
inline constexpr std::int64_t kNodeMarginUs = 5'000'000;

template <class R>
struct Table;

// The node whose agent streamed it, then the record.
template <>
struct Table<JobEvent> {
  static constexpr std::string_view kName = "events", kLead = "node";
  static constexpr int kLeadCount = 1;
};
template <>
struct Table<StepReport> {
  static constexpr std::string_view kName = "steps", kLead = "node";
  static constexpr int kLeadCount = 1;
};
// span_us: 0 for a raw sample, else the bucket it sums up (History::compact); GPU and network
// samples carry their node.
template <>
struct Table<ProcessSample> {
  static constexpr std::string_view kName = "process_samples", kLead = "node, span_us";
  static constexpr int kLeadCount = 2;
};
template <>
struct Table<GpuSample> {
  static constexpr std::string_view kName = "gpu_samples", kLead = "span_us";
  static constexpr int kLeadCount = 1;
};
template <>
struct Table<NetSample> {
  static constexpr std::string_view kName = "net_samples", kLead = "span_us";
  static constexpr int kLeadCount = 1;
};

}  // namespace lockstep::history::detail
