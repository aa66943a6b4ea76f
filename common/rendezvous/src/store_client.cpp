// The rendezvous store's client (store.h): connect, answer the challenge, then one request and
// its reply at a time.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "lockstep/common/store.h"
#include "store_wire.h"

namespace lockstep {
namespace {

using namespace store_wire;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Result<int> connectOnce(const addrinfo* ai, Clock::time_point deadline) {
  const int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) return errnoError("socket", errno);
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      const int err = errno;
      ::close(fd);
      return errnoError("connect", err);
    }
    pollfd p{fd, POLLOUT, 0};
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (::poll(&p, 1, static_cast<int>(std::max<long long>(left, 0))) <= 0) {
      ::close(fd);
      return Error{ErrorCode::kTimeout, "connect timed out"};
    }
    int soError = 0;
    socklen_t len = sizeof soError;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soError, &len);
    if (soError != 0) {
      ::close(fd);
      return errnoError("connect", soError);
    }
  }
  setNoDelay(fd);
  return fd;
}

Result<int> connectWithRetry(const std::string& host, std::uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  auto backoff = milliseconds(20);
  std::string lastError = "no address";
  while (true) {
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    if (rc == 0) {
      for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
        auto fd = connectOnce(ai, deadline);
        if (fd) {
          ::freeaddrinfo(found);
          return *fd;
        }
        lastError = fd.error().message;
      }
      ::freeaddrinfo(found);
    } else {
      lastError = std::string("cannot resolve host: ") + ::gai_strerror(rc);
    }
    if (Clock::now() + backoff >= deadline) return Error{ErrorCode::kUnavailable, lastError};
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(500));
  }
}

// One socket's side of the exchanges, before and after authentication: every wait ends at the
// deadline, and a signal ends it only when `interrupted` says so (a stop request).
struct Wire {
  int fd;
  Clock::time_point deadline;
  const std::function<bool()>* interrupted = nullptr;

  Result<void> waitFor(short events) const {
    while (true) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return timeoutError("rendezvous store: no reply in time");
      pollfd p{fd, events, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(left));
      if (rc > 0) return {};
      if (rc < 0 && errno == EINTR && interrupted != nullptr && *interrupted && (*interrupted)()) {
        return Error{ErrorCode::kCancelled, "rendezvous store: interrupted by a stop request"};
      }
    }
  }

  Result<void> send(const std::string& bytes) const {
    std::size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno == EAGAIN) {
        LOCKSTEP_TRY(waitFor(POLLOUT));
      } else if (n < 0 && errno != EINTR) {
        return Error{ErrorCode::kPeerLost, std::string("rendezvous store: send failed: ") + std::strerror(errno)};
      }
    }
    return {};
  }

  // One frame's payload.
  Result<std::string> read() const {
    std::string in;
    std::int64_t len;
    while ((len = completeFrame(in)) < 0) {
      if (in.size() >= 4 && announcedLength(in) > kStoreMaxFrameBytes) {
        return internalError("rendezvous store: oversized reply");
      }
      char buf[65536];
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) {
        in.append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        return Error{ErrorCode::kPeerLost, "rendezvous store closed the connection"};
      } else if (errno == EAGAIN) {
        LOCKSTEP_TRY(waitFor(POLLIN));
      } else if (errno != EINTR) {
        return Error{ErrorCode::kPeerLost, std::string("rendezvous store: recv failed: ") + std::strerror(errno)};
      }
    }
    return in.substr(4, static_cast<size_t>(len));
  }
};

// Answers the store's challenge: this rank, with the job's secret.
Result<void> authenticate(int fd, const std::string& secret, int rank, Clock::time_point deadline) {
  const Wire wire{fd, deadline};
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string challenge, wire.read());
  Reader r(challenge);
  std::uint8_t code = 255;
  std::string nonce;
  if (!r.u8(code) || code != kChallenge || !r.raw(nonce, kNonceBytes)) {
    return Error{ErrorCode::kPeerLost, "what answers there is not a Lockstep rendezvous store"};
  }
  const auto asRank = static_cast<std::uint32_t>(rank);
  LOCKSTEP_TRY(wire.send(Writer().u8(kOpAuth).u32(asRank).raw(authMac(secret, nonce, asRank)).frame()));
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string reply, wire.read());
  Reader answer(reply);
  if (answer.u8(code) && code == kOk) return {};
  std::string why = "it closed the connection";
  if (code == kFailed) answer.str(why);
  return Error{ErrorCode::kPermissionDenied,
               "the rendezvous store refused rank " + std::to_string(rank) + ": " + why +
                   " (LOCKSTEP_STORE_SECRET must be the one the store was started with)"};
}

// Connects and authenticates, retrying a store that is not up yet until the deadline.
Result<int> openAuthenticated(const std::string& host, std::uint16_t port, const std::string& secret, int rank,
                              Clock::time_point deadline) {
  LOCKSTEP_ASSIGN_OR_RETURN(const int fd, connectWithRetry(host, port, deadline));
  if (auto ok = authenticate(fd, secret, rank, std::min(deadline, Clock::now() + milliseconds(10000))); !ok) {
    ::close(fd);
    return ok.error();
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const std::string& host, std::uint16_t port,
                                                          milliseconds timeout, const std::string& secret, int rank) {
  if (!isValidStoreSecret(secret)) {
    return invalidArgument("LOCKSTEP_STORE_SECRET is not 64 hex digits (the agent or launcher gives each job one)");
  }
  if (rank < 0) return invalidArgument("a rendezvous store client needs its rank");
  auto fd = openAuthenticated(host, port, secret, rank, Clock::now() + timeout);
  if (!fd) {
    if (fd.error().code == ErrorCode::kPermissionDenied) return fd.error();
    return Error{ErrorCode::kUnavailable, "cannot reach the rendezvous store at " + endpointName(host, port) +
                                              " within " + std::to_string(timeout.count()) + " ms (" +
                                              fd.error().message +
                                              "); check MASTER_ADDR/MASTER_PORT and that rank 0 is running"};
  }
  return std::unique_ptr<StoreClient>(new StoreClient(*fd, host, port, secret, rank));
}

StoreClient::StoreClient(int fd, std::string host, std::uint16_t port, std::string secret, int rank)
    : fd_(fd), host_(std::move(host)), port_(port), secret_(std::move(secret)), rank_(rank) {}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::setInterruptCheck(std::function<bool()> interrupted) {
  std::lock_guard lock(mutex_);
  interrupted_ = std::move(interrupted);
}

std::string StoreClient::localAddress() const {
  std::lock_guard lock(mutex_);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&addr)->sin6_addr, text, sizeof text);
  } else {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
  }
  return text;
}

Result<std::string> StoreClient::exchange(const std::string& request, Clock::time_point deadline) {
  const Wire wire{fd_, deadline, &interrupted_};
  LOCKSTEP_TRY(wire.send(request));
  return wire.read();
}

Result<std::string> StoreClient::call(const std::string& request, milliseconds timeout) {
  std::lock_guard lock(mutex_);
  const auto deadline = Clock::now() + timeout;
  if (fd_ < 0) {
    // An earlier call failed mid-exchange and dropped the connection: reconnect, and register
    // again, so that one slow reply does not mark this rank as gone for good.
    auto fd = openAuthenticated(host_, port_, secret_, rank_, std::min(deadline, Clock::now() + milliseconds(2000)));
    if (!fd) return Error{fd.error().code == ErrorCode::kPermissionDenied ? ErrorCode::kPermissionDenied : ErrorCode::kUnavailable,
                          "rendezvous store unreachable: " + fd.error().message};
    fd_ = *fd;
    if (registered_) {
      auto registered = exchange(Writer().u8(kOpHello).frame(), deadline);
      if (!registered) {
        ::close(fd_);
        fd_ = -1;
        return registered.error();
      }
    }
  }
  auto reply = exchange(request, deadline);
  if (!reply) {
    // The stream's state is unknown (a reply may still arrive): start afresh next time.
    ::close(fd_);
    fd_ = -1;
  }
  return reply;
}

namespace {

Result<void> expectOk(const Result<std::string>& reply) {
  if (!reply) return reply.error();
  Reader r(*reply);
  std::uint8_t code = 255;
  r.u8(code);
  if (code == kOk) return {};
  std::string message = "unexpected reply";
  if (code == kFailed) r.str(message);
  return Error{ErrorCode::kFailedPrecondition, "rendezvous store: " + message};
}

}  // namespace

Result<void> StoreClient::set(const std::string& key, const std::string& value) {
  return expectOk(call(Writer().u8(kOpSet).str(key).str(value).frame(), ioTimeout_));
}

Result<std::string> StoreClient::get(const std::string& key, milliseconds timeout) {
  const auto millis = static_cast<std::uint32_t>(std::clamp<long long>(timeout.count(), 0, 0x7fffffff));
  auto reply = call(Writer().u8(kOpGet).str(key).u32(millis).frame(), timeout + ioTimeout_);
  if (!reply) return reply.error();
  Reader r(*reply);
  std::uint8_t code = 255;
  r.u8(code);
  if (code == kValue) {
    std::string value;
    if (r.str(value)) return value;
  } else if (code == kTimedOut) {
    return timeoutError("rendezvous store: key '" + key + "' did not appear within " +
                        std::to_string(timeout.count()) + " ms");
  }
  return internalError("rendezvous store: malformed reply to get");
}

Result<void> StoreClient::registerRank() {
  LOCKSTEP_TRY(expectOk(call(Writer().u8(kOpHello).frame(), ioTimeout_)));
  std::lock_guard lock(mutex_);
  registered_ = true;
  return {};
}

Result<void> StoreClient::heartbeat(std::int64_t step, RankPhase phase, std::int64_t millisInPhase) {
  // Short: a heartbeat stuck on a hung store must not hold the connection when a failure needs
  // diagnosing.
  return expectOk(call(Writer().u8(kOpHeartbeat).i64(step).u8(static_cast<std::uint8_t>(phase)).i64(millisInPhase).frame(),
                       std::chrono::seconds(2)));
}

Result<std::vector<RankLiveness>> StoreClient::status(milliseconds timeout) {
  auto reply = call(Writer().u8(kOpStatus).frame(), timeout);
  if (!reply) return reply.error();
  Reader r(*reply);
  std::uint8_t code = 255;
  std::uint32_t count = 0;
  if (!r.u8(code) || code != kStatus || !r.u32(count)) return internalError("rendezvous store: malformed status");
  std::vector<RankLiveness> out;
  for (std::uint32_t i = 0; i < count; ++i) {
    RankLiveness l;
    std::uint32_t rank = 0;
    std::uint8_t state = 0, phase = 0;
    if (!r.u32(rank) || !r.u8(state) || !r.i64(l.step) || !r.u8(phase) || !r.i64(l.millisInPhase) ||
        !r.i64(l.millisSinceHeartbeat) || !r.str(l.exitNote)) {
      return internalError("rendezvous store: malformed status entry");
    }
    l.rank = static_cast<int>(rank);
    l.state = static_cast<RankLiveness::State>(std::min<std::uint8_t>(state, 2));
    l.phase = static_cast<RankPhase>(std::min<std::uint8_t>(phase, 3));
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace lockstep
