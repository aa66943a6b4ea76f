#include "stalls/stalls.h"

#include <algorithm>
#include <limits>

#include "base/off_loop.h"
#include "lockstep/client/elastic.h"
#include "lockstep/common/clock.h"
#include "lockstep/kpi/stall.h"
#include "lockstep/protocol/names.h"

namespace lockstep::agent {
namespace {

constexpr auto kStallTick = std::chrono::milliseconds(250);  // the progress shown; a stall is judged when due
constexpr std::size_t kMaxEvidenceEventBytes = 60 * 1024;    // a job event's text is at most 64 KiB

JobEvent jobEvent(const std::string& jobId, JobEventKind kind, std::string message) {
  JobEvent e;
  e.jobId = jobId;
  e.kind = kind;
  e.timeUnixUs = unixMicrosNow();
  e.message = std::move(message);
  return e;
}

std::string firstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

std::string clipped(std::string text, std::size_t max) {
  if (text.size() <= max) return text;
  text.resize(max);
  return text + "\n[cut at " + std::to_string(max / 1024) + " KiB]\n";
}

}  // namespace

Stalls::Stalls(std::string node, JobManager& jobs, StreamPort& stream, ReplyPort& replies, Log& log)
    : node_(std::move(node)), jobs_(jobs), stream_(stream), replies_(replies), log_(log) {}

void Stalls::withProgress(JobStatus& job) const {
  if (jobStateEnded(job.state)) return;
  job.progress = watch_.progressOf(job.spec.jobId);
  job.stall = watch_.stallOf(job.spec.jobId);
}

std::vector<EvidenceTarget> Stalls::evidenceTargets(const WatchedJob& job, std::optional<std::uint32_t> rank) const {
  const auto progress = watch_.progressOf(job.jobId);
  std::vector<EvidenceTarget> out;
  for (const auto& r : job.ranks) {
    if (rank && r.rank != *rank) continue;
    EvidenceTarget t{r, {}, 0, 0};
    t.progress.rank = r.rank;
    for (const auto& p : progress) {
      if (p.rank == r.rank) t.progress = p;
    }
    if (auto record = progress::read(r.progressPath)) {
      t.stackSignal = record->stackSignal;
      t.recordPid = record->pid;
    }
    out.push_back(std::move(t));
  }
  return out;
}

void Stalls::onStacks(const std::string& client, std::uint64_t id, const StacksRequest& request) {
  const WatchedJob job = jobs_.watched(request.jobId);
  auto targets = evidenceTargets(job, request.rank);
  if (targets.empty()) {
    const std::string which = request.rank ? "rank " + std::to_string(*request.rank) + " of job " : "job ";
    replies_.replyError(client, id,
                        notFound("no running " + which + request.jobId + " on " + node_ +
                                 " (lockstepctl status lists the jobs and where their ranks run)"));
    return;
  }
  const std::uint64_t taking = nextEvidenceId_++;
  if (auto submitted = evidence_.submit(taking, request.jobId, node_, std::move(targets)); !submitted) {
    replies_.replyError(client, id, submitted.error());
    return;
  }
  pending_[taking] = Pending{client, id, std::nullopt};
}

// The periodic read keeps the ranks' progress shown fresh; the stall itself is judged the moment its
// allowance runs out, not up to a tick and the loop's poll later (bench/stall_detection.sh).
std::chrono::milliseconds Stalls::untilDue() const {
  const std::int64_t due = watch_.dueUs();
  if (due == std::numeric_limits<std::int64_t>::max()) return std::chrono::milliseconds::max();
  const std::int64_t waitUs = std::max<std::int64_t>(0, due - unixMicrosNow());
  return std::chrono::milliseconds((waitUs + 999) / 1000);
}

void Stalls::tick() {
  const auto now = std::chrono::steady_clock::now();
  if (now < nextTick_ && unixMicrosNow() < watch_.dueUs()) return;
  nextTick_ = now + kStallTick;
  for (auto& change : watch_.tick(jobs_.watched())) {
    if (change.began) {
      stallBegan(std::move(change));
    } else {
      stallEnded(change);
    }
  }
}

void Stalls::stallEnded(const StallWatch::Change& change) {
  const auto stood = (unixMicrosNow() - change.stall.sinceUnixUs) / 1'000'000;
  stream_.append(jobEvent(change.jobId, JobEventKind::kStallEnded,
                          change.jobEnded ? "the job ended " + std::to_string(stood) + " s after its progress stopped"
                                          : "progress moved again after " + std::to_string(stood) + " s without"));
  log_.info("job " + change.jobId + (change.jobEnded ? ": ended while stalled" : ": progress moved again"));
}

void Stalls::stallBegan(StallWatch::Change change) {
  JobEvent stalled = jobEvent(change.jobId, JobEventKind::kStalled, "stalled: " + change.stall.message);
  if (!change.stall.ranks.empty()) stalled.rank = change.stall.ranks.front();  // the first rank behind
  stream_.append(std::move(stalled));
  log_.info("job " + change.jobId + " stalled: " + firstLine(change.stall.message));
  const std::uint64_t taking = nextEvidenceId_++;
  auto targets = evidenceTargets(jobs_.watched(change.jobId), std::nullopt);
  if (auto submitted = evidence_.submit(taking, change.jobId, node_, std::move(targets)); !submitted) {
    log_.error("job " + change.jobId + ": no evidence of its stall: " + submitted.error().message);
    stallEvidenced(change, StacksReply{change.jobId, {}});
    return;
  }
  pending_[taking] = Pending{"", 0, std::move(change)};
}

void Stalls::onEvidence() {
  for (auto& done : evidence_.take()) {
    auto waiting = takePending(pending_, done.id);
    if (!waiting) continue;
    const Pending& pending = *waiting;
    if (pending.stall) {
      stallEvidenced(*pending.stall, done.result);
    } else {
      replies_.reply(pending.client, Reply{pending.requestId, std::move(done.result)});
    }
  }
}

// The evidence goes into the job's events (and so its history and report), then the policy acts.
void Stalls::stallEvidenced(const StallWatch::Change& change, const StacksReply& evidence) {
  for (const auto& rank : evidence.ranks) {
    const std::string text = kpi::evidenceText(rank);
    JobEvent e = jobEvent(change.jobId, JobEventKind::kRankEvidence, firstLine(text));
    e.rank = rank.rank;
    e.step = rank.progress.step;
    e.logTail = clipped(text, kMaxEvidenceEventBytes);
    stream_.append(std::move(e));
  }
  // Only the stall the evidence is of: not one that ended, nor a later one.
  const auto now = watch_.stallOf(change.jobId);
  if (change.onStall == OnStall::kReport || !now || now->sinceUnixUs != change.stall.sinceUnixUs) return;
  const std::string why =
      std::string(change.onStall == OnStall::kStop ? kStallStopMessage : kStallRestartMessage) + change.stall.message;
  log_.info("job " + change.jobId + ": " + firstLine(why));
  if (auto failed = jobs_.fail(change.jobId, why); !failed)
    log_.info("job " + change.jobId + ": " + failed.error().message);
}

}  // namespace lockstep::agent
