#pragma once
// Where each streamed record is kept: its table, and the table's own leading columns before the
// record's fields (record_rows.h). Private to history/.

#include <string_view>

#include "lockstep/protocol/types.h"

namespace lockstep::history::detail {

// A node's own samples (its network) are a job's from its part's start on the node until its end,
// with this margin either side: kept while a recorded job's part covers them (partCovers), replayed
// with the job, deleted with the last job that covers them. Recorder::remove says the same in SQL.
inline constexpr std::int64_t kNodeMarginUs = 5'000'000;

// Whether a job's part on a node, started and ended then (0: not ended), covers a sample of the
// node taken at `timeUs`.
inline bool partCovers(std::int64_t startedUs, std::int64_t endedUs, std::int64_t timeUs) {
  return startedUs - kNodeMarginUs <= timeUs && (endedUs == 0 || timeUs <= endedUs + kNodeMarginUs);
}

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
template <>
struct Table<PhaseReport> {
  static constexpr std::string_view kName = "phases", kLead = "node";
  static constexpr int kLeadCount = 1;
};
// span_us: 0 for a raw sample, else the bucket it sums up (Compactor); GPU and network
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
