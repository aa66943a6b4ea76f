#include "stream/stream_buffer.h"

#include <algorithm>

namespace lockstep::agent {

StreamBuffer::StreamBuffer(std::string node, std::uint64_t nextSeq, std::size_t capacity,
                           std::function<Result<void>(std::uint64_t)> reserve, std::uint64_t reserveBlock)
    : node_(std::move(node)),
      nextSeq_(std::max<std::uint64_t>(nextSeq, 1)),
      reservedUpTo_(nextSeq_ - 1),
      capacity_(std::max<std::size_t>(capacity, 1)),
      reserve_(std::move(reserve)),
      reserveBlock_(std::max<std::uint64_t>(reserveBlock, 1)) {}

Result<std::uint64_t> StreamBuffer::append(Payload payload) {
  pending_.push_back(std::move(payload));
  while (!pending_.empty()) {
    if (nextSeq_ > reservedUpTo_) {
      if (auto reserved = reserve_(reservedUpTo_ + reserveBlock_); !reserved) {
        while (pending_.size() > capacity_) {
          pending_.pop_front();
          ++droppedWaiting_;
        }
        return reserved.error();
      }
      reservedUpTo_ += reserveBlock_;
    }
    messages_.push_back(StreamMessage{nextSeq_++, node_, std::move(pending_.front())});
    pending_.pop_front();
  }
  while (messages_.size() > capacity_) messages_.pop_front();
  return lastSeq();
}

FetchReply StreamBuffer::fetch(std::uint64_t afterSeq, std::size_t max, std::uint64_t instanceId,
                               const Shows& shows) const {
  FetchReply reply{instanceId, firstSeq(), lastSeq(), {}};
  if (messages_.empty() || afterSeq >= lastSeq()) return reply;
  // Seqs in the buffer are consecutive: index straight to the first one wanted.
  const std::uint64_t from = std::max(afterSeq + 1, messages_.front().seq);
  for (std::size_t i = from - messages_.front().seq; i < messages_.size() && reply.messages.size() < max; ++i) {
    if (!shows || shows(messages_[i])) reply.messages.push_back(messages_[i]);
  }
  return reply;
}

}  // namespace lockstep::agent
