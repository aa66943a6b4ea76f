// libFuzzer target (issue 3): the protocol decoders and validators must refuse any input with an
// error, never crash, hang or read out of bounds; and whatever decodes must survive a round trip.
// The first byte picks the decoder. Built with clang -fsanitize=fuzzer,address,undefined.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "lockstep/protocol/codec.h"

namespace {

[[noreturn]] void roundTripBroke(const char* what) {
  __builtin_printf("round trip of a decoded %s failed\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      if (auto r = lockstep::decodeRequest(bytes)) {
        auto again = lockstep::decodeRequest(lockstep::encode(*r));
        if (!again || !(*again == *r)) roundTripBroke("request");
      }
      break;
    case 1:
      if (auto r = lockstep::decodeReply(bytes)) {
        auto again = lockstep::decodeReply(lockstep::encode(*r));
        if (!again || !(*again == *r)) roundTripBroke("reply");
      }
      break;
    case 2:
      if (auto r = lockstep::decodeStreamMessage(bytes)) {
        auto again = lockstep::decodeStreamMessage(lockstep::encode(*r));
        if (!again || !(*again == *r)) roundTripBroke("stream message");
      }
      break;
    default:
      if (auto spec = lockstep::jobSpecFromJson(bytes)) {
        auto again = lockstep::jobSpecFromJson(lockstep::jobSpecToJson(*spec));
        if (!again || !(*again == *spec)) roundTripBroke("job spec");
      }
      break;
  }
  return 0;
}
