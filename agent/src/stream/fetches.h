#pragma once
// Fetch, the long poll (docs/agent.md): a request is answered at once when the stream holds
// something newer than the client's last sequence number that the client may see, else held
// until it does or its wait runs out. A client sees the node's own records and its user's jobs'
// (every job's for an admin's key or a supervising agent's). Bounded: at most
// kMaxWaitingFetchesPerKey held per client key, kMaxWaitingFetches in all. Event loop only.

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "access/access_policy.h"
#include "base/ports.h"
#include "jobs/jobs.h"
#include "lockstep/protocol/types.h"
#include "stream/node_stream.h"

namespace lockstep::agent {

class Fetches {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::size_t kMaxWaitingFetchesPerKey = 16;
  static constexpr std::size_t kMaxWaitingFetches = 1024;

  Fetches(const NodeStream& stream, const JobManager& jobs, std::uint64_t instanceId, std::string node,
          ReplyPort& replies);

  // scope: what of the stream the client sees.
  void onFetch(const std::string& client, const std::string& key, const StreamScope& scope, std::uint64_t id,
               const FetchRequest& body);
  // Answers the held fetches that something newer came for (unless onlyExpired) and those whose
  // wait ran out.
  void answer(bool onlyExpired);
  // Refuses, with `why`, the held fetches of the keys `gone` says left the authorized keys.
  void revoke(const std::function<bool(const std::string& key)>& gone, const Error& why);
  // `timeout`, or less when a held fetch's wait ends sooner.
  std::chrono::milliseconds until(std::chrono::milliseconds timeout) const;
  // The newest sequence number a client asked for what follows.
  std::uint64_t fetchedUpTo() const { return fetchedUpTo_; }

 private:
  struct Waiting {
    std::string client;
    std::string key;
    std::uint64_t requestId;
    std::uint64_t afterSeq;
    std::size_t max;
    Clock::time_point deadline;
    StreamScope scope;
    std::vector<std::string> leftOut;
  };

  FetchReply fetchFor(const StreamScope& scope, const std::vector<std::string>& leftOut, std::uint64_t afterSeq,
                      std::size_t max) const;

  const NodeStream& stream_;
  const JobManager& jobs_;
  std::uint64_t instanceId_;
  std::string node_;
  ReplyPort& replies_;
  std::deque<Waiting> waiting_;
  std::uint64_t fetchedUpTo_ = 0;
};

}  // namespace lockstep::agent
