#pragma once
// The history's writes: a node's hello, a job's parts as its agents report them, the stream into
// a table per kind of record (tables.h, record_rows.h), a job's final KPIs, and removing a job.
// Each write is one transaction. Private to history/.

#include <span>
#include <string>
#include <vector>

#include "lockstep/history/history.h"
#include "sqlite.h"

namespace lockstep::history::detail {

// The statements the stream is written with: recordMessages' batches borrow them (record.cpp).
struct StreamStatements {
  explicit StreamStatements(sqlite3* db);
  Prepared knownJob, partsOnNode;  // what a batch looks up (and keeps for the batch)
  Prepared events, steps, phases, processes, gpus, nets;
  Prepared countSteps;  // a job written to: its KPIs stale, its new step reports counted
};

class Recorder {
 public:
  explicit Recorder(sqlite3* db);

  Result<void> recordNode(const NodeHello& hello);
  Result<bool> recordJob(const std::string& node, const JobStatus& status);
  Result<void> recordMessages(std::span<const StreamMessage> messages);
  // Jobs written to since their final KPIs were computed, whose parts all ended.
  Result<std::vector<std::string>> staleJobs();
  // A job's final KPIs, computed at `nowUnixUs`; no longer stale.
  Result<void> writeFinalKpis(const std::string& jobId, const kpi::JobKpis& kpis, std::int64_t nowUnixUs);
  Result<void> remove(const std::string& jobId);  // NotFound when absent

 private:
  // The attempt the job is stored as; empty when it is not.
  Result<std::optional<std::int64_t>> storedAttempt(const std::string& jobId);
  Result<void> insertJob(const JobSpec& spec);
  Result<void> restartJob(const JobSpec& spec);
  Result<bool> recordPart(const std::string& node, const JobStatus& status);
  Result<bool> recordOutcome(const JobStatus& status);

  sqlite3* db_;
  Prepared node_;
  Prepared attempt_, insertJob_, restartJob_, outcome_, dropParts_, part_, markStale_;
  StreamStatements stream_;
  Prepared stale_, markFresh_;
  Prepared removeNetwork_, removeJob_;
};

}  // namespace lockstep::history::detail
