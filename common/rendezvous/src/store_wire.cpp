#include "store_wire.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sodium.h>
#include <sys/socket.h>

#include <stdexcept>

#include "lockstep/common/store.h"

namespace lockstep::store_wire {

Writer& Writer::u8(std::uint8_t v) {
  buf_.push_back(static_cast<char>(v));
  return *this;
}

Writer& Writer::u32(std::uint32_t v) {
  for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return *this;
}

Writer& Writer::i64(std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  return *this;
}

Writer& Writer::str(std::string_view s) {
  u32(static_cast<std::uint32_t>(s.size()));
  buf_.append(s);
  return *this;
}

Writer& Writer::raw(std::string_view s) {
  buf_.append(s);
  return *this;
}

std::string Writer::frame() const {
  Writer f;
  f.u32(static_cast<std::uint32_t>(buf_.size()));
  return f.buf_ + buf_;
}

bool Reader::u8(std::uint8_t& v) {
  if (data_.size() < 1) return false;
  v = static_cast<std::uint8_t>(data_[0]);
  data_.remove_prefix(1);
  return true;
}

bool Reader::u32(std::uint32_t& v) {
  if (data_.size() < 4) return false;
  v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<std::uint8_t>(data_[i])) << (8 * i);
  data_.remove_prefix(4);
  return true;
}

bool Reader::i64(std::int64_t& v) {
  if (data_.size() < 8) return false;
  std::uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= std::uint64_t(static_cast<std::uint8_t>(data_[i])) << (8 * i);
  v = static_cast<std::int64_t>(u);
  data_.remove_prefix(8);
  return true;
}

bool Reader::str(std::string& s) {
  std::uint32_t n = 0;
  if (!u32(n) || data_.size() < n) return false;
  s.assign(data_.substr(0, n));
  data_.remove_prefix(n);
  return true;
}

bool Reader::raw(std::string& s, std::size_t n) {
  if (data_.size() < n) return false;
  s.assign(data_.substr(0, n));
  data_.remove_prefix(n);
  return true;
}

std::int64_t completeFrame(std::string_view in) {
  if (in.size() < 4) return -1;
  const std::uint32_t n = announcedLength(in);
  return in.size() >= 4 + std::size_t{n} ? std::int64_t{n} : -1;
}

std::uint32_t announcedLength(std::string_view in) {
  std::uint32_t n = 0;
  Reader(in).u32(n);
  return n;
}

namespace {

void initSodium() {
  static const int ready = sodium_init();
  if (ready < 0) throw std::runtime_error("libsodium could not be initialised");
}

}  // namespace

std::string authMac(const std::string& secret, std::string_view nonce, std::uint32_t rank) {
  initSodium();
  Writer rankBytes;
  rankBytes.u32(rank);
  const std::string message = std::string("lockstep-store-v1") + std::string(nonce) + rankBytes.bytes();
  unsigned char mac[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256_state state;
  crypto_auth_hmacsha256_init(&state, reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  crypto_auth_hmacsha256_update(&state, reinterpret_cast<const unsigned char*>(message.data()), message.size());
  crypto_auth_hmacsha256_final(&state, mac);
  return std::string(reinterpret_cast<const char*>(mac), sizeof mac);
}

bool macEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string randomBytes(std::size_t n) {
  initSodium();
  std::string out(n, '\0');
  randombytes_buf(out.data(), out.size());
  return out;
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string endpointName(const std::string& host, std::uint16_t port) { return host + ":" + std::to_string(port); }

}  // namespace lockstep::store_wire

namespace lockstep {

std::string newStoreSecret() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : store_wire::randomBytes(32)) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

}  // namespace lockstep
