#pragma once
// Numbers every message the agent streams and keeps the newest ones, so that a client fetching
// from its last sequence number gets what it missed, once and in order.
//
// Sequence numbers never go backwards, even across agent restarts: before handing out numbers
// beyond what was last reserved, the buffer reserves the next block through a callback that
// persists it; a restarted agent starts after the last reserved block. A client then sees a jump
// (FetchReply.first_seq) where the restart lost buffered messages. Not thread-safe: the agent's
// event loop owns it.

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
               std::function<Result<void>(std::uint64_t upTo)> reserve);

  // Numbers and keeps the payload; returns its seq. A failed reservation is returned but the
  // message is kept (the stream goes on; only the restart guarantee is at risk).
  Result<std::uint64_t> append(Payload payload);

  // Messages with seq > afterSeq, at most max.
  FetchReply fetch(std::uint64_t afterSeq, std::size_t max, std::uint64_t instanceId) const;
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
  std::deque<StreamMessage> messages_;
};

}  // namespace lockstep::agent
