#include "lockstep/common/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum Op : std::uint8_t { kOpHello = 1, kOpSet = 2, kOpGet = 3, kOpHeartbeat = 4, kOpStatus = 5 };
enum Reply : std::uint8_t { kOk = 0, kValue = 1, kTimedOut = 2, kFailed = 3, kStatus = 4 };

constexpr size_t kMaxKeys = 1u << 16;

class Writer {
 public:
  Writer& u8(std::uint8_t v) {
    buf_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& i64(std::int64_t v) {
    const auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.append(s);
    return *this;
  }
  // The payload framed with its length prefix.
  std::string frame() const {
    Writer f;
    f.u32(static_cast<std::uint32_t>(buf_.size()));
    return f.buf_ + buf_;
  }

 private:
  std::string buf_;
};

class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  bool u8(std::uint8_t& v) {
    if (data_.size() < 1) return false;
    v = static_cast<std::uint8_t>(data_[0]);
    data_.remove_prefix(1);
    return true;
  }
  bool u32(std::uint32_t& v) {
    if (data_.size() < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<std::uint8_t>(data_[i])) << (8 * i);
    data_.remove_prefix(4);
    return true;
  }
  bool i64(std::int64_t& v) {
    if (data_.size() < 8) return false;
    std::uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= std::uint64_t(static_cast<std::uint8_t>(data_[i])) << (8 * i);
    v = static_cast<std::int64_t>(u);
    data_.remove_prefix(8);
    return true;
  }
  bool str(std::string& s) {
    std::uint32_t n = 0;
    if (!u32(n) || data_.size() < n) return false;
    s.assign(data_.substr(0, n));
    data_.remove_prefix(n);
    return true;
  }

 private:
  std::string_view data_;
};

// Returns the size of the first complete frame's payload, or -1 when more bytes are needed.
std::int64_t completeFrame(const std::string& in) {
  if (in.size() < 4) return -1;
  std::uint32_t n = 0;
  Reader(in).u32(n);
  return in.size() >= 4 + size_t{n} ? std::int64_t{n} : -1;
}

std::uint32_t announcedLength(const std::string& in) {
  std::uint32_t n = 0;
  Reader(in).u32(n);
  return n;
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string endpointName(const std::string& host, std::uint16_t port) {
  return host + ":" + std::to_string(port);
}

}  // namespace

std::string_view rankPhaseName(RankPhase phase) {
  switch (phase) {
    case RankPhase::kStartup: return "starting up";
    case RankPhase::kCompute: return "computing";
    case RankPhase::kCommunicate: return "communicating";
    case RankPhase::kCheckpoint: return "writing a checkpoint";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Server

class StoreServer::Impl {
 public:
  Impl(int listenFd, int wakeFd, std::uint16_t port) : listenFd_(listenFd), wakeFd_(wakeFd), port_(port) {}
  ~Impl() {
    stop_ = true;
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wakeFd_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    for (auto& c : clients_) ::close(c->fd);
    ::close(listenFd_);
    ::close(wakeFd_);
  }

  void startThread() { thread_ = std::thread([this] { run(); }); }
  std::uint16_t port() const { return port_; }

  void noteRankExit(int rank, std::string note) {
    std::lock_guard lock(mutex_);
    ranks_[rank].exitNote = std::move(note);
  }

  std::vector<RankLiveness> liveness() const {
    std::lock_guard lock(mutex_);
    std::vector<RankLiveness> out;
    const auto now = Clock::now();
    for (const auto& [rank, info] : ranks_) {
      RankLiveness l;
      l.rank = rank;
      l.state = info.state;
      l.step = info.step;
      l.phase = info.phase;
      if (info.state != RankLiveness::State::kNeverSeen) {
        l.millisSinceHeartbeat = std::chrono::duration_cast<milliseconds>(now - info.lastBeat).count();
        l.millisInPhase = std::chrono::duration_cast<milliseconds>(now - info.phaseSince).count();
      }
      l.exitNote = info.exitNote;
      out.push_back(l);
    }
    return out;
  }

 private:
  struct Client {
    int fd;
    std::string in;
    std::string out;
    int rank = -1;
    bool eof = false;      // the peer closed its side; frames already read still count
    bool closing = false;  // drop the connection at the end of this round
  };
  struct PendingGet {
    Client* client;
    std::string key;
    Clock::time_point deadline;
  };
  struct RankInfo {
    RankLiveness::State state = RankLiveness::State::kNeverSeen;
    std::int64_t step = -1;
    RankPhase phase = RankPhase::kStartup;
    Clock::time_point phaseSince{};
    Clock::time_point lastBeat{};
    std::string exitNote;
  };

  void run() {
    while (!stop_) {
      std::vector<pollfd> fds;
      fds.push_back({wakeFd_, POLLIN, 0});
      fds.push_back({listenFd_, POLLIN, 0});
      for (auto& c : clients_) {
        fds.push_back({c->fd, static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
      }
      ::poll(fds.data(), fds.size(), pollTimeoutMillis());
      if (stop_) break;
      // Only the clients that were polled have entries in fds; new ones wait for the next round.
      const size_t polled = clients_.size();
      if (fds[1].revents & POLLIN) acceptClients();
      for (size_t i = 0; i < polled; ++i) {
        const short ev = fds[i + 2].revents;
        Client& c = *clients_[i];
        if (ev & (POLLIN | POLLHUP | POLLERR)) readFrom(c);
        if (!c.closing) handleFrames(c);
        if (c.eof) c.closing = true;
      }
      expirePending();
      for (auto& c : clients_) flush(*c);
      dropClosed();
    }
  }

  int pollTimeoutMillis() const {
    auto next = Clock::now() + milliseconds(1000);
    for (const auto& p : pending_) next = std::min(next, p.deadline);
    const auto left = std::chrono::duration_cast<milliseconds>(next - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left + 1, 0, 1000));
  }

  void acceptClients() {
    while (true) {
      const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      setNoDelay(fd);
      clients_.push_back(std::make_unique<Client>(Client{fd, {}, {}}));
    }
  }

  void readFrom(Client& c) {
    char buf[65536];
    while (true) {
      const ssize_t n = ::read(c.fd, buf, sizeof buf);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (c.in.size() >= 4 && announcedLength(c.in) > kStoreMaxFrameBytes) {
          c.closing = true;  // garbage or abuse: not a store client
          return;
        }
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) c.eof = true;
      return;
    }
  }

  void handleFrames(Client& c) {
    std::int64_t n;
    while ((n = completeFrame(c.in)) >= 0) {
      const std::string payload = c.in.substr(4, static_cast<size_t>(n));
      c.in.erase(0, 4 + static_cast<size_t>(n));
      if (!handle(c, payload)) {
        c.closing = true;
        return;
      }
    }
  }

  // Returns false for a malformed request: the connection is then closed.
  bool handle(Client& c, const std::string& payload) {
    Reader r(payload);
    std::uint8_t op = 0;
    if (!r.u8(op)) return false;
    switch (op) {
      case kOpHello: {
        std::uint32_t rank = 0;
        if (!r.u32(rank)) return false;
        c.rank = static_cast<int>(rank);
        {
          std::lock_guard lock(mutex_);
          auto& info = ranks_[c.rank];
          info.state = RankLiveness::State::kConnected;
          info.lastBeat = Clock::now();
          if (info.phaseSince == Clock::time_point{}) info.phaseSince = info.lastBeat;
        }
        c.out += Writer().u8(kOk).frame();
        return true;
      }
      case kOpSet: {
        std::string key, value;
        if (!r.str(key) || !r.str(value)) return false;
        if (data_.size() >= kMaxKeys && !data_.count(key)) {
          c.out += Writer().u8(kFailed).str("store is full (" + std::to_string(kMaxKeys) + " keys)").frame();
          return true;
        }
        data_[key] = value;
        c.out += Writer().u8(kOk).frame();
        for (auto it = pending_.begin(); it != pending_.end();) {
          if (it->key == key) {
            it->client->out += Writer().u8(kValue).str(value).frame();
            it = pending_.erase(it);
          } else {
            ++it;
          }
        }
        return true;
      }
      case kOpGet: {
        std::string key;
        std::uint32_t timeoutMillis = 0;
        if (!r.str(key) || !r.u32(timeoutMillis)) return false;
        if (auto it = data_.find(key); it != data_.end()) {
          c.out += Writer().u8(kValue).str(it->second).frame();
        } else {
          pending_.push_back({&c, key, Clock::now() + milliseconds(timeoutMillis)});
        }
        return true;
      }
      case kOpHeartbeat: {
        std::int64_t step = 0, millisInPhase = 0;
        std::uint8_t phase = 0;
        if (!r.i64(step) || !r.u8(phase) || !r.i64(millisInPhase) || phase > 3 || millisInPhase < 0) return false;
        if (c.rank >= 0) {
          std::lock_guard lock(mutex_);
          auto& info = ranks_[c.rank];
          info.step = step;
          info.lastBeat = Clock::now();
          info.phase = static_cast<RankPhase>(phase);
          info.phaseSince = info.lastBeat - milliseconds(millisInPhase);
        }
        c.out += Writer().u8(kOk).frame();
        return true;
      }
      case kOpStatus: {
        Writer w;
        w.u8(kStatus);
        const auto all = liveness();
        w.u32(static_cast<std::uint32_t>(all.size()));
        for (const auto& l : all) {
          w.u32(static_cast<std::uint32_t>(l.rank))
              .u8(static_cast<std::uint8_t>(l.state))
              .i64(l.step)
              .u8(static_cast<std::uint8_t>(l.phase))
              .i64(l.millisInPhase)
              .i64(l.millisSinceHeartbeat)
              .str(l.exitNote);
        }
        c.out += w.frame();
        return true;
      }
      default:
        return false;
    }
  }

  void expirePending() {
    const auto now = Clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->deadline <= now) {
        it->client->out += Writer().u8(kTimedOut).frame();
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void flush(Client& c) {
    while (!c.out.empty() && !c.closing) {
      const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out.erase(0, static_cast<size_t>(n));
      } else {
        if (n < 0 && errno != EAGAIN && errno != EINTR) c.closing = true;
        return;
      }
    }
  }

  void dropClosed() {
    for (auto it = clients_.begin(); it != clients_.end();) {
      Client* c = it->get();
      if (!c->closing) {
        ++it;
        continue;
      }
      std::erase_if(pending_, [c](const PendingGet& p) { return p.client == c; });
      if (c->rank >= 0) {
        std::lock_guard lock(mutex_);
        ranks_[c->rank].state = RankLiveness::State::kDisconnected;
      }
      ::close(c->fd);
      it = clients_.erase(it);
    }
  }

  const int listenFd_;
  const int wakeFd_;
  const std::uint16_t port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  // Touched only by the server thread.
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<PendingGet> pending_;
  std::map<std::string, std::string> data_;

  mutable std::mutex mutex_;  // guards ranks_
  std::map<int, RankInfo> ranks_;
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() = default;
std::uint16_t StoreServer::port() const { return impl_->port(); }
void StoreServer::noteRankExit(int rank, std::string note) { impl_->noteRankExit(rank, std::move(note)); }
std::vector<RankLiveness> StoreServer::liveness() const { return impl_->liveness(); }

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return invalidArgument("rendezvous store: cannot resolve " + host + ": " + ::gai_strerror(rc));
  }
  int fd = -1;
  int lastErrno = 0;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, 512) == 0) break;
    lastErrno = errno;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(found);
  if (fd < 0) {
    Error e = errnoError("rendezvous store: cannot listen on " + endpointName(host, port), lastErrno);
    if (lastErrno == EADDRINUSE) e.message += " (another job or store uses this port: pick another MASTER_PORT)";
    return e;
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const std::uint16_t bound = addr.ss_family == AF_INET6
                                  ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int err = errno;
    ::close(fd);
    return errnoError("rendezvous store: eventfd", err);
  }
  auto impl = std::make_unique<Impl>(fd, wake, bound);
  impl->startThread();
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

// ---------------------------------------------------------------------------------------------
// Client

namespace {

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

}  // namespace

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const std::string& host, std::uint16_t port,
                                                          milliseconds timeout) {
  auto fd = connectWithRetry(host, port, Clock::now() + timeout);
  if (!fd) {
    return Error{ErrorCode::kUnavailable, "cannot reach the rendezvous store at " + endpointName(host, port) +
                                              " within " + std::to_string(timeout.count()) + " ms (" +
                                              fd.error().message +
                                              "); check MASTER_ADDR/MASTER_PORT and that rank 0 is running"};
  }
  return std::unique_ptr<StoreClient>(new StoreClient(*fd, host, port));
}

StoreClient::StoreClient(int fd, std::string host, std::uint16_t port)
    : fd_(fd), host_(std::move(host)), port_(port) {}

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
  // Waits for the socket; a signal only ends the wait when the interrupt check says so.
  auto waitFor = [&](short events) -> Result<void> {
    while (true) {
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return timeoutError("rendezvous store: no reply in time");
      pollfd p{fd_, events, 0};
      const int rc = ::poll(&p, 1, static_cast<int>(left));
      if (rc > 0) return {};
      if (rc < 0 && errno == EINTR && interrupted_ && interrupted_()) {
        return Error{ErrorCode::kCancelled, "rendezvous store: interrupted by a stop request"};
      }
    }
  };
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd_, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      LOCKSTEP_TRY(waitFor(POLLOUT));
    } else if (n < 0 && errno != EINTR) {
      return Error{ErrorCode::kPeerLost, std::string("rendezvous store: send failed: ") + std::strerror(errno)};
    }
  }
  std::string in;
  std::int64_t len;
  while ((len = completeFrame(in)) < 0) {
    if (in.size() >= 4 && announcedLength(in) > kStoreMaxFrameBytes) {
      return internalError("rendezvous store: oversized reply");
    }
    char buf[65536];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
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

Result<std::string> StoreClient::call(const std::string& request, milliseconds timeout) {
  std::lock_guard lock(mutex_);
  const auto deadline = Clock::now() + timeout;
  if (fd_ < 0) {
    // An earlier call failed mid-exchange and dropped the connection: reconnect, and register
    // again, so that one slow reply does not mark this rank as gone for good.
    auto fd = connectWithRetry(host_, port_, std::min(deadline, Clock::now() + milliseconds(2000)));
    if (!fd) return Error{ErrorCode::kUnavailable, "rendezvous store unreachable: " + fd.error().message};
    fd_ = *fd;
    if (rank_ >= 0) {
      auto registered = exchange(Writer().u8(kOpHello).u32(static_cast<std::uint32_t>(rank_)).frame(), deadline);
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

Result<void> StoreClient::registerRank(int rank) {
  LOCKSTEP_TRY(expectOk(call(Writer().u8(kOpHello).u32(static_cast<std::uint32_t>(rank)).frame(), ioTimeout_)));
  std::lock_guard lock(mutex_);
  rank_ = rank;
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
