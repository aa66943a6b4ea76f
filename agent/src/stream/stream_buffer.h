#pragma once
// Numbers every message the agent streams and keeps the newest ones, so that a client fetching
// from its last sequence number gets what it missed, once and in order.
//
// Sequence numbers never go backwards, even across agent restarts: before handing out numbers
// beyond what was last reserved, the buffer reserves the next block through a callback that
// persists it; a restarted agent starts after the last reserved block. A client then sees a jump
// (FetchReply.first_seq) where the restart lost buffered messages. A number is never handed out
// before it is reserved: while reserving fails (a full disk), new messages wait unnumbered (at
// most `capacity` of them, the oldest dropped and counted beyond) and are numbered, in order,
// once a reservation succeeds. Not thread-safe: the agent's event loop owns it.

#include <cstdint>
#include <deque>
#include <functional>
#include <string>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

class StreamBuffer {
 public:
  using Payload = decltype(StreamMessage::payload);
  static constexpr std::uint64_t kReserveBlock = 100'000;

  // nextSeq: the first number to hand out. reserve(upTo) must make upTo durable.
  StreamBuffer(std::string node, std::uint64_t nextSeq, std::size_t capacity,
               std::function<Result<void>(std::uint64_t upTo)> reserve, std::uint64_t reserveBlock = kReserveBlock);

  // Numbers and keeps the payload; returns its seq. When no number can be reserved, returns why
  // and keeps the payload waiting for one (see above).
  Result<std::uint64_t> append(Payload payload);
  std::size_t waiting() const { return pending_.size(); }
  std::uint64_t droppedWaiting() const { return droppedWaiting_; }

  // Messages with seq > afterSeq, at most max, of those `shows` lets through (all when unset). A
  // reply with no message means that none up to its lastSeq was let through.
  using Shows = std::function<bool(const StreamMessage&)>;
  FetchReply fetch(std::uint64_t afterSeq, std::size_t max, std::uint64_t instanceId, const Shows& shows = {}) const;
  bool hasAfter(std::uint64_t afterSeq) const { return lastSeq() > afterSeq; }
  std::uint64_t lastSeq() const { return nextSeq_ - 1; }
  std::uint64_t firstSeq() const { return messages_.empty() ? nextSeq_ : messages_.front().seq; }
  std::size_t size() const { return messages_.size(); }

 private:
  std::string node_;
  std::uint64_t nextSeq_;
  std::uint64_t reservedUpTo_;
  std::size_t capacity_;
  std::function<Result<void>(std::uint64_t)> reserve_;
  std::uint64_t reserveBlock_;
  std::deque<StreamMessage> messages_;
  std::deque<Payload> pending_;  // waiting for a number
  std::uint64_t droppedWaiting_ = 0;
};

}  // namespace lockstep::agent
