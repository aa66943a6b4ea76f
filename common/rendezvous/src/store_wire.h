#pragma once
// The rendezvous store's wire format, shared by its server and client (store.h). Private to common/.

#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::store_wire {

enum Op : std::uint8_t { kOpHello = 1, kOpSet = 2, kOpGet = 3, kOpHeartbeat = 4, kOpStatus = 5, kOpAuth = 6 };
enum Reply : std::uint8_t { kOk = 0, kValue = 1, kTimedOut = 2, kFailed = 3, kStatus = 4, kChallenge = 5 };

inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;
// What a connection may send before it authenticated: one frame, the answer (op, rank, MAC).
inline constexpr std::uint32_t kMaxAuthFrameBytes = 64;

class Writer {
 public:
  Writer& u8(std::uint8_t v);
  Writer& u32(std::uint32_t v);
  Writer& i64(std::int64_t v);
  Writer& str(std::string_view s);
  Writer& raw(std::string_view s);
  // The payload framed with its length prefix.
  std::string frame() const;
  const std::string& bytes() const { return buf_; }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool u8(std::uint8_t& v);
  bool u32(std::uint32_t& v);
  bool i64(std::int64_t& v);
  bool str(std::string& s);
  bool raw(std::string& s, std::size_t n);
  bool done() const { return data_.empty(); }

 private:
  std::string_view data_;
};

// The size of the first complete frame's payload in `in`, or -1 when more bytes are needed.
std::int64_t completeFrame(std::string_view in);
// The length the first frame announces (in.size() >= 4).
std::uint32_t announcedLength(std::string_view in);

// HMAC-SHA256(secret, "lockstep-store-v1" || nonce || rank), 32 bytes.
std::string authMac(const std::string& secret, std::string_view nonce, std::uint32_t rank);
bool macEqual(std::string_view a, std::string_view b);  // in constant time
std::string randomBytes(std::size_t n);

void setNoDelay(int fd);
std::string endpointName(const std::string& host, std::uint16_t port);

}  // namespace lockstep::store_wire
