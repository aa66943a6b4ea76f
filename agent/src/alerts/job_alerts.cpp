#include "alerts/job_alerts.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "alerts/alert_desk.h"
#include "lockstep/client/agent_client.h"
#include "lockstep/common/clock.h"
#include "lockstep/kpi/frame.h"

namespace lockstep::agent {
namespace {

constexpr auto kFetchTimeout = std::chrono::seconds(5);
constexpr std::uint32_t kFetchMessages = 10'000;
constexpr int kFetchRounds = 4;  // a poll's batches of one node, at most
constexpr std::size_t kFetchesInFlight = 64;  // nodes asked at once: at most 64 batches held (48 MB)
// A round's answers are awaited until kFetchTimeout after it began; one asked late, at least this long.
constexpr auto kLateAnswer = std::chrono::milliseconds(250);
// A node that leaves a fetch unanswered after this long at least is silent (silent()): one asked late
// in a round held up by others, and given less, is not.
constexpr auto kSilentAfter = std::chrono::seconds(1);
constexpr std::int64_t kDiskEveryUs = 10'000'000;
constexpr std::size_t kKeptEvents = 1024;  // a client further behind misses the oldest

// Where the job writes on this node: the trainer's checkpoints, or a command job's working directory.
std::string writesIn(const JobSpec& spec) {
  if (!spec.checkpointDir.empty()) return spec.checkpointDir;
  return spec.command ? spec.command->workingDir : "";
}

}  // namespace

JobAlerts::JobAlerts(const JobSpec& spec, std::vector<alerts::Rule> rules, std::string self, AlertDesk& desk)
    : spec_(spec),
      rules_(std::move(rules)),
      self_(std::move(self)),
      desk_(desk),
      urls_(desk.webhooksFor(spec)),
      tracker_(spec),
      placement_(spec.ranks),
      book_(spec.jobId, rules_),
      createdUs_(unixMicrosNow()) {}

std::vector<alerts::Alert> JobAlerts::poll(const std::set<std::string>& nodes, const ClientOf& client) {
  read(nodes, client);
  // A snapshot of now over records not yet read to their end holds empty windows: a rule on
  // throughput would stop a healthy job.
  if (rules_.empty() || !caughtUp_) return {};
  measureDisk();
  const std::int64_t now = polledUs_;
  std::vector<alerts::Alert> fired;
  for (auto& alert : book_.evaluate(kpis_, facts_, now)) {
    // What the agents' streams held from before this supervision began (the agent started again,
    // or its standby took over) was published then: a stall of then is not a stall now.
    if (alert.timeUs < createdUs_) continue;
    desk_.publish(alert, urls_);
    if (alert.state == alerts::State::kFiring) fired.push_back(std::move(alert));
  }
  return fired;
}

// Each node a batch at a time, up to kFetchRounds batches of a node: a node whose stream holds much
// (the job ran long before its frame was asked for) is not read far ahead of the others, whose
// reports the engine needs to complete the same steps.
JobAlerts::Read JobAlerts::read(const std::set<std::string>& nodes, const ClientOf& client) {
  Read out{0, !nodes.empty()};
  silent_.clear();
  answered_.clear();
  std::vector<std::string> more(nodes.begin(), nodes.end());
  for (int round = 0; round < kFetchRounds && !more.empty(); ++round) {
    std::vector<std::string> again;
    readRound(more, client, [&](const std::string& node, const std::optional<Batch>& got) {
      out.complete = out.complete && got.has_value();
      out.taken += got ? got->taken : 0;
      if (got) answered_.insert(node);
      if (got && got->more) again.push_back(node);
    });
    more = std::move(again);
  }
  out.complete = out.complete && more.empty();
  caughtUp_ = !nodes.empty() &&
              std::all_of(nodes.begin(), nodes.end(), [&](const std::string& n) { return cursors_[n].reachedEnd; });
  polledUs_ = unixMicrosNow();
  kpis_ = tracker_.snapshot(polledUs_);
  return out;
}

// A batch of each node, kFetchesInFlight nodes asked at a time and the next asked as each answer is
// taken: a round waits about a round trip per kFetchesInFlight nodes, not one a node, and holds at
// most kFetchesInFlight batches (a catch-up's are 10,000 records each). Silent nodes hold a round
// up to kFetchTimeout together, not each, and those given kSilentAfter at least are named
// (silent()). `took` gets each node's batch, or nothing where it was not reached or did not answer.
void JobAlerts::readRound(const std::vector<std::string>& nodes, const ClientOf& client,
                          const std::function<void(const std::string&, const std::optional<Batch>&)>& took) {
  struct Asked {
    const std::string* node;
    AgentClient* client;
    std::chrono::steady_clock::time_point sent, deadline;
  };
  std::deque<Asked> asked;
  const auto roundEnds = std::chrono::steady_clock::now() + kFetchTimeout;
  for (std::size_t next = 0; next < nodes.size() || !asked.empty();) {
    while (asked.size() < kFetchesInFlight && next < nodes.size()) {
      const std::string& node = nodes[next++];
      AgentClient* c = client(node);
      if (c && c->sendFetch(cursors_[node].afterSeq, kFetchMessages)) {
        const auto now = std::chrono::steady_clock::now();
        asked.push_back({&node, c, now, std::max(roundEnds, now + kLateAnswer)});
      } else {
        took(node, std::nullopt);
      }
    }
    if (asked.empty()) continue;
    const Asked a = asked.front();
    asked.pop_front();
    auto reply = a.client->receiveFetch(a.deadline, kFetchTimeout);
    const bool timedOut = !reply && (reply.error().code == ErrorCode::kTimeout || reply.error().code == ErrorCode::kUnavailable);
    if (timedOut && a.deadline - a.sent >= kSilentAfter) silent_.push_back(*a.node);
    took(*a.node, take(*a.node, *a.client, std::move(reply)));
  }
}

void JobAlerts::lapsed() {
  for (auto& [node, at] : cursors_) at.reachedEnd = false;
  caughtUp_ = false;
}

// One batch of what the agent streamed after what was read last; an agent that started again
// (another instance) numbers its stream anew only if it lost it, and is then read from its start.
std::optional<JobAlerts::Batch> JobAlerts::take(const std::string& node, const AgentClient& client,
                                                Result<FetchReply> reply) {
  Cursor& at = cursors_[node];
  if (const auto& gpus = client.hello().gpus; !gpus.empty()) {
    for (const auto& g : gpus) facts_.gpuMemoryTotalBytes[{node, g.index}] = g.memoryTotalBytes;
  }
  if (!reply) return std::nullopt;
  if (reply->instanceId != at.instance && reply->lastSeq < at.afterSeq) {
    at.instance = reply->instanceId;
    at.afterSeq = 0;  // it lost what it held: read it again from its start
    at.reachedEnd = false;
    return Batch{0, true};
  }
  at.instance = reply->instanceId;
  Batch batch;
  for (const auto& message : reply->messages) {
    at.afterSeq = std::max(at.afterSeq, message.seq);
    batch.taken += take(message) ? 1 : 0;
  }
  // Fewer than asked for: the agent looked at everything it holds (the job's alone are shown).
  batch.more = reply->messages.size() >= kFetchMessages;
  if (!batch.more) {
    at.afterSeq = std::max(at.afterSeq, reply->lastSeq);
    at.reachedEnd = true;
  }
  return batch;
}

bool JobAlerts::take(const StreamMessage& message) {
  if (jobOf(message.payload) != spec_.jobId) return false;
  if (const auto* event = std::get_if<JobEvent>(&message.payload)) {
    book_.onEvent(*event);
    if (event->kind == JobEventKind::kStallEnded) stallEndedUs_ = std::max(stallEndedUs_, event->timeUnixUs);
    events_.push_back(StreamMessage{++eventCount_, message.node, *event});
    if (events_.size() > kKeptEvents) events_.pop_front();
    sharedEvents_.reset();
  }
  tracker_.add(message);
  return true;
}

std::shared_ptr<const JobFrame> JobAlerts::takeFrame(const std::optional<Stall>& stall, bool last) {
  auto f = std::make_shared<JobFrame>();
  f->ended = last;
  f->timeUnixUs = polledUs_;
  if (last && tracker_.lastReportUnixUs() > 0) {
    f->timeUnixUs = tracker_.lastReportUnixUs();
    kpis_ = tracker_.snapshot(f->timeUnixUs);
  }
  f->ranks = std::move(kpis_.ranks);
  f->gpus = std::move(kpis_.gpus);
  // A node the last read did not reach (silent, lost): its readings are not current.
  std::set<std::string, std::less<>> unread;
  for (const auto& p : placement_) {
    if (!answered_.count(p.node)) unread.insert(p.node);
  }
  kpi::withoutReadings(unread, f->ranks, f->gpus);
  f->nodeBlocks = kpi::nodeBlocks(placement_, f->ranks, f->gpus);
  f->head = std::move(kpis_);
  kpis_ = {};
  if (!sharedEvents_) sharedEvents_ = std::make_shared<const std::vector<StreamMessage>>(events_.begin(), events_.end());
  f->events = sharedEvents_;
  f->stall = stall;
  return f;
}

void JobAlerts::measureDisk() {
  const std::int64_t now = unixMicrosNow();
  const std::string dir = writesIn(spec_);
  if (dir.empty() || now - diskMeasuredUs_ < kDiskEveryUs) return;
  diskMeasuredUs_ = now;
  struct statvfs sv {};
  if (::statvfs(dir.c_str(), &sv) != 0 || sv.f_blocks == 0) return;
  facts_.diskFreePct[self_] = 100.0 * static_cast<double>(sv.f_bavail) / static_cast<double>(sv.f_blocks);
}

void JobAlerts::stalled(const Stall& stall) {
  if (stall.ranks.empty() || stall.sinceUnixUs <= stallEndedUs_) return;
  JobEvent e;
  e.jobId = spec_.jobId;
  e.kind = JobEventKind::kStalled;
  e.timeUnixUs = unixMicrosNow();  // seen now, as an agent's own event is (the stall began earlier)
  e.rank = stall.ranks.front();
  e.message = "stalled: " + stall.message;
  book_.onEvent(e);
}

void JobAlerts::ended(JobState state, const std::string& message) { book_.onEnded(state, message, unixMicrosNow()); }

void JobAlerts::restarted(const std::string& why, const JobSpec& attempt) {
  book_.onRestarted(why, unixMicrosNow());
  placement_ = attempt.ranks;
}

}  // namespace lockstep::agent
