#pragma once
// Reading a job's stream back out of the history: each table's rows as records (record_rows.h),
// merged in time order and fed to the one stream reader as the live views are; and each table on
// its own (a report's steps, GPU and network samples, events). Private to history/.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "catalog.h"
#include "lockstep/history/history.h"
#include "sqlite.h"

namespace lockstep::history::detail {

class Replayer {
 public:
  // The job's record (its span, its spec, a calibration) comes from `catalog`.
  Replayer(sqlite3* db, Catalog& catalog);

  Result<void> replay(const std::string& jobId, const std::function<void(const StreamMessage&)>& visit, bool nodes);
  Result<Replay> replayJob(const std::string& jobId, kpi::Settings settings, bool nodes);
  Result<std::unique_ptr<kpi::JobTracker>> tracker(const std::string& jobId, kpi::Settings settings);

  Result<void> forEachStep(const std::string& jobId,
                           const std::function<void(const StepReport&, const std::string& node)>& visit);
  Result<void> forEachGpuSample(const std::string& jobId, const std::function<void(const StoredGpuSample&)>& visit);
  Result<void> forEachNetSample(const std::string& jobId, const std::function<void(const NetSample&)>& visit);
  Result<std::vector<JobEvent>> events(const std::string& jobId);

 private:
  // The job's nodes' network samples while it ran (its record says when).
  Result<Prepared::Use> netOf(const std::string& jobId, const JobRecord& record);

  Catalog& catalog_;
  // The merge's tables in time order; each also read on its own.
  Prepared events_, steps_, phases_, gpus_, processes_, net_;
  Prepared stepsInOrder_, gpusInOrder_;  // by attempt, step and rank; by time, node and GPU
};

}  // namespace lockstep::history::detail
