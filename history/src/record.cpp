// Writing the stream into the history: each record into its table (tables.h, record_rows.h),
// told apart by the one stream reader (protocol/stream.h). A job's records are kept once the job
// is recorded; a node's network while one of the recorded jobs runs on it.

#include <map>
#include <optional>
#include <set>

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

class TableWriter : public RecordSink {
 public:
  static Result<std::unique_ptr<TableWriter>> prepare(sqlite3* db) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto known, Statement::prepare(db, "SELECT 1 FROM jobs WHERE job_id = ?1"));
    // The latest end of a part on the node; a part still running ends never.
    LOCKSTEP_ASSIGN_OR_RETURN(auto busy, Statement::prepare(db, R"sql(
      SELECT max(CASE WHEN ended_us = 0 THEN 9223372036854775807 ELSE ended_us END) FROM job_parts WHERE node = ?1)sql"));
    LOCKSTEP_ASSIGN_OR_RETURN(auto events, prepareInsert<JobEvent>(db));
    LOCKSTEP_ASSIGN_OR_RETURN(auto steps, prepareInsert<StepReport>(db));
    LOCKSTEP_ASSIGN_OR_RETURN(auto processes, prepareInsert<ProcessSample>(db));
    LOCKSTEP_ASSIGN_OR_RETURN(auto gpus, prepareInsert<GpuSample>(db));
    LOCKSTEP_ASSIGN_OR_RETURN(auto nets, prepareInsert<NetSample>(db));
    return std::unique_ptr<TableWriter>(new TableWriter(db, std::move(known), std::move(busy), std::move(events), std::move(steps),
                                                        std::move(processes), std::move(gpus), std::move(nets)));
  }

  void onEvent(const std::string& node, const JobEvent& e) override {
    if (!knownJob(e.jobId)) return;
    events_.bind(1, node);
    insert(events_, 2, e, e.jobId, false);
  }
  void onStep(const std::string& node, const StepReport& r) override {
    if (!knownJob(r.jobId)) return;
    steps_.bind(1, node);
    insert(steps_, 2, r, r.jobId, true);
  }
  void onProcess(const std::string& node, const ProcessSample& p) override {
    if (!knownJob(p.jobId)) return;
    processes_.bind(1, node).bind(2, std::int64_t{0});
    insert(processes_, 3, p, p.jobId, false);
  }
  void onGpu(const std::string& node, const GpuSample& g) override {
    if (g.jobId.empty() || !knownJob(g.jobId)) return;  // an idle GPU: the node's, not kept
    GpuSample sample = g;
    if (sample.node.empty()) sample.node = node;
    gpus_.bind(1, std::int64_t{0});
    insert(gpus_, 2, sample, g.jobId, false);
  }
  void onNet(const std::string& node, const NetSample& n) override {
    if (!busyNode(node, n.timeUnixUs)) return;
    nets_.bind(1, std::int64_t{0});
    insert(nets_, 2, n, std::string(), false);
  }

  // The first error, if any; nothing is written after it.
  Result<void>& status() { return status_; }
  // Jobs written to, with the step reports new to each.
  const std::map<std::string, std::int64_t>& touched() const { return touched_; }

 private:
  TableWriter(sqlite3* db, Statement known, Statement busy, Statement events, Statement steps, Statement processes,
              Statement gpus, Statement nets)
      : db_(db), known_(std::move(known)), busy_(std::move(busy)), events_(std::move(events)), steps_(std::move(steps)),
        processes_(std::move(processes)), gpus_(std::move(gpus)), nets_(std::move(nets)) {}

  bool knownJob(const std::string& jobId) {
    if (!status_) return false;
    auto [it, fresh] = knownJobs_.try_emplace(jobId, false);
    if (fresh) it->second = ask(known_, [&](Statement& s) { s.bind(1, jobId); });
    return it->second;
  }
  bool busyNode(const std::string& node, std::int64_t timeUs) {
    if (!status_) return false;
    auto [it, fresh] = lastEnds_.try_emplace(node, std::nullopt);
    if (fresh) {
      busy_.bind(1, node);
      auto row = busy_.step();
      if (!row) status_ = row.error();
      if (row && *row && !busy_.null(0)) it->second = busy_.i64(0);
      (void)busy_.reset();
    }
    return it->second && *it->second >= timeUs - detail::kNodeMarginUs;
  }
  template <class Bind>
  bool ask(Statement& query, Bind bind) {
    bind(query);
    auto row = query.step();
    if (!row) status_ = row.error();
    (void)query.reset();
    return row && *row;
  }
  template <class R>
  void insert(Statement& s, int first, const R& record, const std::string& jobId, bool isStep) {
    detail::bindRecord(s, first, record);
    auto stepped = s.step();
    const bool inserted = stepped && sqlite3_changes(db_) > 0;  // 0: replayed, stored already
    (void)s.reset();
    if (!stepped) {
      status_ = stepped.error();
      return;
    }
    if (inserted && !jobId.empty()) touched_[jobId] += isStep ? 1 : 0;
  }

  sqlite3* db_;
  Statement known_, busy_, events_, steps_, processes_, gpus_, nets_;
  std::map<std::string, bool, std::less<>> knownJobs_;
  std::map<std::string, std::optional<std::int64_t>, std::less<>> lastEnds_;  // per node: its parts' latest end
  std::map<std::string, std::int64_t> touched_;
  Result<void> status_;
};

}  // namespace

Result<void> History::recordMessages(std::span<const StreamMessage> messages) {
  if (messages.empty()) return {};
  sqlite3* db = db_.get();
  LOCKSTEP_ASSIGN_OR_RETURN(auto tx, Transaction::begin(db));
  LOCKSTEP_ASSIGN_OR_RETURN(auto writer, TableWriter::prepare(db));
  for (const StreamMessage& m : messages) visitRecord(m, *writer);
  LOCKSTEP_TRY(writer->status());
  LOCKSTEP_ASSIGN_OR_RETURN(auto update, Statement::prepare(db, R"sql(
    UPDATE jobs SET kpis_stale = 1, step_reports = step_reports + ?2 WHERE job_id = ?1)sql"));
  for (const auto& [jobId, newSteps] : writer->touched()) LOCKSTEP_TRY(update.bind(1, jobId).bind(2, newSteps).run());
  return tx.commit();
}

}  // namespace lockstep::history
