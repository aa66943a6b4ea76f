#include "stream/fetches.h"

#include <algorithm>

namespace lockstep::agent {
namespace {

using std::chrono::milliseconds;

constexpr std::size_t kFetchDefaultMessages = 2000;
constexpr std::size_t kFetchMaxMessages = 20000;
constexpr std::uint32_t kFetchMaxWaitMs = 30000;

}  // namespace

Fetches::Fetches(const NodeStream& stream, const JobManager& jobs, std::uint64_t instanceId, std::string node,
                 ReplyPort& replies)
    : stream_(stream), jobs_(jobs), instanceId_(instanceId), node_(std::move(node)), replies_(replies) {}

// Messages of jobs the client may not see do not answer it.
void Fetches::onFetch(const std::string& client, const std::string& key, const StreamScope& scope, std::uint64_t id,
                      const FetchRequest& body) {
  // What clients read (Slurm's end waits for it): a supervising agent reading its job's records
  // for alerts is not one of them.
  if (!scope.jobs) fetchedUpTo_ = std::max(fetchedUpTo_, body.afterSeq);
  const std::size_t max =
      std::min<std::size_t>(body.maxMessages > 0 ? body.maxMessages : kFetchDefaultMessages, kFetchMaxMessages);
  std::uint64_t after = body.afterSeq;
  if (stream_.buffer().hasAfter(after) || body.waitMs == 0) {
    FetchReply now = fetchFor(scope, body.jobsLeftOut, after, max);
    if (!now.messages.empty() || body.waitMs == 0) return replies_.reply(client, Reply{id, std::move(now)});
    after = std::max(after, now.lastSeq);  // nothing up to there is this client's
  }
  const auto waiting = static_cast<std::size_t>(
      std::count_if(waiting_.begin(), waiting_.end(), [&](const Waiting& f) { return f.key == key; }));
  if (waiting >= kMaxWaitingFetchesPerKey || waiting_.size() >= kMaxWaitingFetches) {
    return replies_.replyError(
        client, id,
        Error{ErrorCode::kResourceExhausted, "this client already has " + std::to_string(waiting) +
                                                 " Fetches waiting on node " + node_ + " (at most " +
                                                 std::to_string(kMaxWaitingFetchesPerKey) +
                                                 "): wait for their answers before asking again"});
  }
  waiting_.push_back(Waiting{client, key, id, after, max,
                             Clock::now() + milliseconds(std::min(body.waitMs, kFetchMaxWaitMs)), scope,
                             body.jobsLeftOut});
}

void Fetches::answer(bool onlyExpired) {
  const auto now = Clock::now();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const bool expired = now >= it->deadline;
    if (!expired && (onlyExpired || !stream_.buffer().hasAfter(it->afterSeq))) {
      ++it;
      continue;
    }
    FetchReply fetched = fetchFor(it->scope, it->leftOut, it->afterSeq, it->max);
    if (fetched.messages.empty() && !expired) {
      it->afterSeq = std::max(it->afterSeq, fetched.lastSeq);  // none of them is this client's: wait on
      ++it;
      continue;
    }
    replies_.reply(it->client, Reply{it->requestId, std::move(fetched)});
    it = waiting_.erase(it);
  }
}

void Fetches::revoke(const std::function<bool(const std::string&)>& gone, const Error& why) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (gone(it->key)) {
      replies_.replyError(it->client, it->requestId, why);
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

milliseconds Fetches::until(milliseconds timeout) const {
  for (const auto& f : waiting_) {
    timeout = std::min(timeout, std::chrono::duration_cast<milliseconds>(f.deadline - Clock::now()) + milliseconds(1));
  }
  return timeout;
}

// The stream as `scope` shows it, less the jobs the client reads fanned in: the node's own records
// and a user's jobs', or a supervising agent's jobs (a job this agent no longer knows is nobody's to
// see).
FetchReply Fetches::fetchFor(const StreamScope& scope, const std::vector<std::string>& leftOut, std::uint64_t afterSeq,
                             std::size_t max) const {
  const auto listed = [](const std::vector<std::string>& jobs, const std::string& job) {
    return std::find(jobs.begin(), jobs.end(), job) != jobs.end();
  };
  StreamBuffer::Shows shows;  // everything: an admin's key, leaving nothing out
  if (scope.jobs || scope.owner || !leftOut.empty()) shows = [&](const StreamMessage& m) {
    const std::string& job = jobOf(m.payload);
    if (!job.empty() && listed(leftOut, job)) return false;
    if (scope.jobs) return !job.empty() && listed(*scope.jobs, job);
    return !scope.owner || job.empty() || jobs_.ownerOf(job) == scope.owner;
  };
  FetchReply reply = stream_.buffer().fetch(afterSeq, max, instanceId_, shows);
  reply.jobsVersion = jobs_.jobsVersion();
  return reply;
}

}  // namespace lockstep::agent
