// Writing into the history. The stream goes into its tables (tables.h, record_rows.h) read through
// protocol's StreamRouter as every consumer reads the stream: a job's records are kept once the job
// is recorded, a node's network while one of the recorded jobs runs on it.

#include "record.h"

#include <map>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "catalog.h"
#include "final_kpis.h"
#include "lockstep/common/clock.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/stream.h"
#include "record_rows.h"
#include "tables.h"

namespace lockstep::history::detail {

namespace {

template <class R>
std::string insertOf() {
  using T = Table<R>;
  return insertSql<R>(T::kName, T::kLead, T::kLeadCount);
}

// One recordMessages call's writes: the recorder's statements in use, what it learnt of jobs and
// nodes (for this batch only: another process may record or remove a job between batches), the
// jobs it touched and its first error (nothing is written after it).
class Batch {
 public:
  static Result<std::unique_ptr<Batch>> open(sqlite3* db, StreamStatements& s) {
    auto b = std::unique_ptr<Batch>(new Batch(db));
    LOCKSTEP_TRY(into(b->known_, s.knownJob.use()));
    LOCKSTEP_TRY(into(b->parts_, s.partsOnNode.use()));
    LOCKSTEP_TRY(into(b->events, s.events.use()));
    LOCKSTEP_TRY(into(b->steps, s.steps.use()));
    LOCKSTEP_TRY(into(b->processes, s.processes.use()));
    LOCKSTEP_TRY(into(b->gpus, s.gpus.use()));
    LOCKSTEP_TRY(into(b->nets, s.nets.use()));
    LOCKSTEP_TRY(into(b->phases, s.phases.use()));
    return b;
  }

  bool knownJob(const std::string& jobId) {
    if (!status_) return false;
    auto [it, fresh] = knownJobs_.try_emplace(jobId, false);
    if (fresh) {
      (*known_)->bind(1, jobId);
      it->second = rowOf(**known_);
      (void)(*known_)->reset();
    }
    return it->second;
  }

  // Whether a recorded job's part on `node` covers a sample taken then (partCovers).
  bool nodeBusy(const std::string& node, std::int64_t timeUs) {
    if (!status_) return false;
    auto [it, fresh] = partsOn_.try_emplace(node);
    if (fresh) {
      (*parts_)->bind(1, node);
      while (rowOf(**parts_)) it->second.emplace_back((*parts_)->i64(0), (*parts_)->i64(1));
      (void)(*parts_)->reset();
    }
    for (const auto& [started, ended] : it->second) {
      if (partCovers(started, ended, timeUs)) return true;
    }
    return false;
  }

  // The table's leading columns (tables.h), then the record.
  template <class R, class... Lead>
  void insert(std::optional<Prepared::Use>& use, const R& record, const Lead&... lead) {
    static_assert(sizeof...(Lead) == static_cast<std::size_t>(Table<R>::kLeadCount));
    Statement& s = **use;
    int i = 1;
    (s.bind(i++, lead), ...);
    bindRecord(s, i, record);
    auto stepped = s.step();
    const bool inserted = stepped && sqlite3_changes(db_) > 0;  // 0: replayed, stored already
    (void)s.reset();
    if (!stepped) {
      status_ = stepped.error();
      return;
    }
    if constexpr (requires { record.jobId; }) {
      if (inserted && !record.jobId.empty()) touched_[record.jobId] += std::is_same_v<R, StepReport> ? 1 : 0;
    }
  }

  Result<void>& status() { return status_; }
  // Jobs written to, with the step reports new to each.
  const std::map<std::string, std::int64_t>& touched() const { return touched_; }

  std::optional<Prepared::Use> events, steps, processes, gpus, nets, phases;

 private:
  explicit Batch(sqlite3* db) : db_(db) {}
  static Result<void> into(std::optional<Prepared::Use>& slot, Result<Prepared::Use> use) {
    if (!use) return use.error();
    slot.emplace(std::move(use).value());
    return {};
  }
  bool rowOf(Statement& query) {
    auto row = query.step();
    if (!row) status_ = row.error();
    return row && *row;
  }

  sqlite3* db_;
  std::optional<Prepared::Use> known_, parts_;
  std::map<std::string, bool, std::less<>> knownJobs_;
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>, std::less<>> partsOn_;
  std::map<std::string, std::int64_t> touched_;
  Result<void> status_;
};

// A recorded job's records, each into its table with the node whose agent streamed it.
class JobRows : public RecordSink {
 public:
  explicit JobRows(Batch& b) : b_(b) {}
  void onEvent(const std::string& node, const JobEvent& e) override { b_.insert(b_.events, e, node); }
  void onStep(const std::string& node, const StepReport& r) override { b_.insert(b_.steps, r, node); }
  void onPhase(const std::string& node, const PhaseReport& p) override { b_.insert(b_.phases, p, node); }
  void onProcess(const std::string& node, const ProcessSample& p) override {
    b_.insert(b_.processes, p, node, std::int64_t{0});
  }
  void onGpu(const std::string& node, const GpuSample& g) override {
    GpuSample sample = g;
    if (sample.node.empty()) sample.node = node;
    b_.insert(b_.gpus, sample, std::int64_t{0});
  }

 private:
  Batch& b_;
};

// A node's own records: its network, while a recorded job runs on it (its idle GPUs are not kept).
class NodeRows : public RecordSink {
 public:
  explicit NodeRows(Batch& b) : b_(b) {}
  void onNet(const std::string& node, const NetSample& n) override {
    if (b_.nodeBusy(node, n.timeUnixUs)) b_.insert(b_.nets, n, std::int64_t{0});
  }

 private:
  Batch& b_;
};

}  // namespace

StreamStatements::StreamStatements(sqlite3* db)
    : knownJob(db, "SELECT 1 FROM jobs WHERE job_id = ?1"),
      partsOnNode(db, "SELECT started_us, ended_us FROM job_parts WHERE node = ?1"),
      events(db, insertOf<JobEvent>()),
      steps(db, insertOf<StepReport>()),
      phases(db, insertOf<PhaseReport>()),
      processes(db, insertOf<ProcessSample>()),
      gpus(db, insertOf<GpuSample>()),
      nets(db, insertOf<NetSample>()),
      countSteps(db, "UPDATE jobs SET kpis_stale = 1, step_reports = step_reports + ?2 WHERE job_id = ?1") {}

Recorder::Recorder(sqlite3* db)
    : db_(db),
      node_(db, R"sql(
        INSERT INTO nodes VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
        ON CONFLICT (node) DO UPDATE SET host = ?2, cpu_cores = ?3, memory_bytes = ?4, gpus_json = ?5,
          agent_version = ?6, seen_us = ?7)sql"),
      attempt_(db, "SELECT coalesce(json_extract(spec_json, '$.attempt'), 0) FROM jobs WHERE job_id = ?1"),
      insertJob_(db, "INSERT INTO jobs (job_id, name, spec_json, world_size, recorded_us) VALUES (?1, ?2, ?3, ?4, ?5)"),
      restartJob_(db, "UPDATE jobs SET spec_json = ?2, world_size = ?3, kpis_stale = 1 WHERE job_id = ?1"),
      outcome_(db, R"sql(
        UPDATE jobs SET outcome = ?2, outcome_message = ?3
        WHERE job_id = ?1 AND (outcome IS NOT ?2 OR outcome_message IS NOT ?3))sql"),
      dropParts_(db, "DELETE FROM job_parts WHERE job_id = ?1"),
      part_(db, R"sql(
        INSERT INTO job_parts VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
        ON CONFLICT (job_id, node) DO UPDATE SET state = ?3, started_us = ?4, ended_us = ?5, message = ?6, owner = ?7
          WHERE state != ?3 OR started_us != ?4 OR ended_us != ?5 OR message != ?6 OR owner != ?7)sql"),
      markStale_(db, "UPDATE jobs SET kpis_stale = 1 WHERE job_id = ?1"),
      stream_(db),
      // Only jobs whose parts all ended: a running job is written to all the time, and is computed
      // once it ends.
      stale_(db, R"sql(
        SELECT job_id FROM jobs WHERE kpis_stale = 1 AND NOT EXISTS (
          SELECT 1 FROM job_parts p WHERE p.job_id = jobs.job_id AND p.state IN (?1, ?2)))sql"),
      markFresh_(db, "UPDATE jobs SET kpis_stale = 0 WHERE job_id = ?1"),
      // The job's nodes' network goes with it, but for what another job's part on a node still
      // covers (partCovers, in SQL).
      removeNetwork_(db, R"sql(
        DELETE FROM net_samples WHERE node IN (SELECT node FROM job_parts WHERE job_id = ?1) AND NOT EXISTS (
          SELECT 1 FROM job_parts p WHERE p.job_id != ?1 AND p.node = net_samples.node
            AND p.started_us - ?2 <= net_samples.time_us AND (p.ended_us = 0 OR p.ended_us + ?2 >= net_samples.time_us)))sql"),
      removeJob_(db, "DELETE FROM jobs WHERE job_id = ?1") {}

Result<void> Recorder::recordNode(const NodeHello& hello) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, node_.use());
  const std::int64_t now = unixMicrosNow();
  stmt->bind(1, hello.nodeName).bind(2, hello.host).bind(3, hello.cpuCores).bind(4, hello.memoryTotalBytes);
  stmt->bind(5, gpusToJson(hello.gpus)).bind(6, hello.agentVersion).bind(7, now);
  return stmt->run();
}

Result<bool> Recorder::recordJob(const std::string& node, const JobStatus& status) {
  const JobSpec& spec = status.spec;
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db_));
  LOCKSTEP_ASSIGN_OR_RETURN(const auto stored, storedAttempt(spec.jobId));
  if (stored && spec.attempt < *stored) {
    // A part of an attempt a restart replaced; its agent may still supervise the job (the restart
    // left its node out) and give the verdict. Only that is taken: the history holds one job per id,
    // and a new job under an id whose job restarted reads as that job's earlier attempt.
    if (status.supervision.state != SupervisionState::kEnded) return false;
    LOCKSTEP_ASSIGN_OR_RETURN(const bool judged, recordOutcome(status));
    LOCKSTEP_TRY(tx.commit());
    return judged;
  }
  // A status whose spec was left out (the client had it) cannot start or restart a record.
  if (status.specOmitted && (!stored || spec.attempt > *stored)) return false;
  bool changed = false;
  if (!stored) {
    LOCKSTEP_TRY(insertJob(spec));
    changed = true;
  } else if (spec.attempt > *stored) {
    LOCKSTEP_TRY(restartJob(spec));
    changed = true;
  }
  LOCKSTEP_ASSIGN_OR_RETURN(const bool partChanged, recordPart(node, status));
  LOCKSTEP_ASSIGN_OR_RETURN(const bool judged, recordOutcome(status));
  LOCKSTEP_TRY(tx.commit());
  return changed || partChanged || judged;
}

// The supervisor's verdict, from the supervising agent's status: kept once its supervision ended,
// none while it goes on (a job restarting, or a new job under the id of one recorded before).
Result<bool> Recorder::recordOutcome(const JobStatus& status) {
  const Supervision& s = status.supervision;
  if (s.state == SupervisionState::kNone || s.state == SupervisionState::kStandby) return false;
  const bool ended = s.state == SupervisionState::kEnded;
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, outcome_.use());
  stmt->bind(1, status.spec.jobId);
  stmt->bind(2, ended ? std::optional(static_cast<std::int64_t>(s.outcome)) : std::nullopt);
  LOCKSTEP_TRY(stmt->bind(3, ended ? std::optional(s.message) : std::nullopt).run());
  return sqlite3_changes(db_) != 0;
}

Result<std::optional<std::int64_t>> Recorder::storedAttempt(const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, attempt_.use());
  stmt->bind(1, jobId);
  LOCKSTEP_ASSIGN_OR_RETURN(const bool known, stmt->step());
  return known ? std::optional(stmt->i64(0)) : std::nullopt;
}

Result<void> Recorder::insertJob(const JobSpec& spec) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto stmt, insertJob_.use());
  stmt->bind(1, spec.jobId).bind(2, spec.name).bind(3, jobSpecToJson(spec)).bind(4, spec.worldSize);
  return stmt->bind(5, unixMicrosNow()).run();
}

// A restart: the job is now this attempt's spec and parts (its reports keep their attempts).
Result<void> Recorder::restartJob(const JobSpec& spec) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto job, restartJob_.use());
  LOCKSTEP_TRY(job->bind(1, spec.jobId).bind(2, jobSpecToJson(spec)).bind(3, spec.worldSize).run());
  LOCKSTEP_ASSIGN_OR_RETURN(auto parts, dropParts_.use());
  return parts->bind(1, spec.jobId).run();
}

// The part as its agent reports it; a change makes the job's final KPIs stale.
Result<bool> Recorder::recordPart(const std::string& node, const JobStatus& status) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto part, part_.use());
  part->bind(1, status.spec.jobId).bind(2, node).bind(3, static_cast<std::int64_t>(status.state));
  part->bind(4, status.startedUnixUs).bind(5, status.endedUnixUs).bind(6, status.message).bind(7, status.owner);
  LOCKSTEP_TRY(part->step());
  if (sqlite3_changes(db_) == 0) return false;
  LOCKSTEP_ASSIGN_OR_RETURN(auto stale, markStale_.use());
  LOCKSTEP_TRY(stale->bind(1, status.spec.jobId).run());
  return true;
}

Result<void> Recorder::recordMessages(std::span<const StreamMessage> messages) {
  if (messages.empty()) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db_));
  LOCKSTEP_ASSIGN_OR_RETURN(auto batch, Batch::open(db_, stream_));
  JobRows jobRows(*batch);
  NodeRows nodeRows(*batch);
  StreamRouter router([&](const std::string& jobId) -> RecordSink* { return batch->knownJob(jobId) ? &jobRows : nullptr; },
                      [&](const std::string&) -> RecordSink* { return &nodeRows; });
  router.read(messages);
  LOCKSTEP_TRY(batch->status());
  LOCKSTEP_ASSIGN_OR_RETURN(auto update, stream_.countSteps.use());
  for (const auto& [jobId, newSteps] : batch->touched()) LOCKSTEP_TRY(update->bind(1, jobId).bind(2, newSteps).run());
  return tx.commit();
}

Result<std::vector<std::string>> Recorder::staleJobs() {
  LOCKSTEP_ASSIGN_OR_RETURN(auto query, stale_.use());
  query->bind(1, static_cast<std::int64_t>(JobState::kStarting)).bind(2, static_cast<std::int64_t>(JobState::kRunning));
  std::vector<std::string> stale;
  LOCKSTEP_TRY(forEachRow(*query, [&](const Statement& s) { stale.push_back(s.text(0)); }));
  return stale;
}

Result<void> Recorder::writeFinalKpis(const std::string& jobId, const kpi::JobKpis& kpis, std::int64_t nowUnixUs) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db_));
  LOCKSTEP_TRY(detail::writeFinalKpis(db_, jobId, kpis, nowUnixUs));
  LOCKSTEP_ASSIGN_OR_RETURN(auto done, markFresh_.use());
  LOCKSTEP_TRY(done->bind(1, jobId).run());
  return tx.commit();
}

Result<void> Recorder::remove(const std::string& jobId) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db_));
  LOCKSTEP_ASSIGN_OR_RETURN(auto network, removeNetwork_.use());
  LOCKSTEP_TRY(network->bind(1, jobId).bind(2, kNodeMarginUs).run());
  LOCKSTEP_ASSIGN_OR_RETURN(auto job, removeJob_.use());
  LOCKSTEP_TRY(job->bind(1, jobId).run());
  if (sqlite3_changes(db_) == 0) return noSuchJob(jobId);
  return tx.commit();
}

}  // namespace lockstep::history::detail
