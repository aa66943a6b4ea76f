// Writing the stream into the history: each record into its table (tables.h, record_rows.h),
// read through protocol's StreamRouter as every consumer reads the stream. A job's records are
// kept once the job is recorded; a node's network while one of the recorded jobs runs on it.

#include <map>
#include <optional>
#include <vector>

#include "lockstep/history/history.h"
#include "lockstep/protocol/stream.h"
#include "record_rows.h"
#include "tables.h"

namespace lockstep::history {

using detail::Statement;
using detail::Transaction;

namespace {

template <class R>
Result<Statement> prepareInsert(sqlite3* db) {
  using T = detail::Table<R>;
  return Statement::prepare(db, detail::insertSql<R>(T::kName, T::kLead, T::kLeadCount));
}

// The statements of one transaction's writes, what they touched and the first error (nothing is
// written after it).
class Tables {
 public:
  static Result<std::unique_ptr<Tables>> prepare(sqlite3* db) {
    auto t = std::unique_ptr<Tables>(new Tables(db));
    LOCKSTEP_TRY(into(t->known_, Statement::prepare(db, "SELECT 1 FROM jobs WHERE job_id = ?1")));
    LOCKSTEP_TRY(into(t->parts_, Statement::prepare(db, "SELECT started_us, ended_us FROM job_parts WHERE node = ?1")));
    LOCKSTEP_TRY(into(t->events, prepareInsert<JobEvent>(db)));
    LOCKSTEP_TRY(into(t->steps, prepareInsert<StepReport>(db)));
    LOCKSTEP_TRY(into(t->processes, prepareInsert<ProcessSample>(db)));
    LOCKSTEP_TRY(into(t->gpus, prepareInsert<GpuSample>(db)));
    LOCKSTEP_TRY(into(t->nets, prepareInsert<NetSample>(db)));
    LOCKSTEP_TRY(into(t->phases, prepareInsert<PhaseReport>(db)));
    return t;
  }

  bool knownJob(const std::string& jobId) {
    if (!status_) return false;
    auto [it, fresh] = knownJobs_.try_emplace(jobId, false);
    if (fresh) {
      known_->bind(1, jobId);
      it->second = rowOf(*known_);
      (void)known_->reset();
    }
    return it->second;
  }

  // Whether a recorded job's part on `node` covers a sample taken then (detail::partCovers).
  bool nodeBusy(const std::string& node, std::int64_t timeUs) {
    if (!status_) return false;
    auto [it, fresh] = partsOn_.try_emplace(node);
    if (fresh) {
      parts_->bind(1, node);
      while (rowOf(*parts_)) it->second.emplace_back(parts_->i64(0), parts_->i64(1));
      (void)parts_->reset();
    }
    for (const auto& [started, ended] : it->second) {
      if (detail::partCovers(started, ended, timeUs)) return true;
    }
    return false;
  }

  template <class R>
  void insert(std::optional<Statement>& s, int first, const R& record, const std::string& jobId, bool isStep) {
    detail::bindRecord(*s, first, record);
    auto stepped = s->step();
    const bool inserted = stepped && sqlite3_changes(db_) > 0;  // 0: replayed, stored already
    (void)s->reset();
    if (!stepped) {
      status_ = stepped.error();
      return;
    }
    if (inserted && !jobId.empty()) touched_[jobId] += isStep ? 1 : 0;
  }

  Result<void>& status() { return status_; }
  // Jobs written to, with the step reports new to each.
  const std::map<std::string, std::int64_t>& touched() const { return touched_; }

  std::optional<Statement> events, steps, processes, gpus, nets, phases;

 private:
  explicit Tables(sqlite3* db) : db_(db) {}
  static Result<void> into(std::optional<Statement>& slot, Result<Statement> prepared) {
    if (!prepared) return prepared.error();
    slot.emplace(std::move(prepared).value());
    return {};
  }
  bool rowOf(Statement& query) {
    auto row = query.step();
    if (!row) status_ = row.error();
    return row && *row;
  }

  sqlite3* db_;
  std::optional<Statement> known_, parts_;
  std::map<std::string, bool, std::less<>> knownJobs_;
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>, std::less<>> partsOn_;
  std::map<std::string, std::int64_t> touched_;
  Result<void> status_;
};

// A recorded job's records, each into its table with the node whose agent streamed it.
class JobRows : public RecordSink {
 public:
  explicit JobRows(Tables& t) : t_(t) {}
  void onEvent(const std::string& node, const JobEvent& e) override {
    t_.events->bind(1, node);
    t_.insert(t_.events, 2, e, e.jobId, false);
  }
  void onStep(const std::string& node, const StepReport& r) override {
    t_.steps->bind(1, node);
    t_.insert(t_.steps, 2, r, r.jobId, true);
  }
  void onPhase(const std::string& node, const PhaseReport& p) override {
    t_.phases->bind(1, node);
    t_.insert(t_.phases, 2, p, p.jobId, false);
  }
  void onProcess(const std::string& node, const ProcessSample& p) override {
    t_.processes->bind(1, node).bind(2, std::int64_t{0});
    t_.insert(t_.processes, 3, p, p.jobId, false);
  }
  void onGpu(const std::string& node, const GpuSample& g) override {
    GpuSample sample = g;
    if (sample.node.empty()) sample.node = node;
    t_.gpus->bind(1, std::int64_t{0});
    t_.insert(t_.gpus, 2, sample, g.jobId, false);
  }

 private:
  Tables& t_;
};

// A node's own records: its network, while a recorded job runs on it (its idle GPUs are not kept).
class NodeRows : public RecordSink {
 public:
  explicit NodeRows(Tables& t) : t_(t) {}
  void onNet(const std::string& node, const NetSample& n) override {
    if (!t_.nodeBusy(node, n.timeUnixUs)) return;
    t_.nets->bind(1, std::int64_t{0});
    t_.insert(t_.nets, 2, n, std::string(), false);
  }

 private:
  Tables& t_;
};

}  // namespace

Result<void> History::recordMessages(std::span<const StreamMessage> messages) {
  if (messages.empty()) return {};
  sqlite3* db = db_.get();
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
  LOCKSTEP_ASSIGN_OR_RETURN(auto tables, Tables::prepare(db));
  JobRows jobRows(*tables);
  NodeRows nodeRows(*tables);
  StreamRouter router([&](const std::string& jobId) -> RecordSink* { return tables->knownJob(jobId) ? &jobRows : nullptr; },
                      [&](const std::string&) -> RecordSink* { return &nodeRows; });
  router.read(messages);
  LOCKSTEP_TRY(tables->status());
  LOCKSTEP_ASSIGN_OR_RETURN(auto update, Statement::prepare(db, R"sql(
    UPDATE jobs SET kpis_stale = 1, step_reports = step_reports + ?2 WHERE job_id = ?1)sql"));
  for (const auto& [jobId, newSteps] : tables->touched()) LOCKSTEP_TRY(update.bind(1, jobId).bind(2, newSteps).run());
  return tx.commit();
}

}  // namespace lockstep::history
