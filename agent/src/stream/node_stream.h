#pragma once
// The node's stream as the agent's components add to it (base/ports.h): every record is stamped
// with the test clock shift, shown to the metrics page (its tap) and numbered by the stream
// buffer, whose sequence numbers continue after the block an earlier run of the agent reserved
// (STATE/seq). Event loop only.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/log.h"
#include "base/ports.h"
#include "lockstep/common/result.h"
#include "stream/stream_buffer.h"

namespace lockstep::agent {

class NodeStream : public StreamPort {
 public:
  // Sees each record before it is numbered (prometheus/publisher.h).
  using Tap = std::function<void(const StreamPayload&)>;

  // capacity: the newest messages kept for clients that fetch them again.
  NodeStream(const std::string& stateDir, const std::string& node, std::size_t capacity, Log& log);

  void setTap(Tap tap) { tap_ = std::move(tap); }
  void append(StreamPayload payload) override;

  const StreamBuffer& buffer() const { return *buffer_; }
  std::uint64_t lastSeq() const { return buffer_->lastSeq(); }
  // This node's time as its stream stamps it.
  std::int64_t nowUnixUs() const;

 private:
  std::size_t capacity_;
  Log& log_;
  std::int64_t clockShiftUs_ = 0;  // LOCKSTEP_TEST_CLOCK_OFFSET_US
  std::unique_ptr<StreamBuffer> buffer_;
  Tap tap_;
  bool reserveFailing_ = false;
};

}  // namespace lockstep::agent
