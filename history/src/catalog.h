#pragma once
// The recorded jobs as JobRecords: a job's row with its parts, the nodes they ran on and its final
// KPIs, and what is asked across jobs (a 1-rank run's pace, the peak bus bandwidth on a set of
// nodes). Private to history/.

#include <optional>
#include <string>
#include <vector>

#include "lockstep/history/history.h"
#include "sqlite.h"

namespace lockstep::history::detail {

// The nodes table's gpus_json: written by the recorder from a node's hello, read here.
std::string gpusToJson(const std::vector<GpuInfo>& gpus);
std::vector<GpuInfo> gpusFromJson(const std::string& text);

// What a job the history does not hold is answered with.
Error noSuchJob(const std::string& jobId);

class Catalog {
 public:
  explicit Catalog(sqlite3* db);

  Result<std::vector<JobRecord>> jobs(const Filter& filter);  // newest first
  Result<JobRecord> job(const std::string& jobId);            // NotFound when absent
  Result<kpi::Maybe> calibration(const JobSpec& spec);
  Result<std::optional<BandwidthPeak>> peakBusBandwidth(const std::vector<std::string>& nodes,
                                                        const std::string& exceptJobId);

 private:
  Result<JobRecord> readRecord(const Statement& row);
  Result<std::vector<PartRecord>> readParts(const std::string& jobId);
  Result<std::vector<NodeRecord>> readNodes(const std::vector<PartRecord>& parts);

  sqlite3* db_;
  // Each reads `jobs` rows as (job_id, spec_json, recorded_us, step_reports, outcome, outcome_message),
  // for readRecord.
  Prepared matching_, byId_, singleRank_;
  Prepared parts_, node_, busBandwidths_;
};

}  // namespace lockstep::history::detail
