#include "stream_buffer.h"

#include <algorithm>

namespace lockstep::agent {

StreamBuffer::StreamBuffer(std::string node, std::uint64_t nextSeq, std::size_t capacity,
                           std::function<Result<void>(std::uint64_t)> reserve)
    : node_(std::move(node)),
      nextSeq_(std::max<std::uint64_t>(nextSeq, 1)),
      reservedUpTo_(nextSeq_ - 1),
      capacity_(std::max<std::size_t>(capacity, 1)),
      reserve_(std::move(reserve)) {}

Result<std::uint64_t> StreamBuffer::append(Payload payload) {
  Result<void> reserved;
  if (nextSeq_ > reservedUpTo_) {
    reserved = reserve_(reservedUpTo_ + kReserveBlock);
    if (reserved) reservedUpTo_ += kReserveBlock;
  }
  const std::uint64_t seq = nextSeq_++;
  messages_.push_back(StreamMessage{seq, node_, std::move(payload)});
  while (messages_.size() > capacity_) messages_.pop_front();
  if (!reserved) return reserved.error();
  return seq;
}

FetchReply StreamBuffer::fetch(std::uint64_t afterSeq, std::size_t max, std::uint64_t instanceId) const {
  FetchReply reply{instanceId, firstSeq(), lastSeq(), {}};
  if (messages_.empty() || afterSeq >= lastSeq()) return reply;
  // Seqs in the buffer are consecutive: index straight to the first one wanted.
  const std::uint64_t from = std::max(afterSeq + 1, messages_.front().seq);
  for (std::size_t i = from - messages_.front().seq; i < messages_.size() && reply.messages.size() < max; ++i) {
    reply.messages.push_back(messages_[i]);
  }
  return reply;
}

}  // namespace lockstep::agent
