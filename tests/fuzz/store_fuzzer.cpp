// libFuzzer target for the rendezvous store's frames (common/rendezvous/src/store_server.cpp), over a real
// loopback socket to a real StoreServer in this process.
//
// The first input byte picks what the bytes from the third on meet: bit 0, an open store (no
// secret) or one with a secret; bit 1 clear, the fuzzer first answers the store's challenge
// correctly as rank byte[1] % 4, so the request handlers see hostile bytes; bit 1 set, it sends
// them raw, before any answer (the unauthenticated door).
// After each input the connection closes, and every 64 inputs a well-behaved client must still be
// served: a crash, a hang (libFuzzer's -timeout) or a store that stops serving is a failure.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "lockstep/common/store.h"
#include "store_wire.h"

namespace {

using namespace lockstep;
using namespace std::chrono_literals;

struct Stores {
  std::string secret = newStoreSecret();
  std::unique_ptr<StoreServer> open;
  std::unique_ptr<StoreServer> closed;
};

StoreServerOptions fuzzOptions(const std::string& secret) {
  StoreServerOptions o;
  o.secret = secret;
  o.worldSize = 4;
  o.authDeadline = 200ms;
  o.maxKeys = 4096;
  o.maxStoredBytes = 8u << 20;
  o.maxGetWait = 50ms;  // an input's waiting Get must not outlive it by much
  return o;
}

Stores& stores() {
  static Stores* s = [] {
    auto* made = new Stores;
    auto open = StoreServer::start("127.0.0.1", 0, fuzzOptions(""));
    auto closed = StoreServer::start("127.0.0.1", 0, fuzzOptions(made->secret));
    if (!open || !closed) {
      std::fprintf(stderr, "store_fuzzer: cannot start the stores\n");
      std::abort();
    }
    made->open = std::move(open).value();
    made->closed = std::move(closed).value();
    return made;
  }();
  return *s;
}

std::pair<std::uint32_t, std::uint32_t> portsAboveTheEphemeralRange() {
  std::uint32_t low = 32768, high = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%u %u", &low, &high) != 2) high = 60999;
    std::fclose(f);
  }
  if (high + 1000 <= 65535) return {high + 1, 65535 - high};
  return {low - 1000, 1000};  // a range that reaches 65535: the thousand ports below it
}

// connect(), finishing one that a signal interrupted (libFuzzer's timers send them): the
// connection goes on in the kernel; wait for it and read its outcome.
bool connectRetryingSignals(int fd, const sockaddr_in& to) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) == 0) return true;
  if (errno != EINTR) return false;
  pollfd writable{fd, POLLOUT, 0};
  int polled;
  do {
    polled = ::poll(&writable, 1, 5000);
  } while (polled < 0 && errno == EINTR);
  if (polled <= 0) return false;
  int error = 0;
  socklen_t size = sizeof error;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) return false;
  errno = error;
  return error == 0;
}

int connectTo(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  // Never from the ephemeral port range: at 1500 connections a second that would keep taking the
  // free ports other tests pick for their servers (a command job's MASTER_PORT). Ports above the
  // range instead, from a new loopback source address each round, so that the TIME_WAIT the
  // store leaves (it closes first) never blocks a pair of addresses reused.
  static const auto [firstPort, ports] = portsAboveTheEphemeralRange();
  static std::uint32_t connections = 0;
  const std::uint32_t n = connections++;
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_port = htons(static_cast<std::uint16_t>(firstPort + n % ports));
  from.sin_addr.s_addr = htonl((127u << 24) | (1u << 16) | (1 + (n / ports) % 60000));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
    std::fprintf(stderr, "store_fuzzer: cannot bind a source address: %s\n", std::strerror(errno));
    std::abort();
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || !connectRetryingSignals(fd, a)) {
    std::fprintf(stderr, "store_fuzzer: cannot connect to the store: %s\n", std::strerror(errno));
    std::abort();
  }
  // Closed with a reset, not into TIME_WAIT: tens of thousands of inputs would use up the
  // ephemeral ports.
  const linger reset{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  return fd;
}

// Reads until the store closes the connection or 2 s pass; returns what came.
std::string drain(int fd, std::size_t atMost) {
  std::string in;
  char buf[65536];
  while (in.size() < atMost) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 2000) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  return in;
}

void sendBytes(int fd, const std::uint8_t* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
    if (n <= 0) return;  // the store closed it: fine
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Answers the challenge as `rank`, as a real client would.
bool answerChallenge(int fd, const std::string& secret, std::uint32_t rank) {
  std::string in;
  char buf[256];
  while (store_wire::completeFrame(in) < 0) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return false;
    in.append(buf, static_cast<size_t>(n));
  }
  store_wire::Reader r(std::string_view(in).substr(4));
  std::uint8_t code = 0;
  std::string nonce;
  if (!r.u8(code) || !r.raw(nonce, store_wire::kNonceBytes)) return false;
  const std::string answer =
      store_wire::Writer().u8(store_wire::kOpAuth).u32(rank).raw(store_wire::authMac(secret, nonce, rank)).frame();
  sendBytes(fd, reinterpret_cast<const std::uint8_t*>(answer.data()), answer.size());
  return true;
}

void checkStillServing(const StoreServer& server, const std::string& secret) {
  // A key no input can have taken first (a key belongs to the rank that set it).
  const std::string key = "fuzz/alive/" + lockstep::newStoreSecret();
  auto c = StoreClient::connect("127.0.0.1", server.port(), 2s, secret, 3);
  if (!c || !(*c)->set(key, "yes").ok()) {
    std::fprintf(stderr, "store_fuzzer: the store stopped serving a good client\n");
    std::abort();
  }
  auto v = (*c)->get(key, 2s);
  if (!v || *v != "yes") {
    std::fprintf(stderr, "store_fuzzer: a good client's key did not come back\n");
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  Stores& s = stores();
  const bool withSecret = (data[0] & 1) != 0;
  const bool raw = (data[0] & 2) != 0;
  const StoreServer& server = withSecret ? *s.closed : *s.open;
  const std::string secret = withSecret ? s.secret : std::string();
  const int fd = connectTo(server.port());
  if (!raw && !answerChallenge(fd, secret, data[1] % 4)) {
    ::close(fd);
    return 0;
  }
  sendBytes(fd, data + 2, size - 2);
  ::shutdown(fd, SHUT_WR);
  drain(fd, 64u << 20);
  ::close(fd);

  static unsigned inputs = 0;
  if (++inputs % 64 == 0) checkStillServing(server, secret);
  return 0;
}
