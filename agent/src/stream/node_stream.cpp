#include "stream/node_stream.h"

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"

namespace lockstep::agent {

NodeStream::NodeStream(const std::string& stateDir, const std::string& node, std::size_t capacity, Log& log)
    : capacity_(capacity), log_(log) {
  // A test stands in for a node whose clock is off: its hellos' time and everything it streams
  // are stamped this much later than they happened.
  if (const char* shift = std::getenv("LOCKSTEP_TEST_CLOCK_OFFSET_US"))
    clockShiftUs_ = std::strtoll(shift, nullptr, 10);
  // Sequence numbers continue after the last block an earlier run of the agent reserved.
  const std::string seqPath = (std::filesystem::path(stateDir) / "seq").string();
  std::uint64_t nextSeq = 1;
  if (auto text = readFile(seqPath, 64)) {
    std::uint64_t reserved = 0;
    if (std::from_chars(text->data(), text->data() + text->size(), reserved).ec == std::errc()) nextSeq = reserved + 1;
  }
  buffer_ = std::make_unique<StreamBuffer>(node, nextSeq, capacity, [seqPath](std::uint64_t upTo) {
    return writeFileAtomic(seqPath, std::to_string(upTo) + "\n");
  });
}

std::int64_t NodeStream::nowUnixUs() const { return unixMicrosNow() + clockShiftUs_; }

void NodeStream::append(StreamPayload payload) {
  if (clockShiftUs_ != 0) std::visit([this](auto& record) { record.timeUnixUs += clockShiftUs_; }, payload);
  if (tap_) tap_(payload);
  // Said once per episode: while the state disk is full every append fails the same way.
  auto r = buffer_->append(std::move(payload));
  if (!r && !reserveFailing_) {
    log_.error("cannot reserve sequence numbers: " + r.error().message + "; new messages wait unnumbered (the newest " +
               std::to_string(capacity_) + ") until it can");
  } else if (r && reserveFailing_) {
    log_.info("sequence numbers reserved again; " + std::to_string(buffer_->droppedWaiting()) +
              " waiting message(s) were dropped so far");
  }
  reserveFailing_ = !r;
}

}  // namespace lockstep::agent
