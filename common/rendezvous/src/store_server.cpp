// The rendezvous store's server (store.h): one thread polling every connection; authentication
// first, then bounded keys, bytes, waiting Gets and unread replies.

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <map>
#include <thread>

#include "lockstep/common/store.h"
#include "store_wire.h"

namespace lockstep {
namespace {

using namespace store_wire;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::int64_t kMaxHeartbeatStep = std::int64_t{1} << 62;
constexpr std::int64_t kMaxMillisInPhase = 10'000'000'000;  // about 115 days

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

class StoreServer::Impl {
 public:
  Impl(int listenFd, int wakeFd, std::uint16_t port, StoreServerOptions options)
      : listenFd_(listenFd), wakeFd_(wakeFd), port_(port), options_(std::move(options)),
        spareFd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}
  ~Impl() {
    stop_ = true;
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wakeFd_, &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    for (auto& c : clients_) ::close(c->fd);
    ::close(listenFd_);
    ::close(wakeFd_);
    if (spareFd_ >= 0) ::close(spareFd_);
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
    Clock::time_point accepted;
    std::string nonce;  // the challenge it must answer
    std::string in;
    std::string out;
    int rank = -1;  // once authenticated
    bool registered = false;
    std::size_t waiting = 0;  // its Gets that wait for a key
    bool eof = false;      // the peer closed its side; frames already read still count
    bool closing = false;  // drop the connection at the end of this round
    bool authenticated() const { return rank >= 0; }
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
  struct Entry {
    std::string value;
    int owner;  // the rank that set it first: only that rank may set it again
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
      expire();
      for (auto& c : clients_) flush(*c);
      dropClosed();
    }
  }

  int pollTimeoutMillis() const {
    auto next = Clock::now() + milliseconds(1000);
    for (const auto& p : pending_) next = std::min(next, p.deadline);
    for (const auto& c : clients_) {
      if (!c->authenticated()) next = std::min(next, c->accepted + options_.authDeadline);
    }
    const auto left = std::chrono::duration_cast<milliseconds>(next - Clock::now()).count();
    return static_cast<int>(std::clamp<long long>(left + 1, 0, 1000));
  }

  void acceptClients() {
    while (true) {
      const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if ((errno == EMFILE || errno == ENFILE) && spareFd_ >= 0) shedOneConnection();
        return;
      }
      const std::size_t authenticated =
          static_cast<std::size_t>(std::count_if(clients_.begin(), clients_.end(), [](const auto& c) { return c->authenticated(); }));
      if (authenticated >= options_.maxConnections) {
        ::close(fd);
        continue;
      }
      evictOldestUnauthenticatedBeyond(options_.maxUnauthenticated - 1);
      setNoDelay(fd);
      auto client = std::make_unique<Client>();
      client->fd = fd;
      client->accepted = Clock::now();
      client->nonce = randomBytes(kNonceBytes);
      client->out = Writer().u8(kChallenge).raw(client->nonce).frame();
      clients_.push_back(std::move(client));
    }
  }

  // Out of file descriptors: the kernel keeps saying the listening socket is readable. Take the
  // waiting connection with the descriptor kept for this, and close it, so that poll() waits again
  // instead of spinning.
  void shedOneConnection() {
    ::close(spareFd_);
    const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) ::close(fd);
    spareFd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  void evictOldestUnauthenticatedBeyond(std::size_t keep) {
    std::vector<Client*> waiting;
    for (auto& c : clients_) {
      if (!c->authenticated() && !c->closing) waiting.push_back(c.get());
    }
    if (waiting.size() <= keep) return;
    std::sort(waiting.begin(), waiting.end(), [](const Client* a, const Client* b) { return a->accepted < b->accepted; });
    for (std::size_t i = 0; i < waiting.size() - keep; ++i) waiting[i]->closing = true;
  }

  void readFrom(Client& c) {
    char buf[65536];
    const std::uint32_t maxFrame = c.authenticated() ? kStoreMaxFrameBytes : kMaxAuthFrameBytes;
    // At most one largest frame is held unhandled: the rest waits in the socket (poll says so again).
    while (c.in.size() < 4 + std::size_t{maxFrame}) {
      const ssize_t n = ::read(c.fd, buf, c.authenticated() ? sizeof buf : 4 + kMaxAuthFrameBytes);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        if (c.in.size() >= 4 && announcedLength(c.in) > maxFrame) {
          c.closing = true;  // garbage or abuse: not a store client
          return;
        }
        if (!c.authenticated() && c.in.size() > 4 + kMaxAuthFrameBytes) {
          c.closing = true;  // more than the one frame it may send before it answered
          return;
        }
        if (!c.authenticated()) return;  // one frame at most: it is handled before reading on
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) c.eof = true;
      return;
    }
  }

  void handleFrames(Client& c) {
    std::size_t at = 0;
    std::int64_t n;
    while (!c.closing && (n = completeFrame(std::string_view(c.in).substr(at))) >= 0) {
      const std::string payload = c.in.substr(at + 4, static_cast<size_t>(n));
      at += 4 + static_cast<size_t>(n);
      const bool ok = c.authenticated() ? handle(c, payload) : authenticate(c, payload);
      if (!ok) c.closing = true;
      if (c.out.size() > options_.maxUnreadReplyBytes) c.closing = true;  // it does not read its replies
    }
    c.in.erase(0, at);  // once for the whole batch: a burst of tiny frames costs linear time
  }

  bool authenticate(Client& c, const std::string& payload) {
    Reader r(payload);
    std::uint8_t op = 0;
    std::uint32_t rank = 0;
    std::string mac;
    if (!r.u8(op) || op != kOpAuth || !r.u32(rank) || !r.raw(mac, kMacBytes) || !r.done()) return false;
    if (rank >= options_.worldSize || !macEqual(mac, authMac(options_.secret, c.nonce, rank))) {
      // Said plainly, then closed: a rank with the wrong secret learns why.
      c.out += Writer().u8(kFailed).str("not this job's secret, or rank " + std::to_string(rank) + " is not one of its " +
                                        std::to_string(options_.worldSize) + " ranks").frame();
      flush(c);
      return false;
    }
    c.rank = static_cast<int>(rank);
    c.out += Writer().u8(kOk).frame();
    return true;
  }

  // Returns false for a malformed request: the connection is then closed.
  bool handle(Client& c, const std::string& payload) {
    Reader r(payload);
    std::uint8_t op = 0;
    if (!r.u8(op)) return false;
    switch (op) {
      case kOpHello: return r.done() && registerRank(c);
      case kOpSet: return set(c, r);
      case kOpGet: return get(c, r);
      case kOpHeartbeat: return heartbeat(c, r);
      case kOpStatus: return r.done() && status(c);
      default: return false;
    }
  }

  bool registerRank(Client& c) {
    c.registered = true;
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

  bool set(Client& c, Reader& r) {
    std::string key, value;
    if (!r.str(key) || !r.str(value) || !r.done()) return false;
    const auto refuse = [&](const std::string& why) {
      c.out += Writer().u8(kFailed).str(why).frame();
      return true;
    };
    if (key.size() > options_.maxKeyBytes) return refuse("a key of " + std::to_string(key.size()) + " bytes is too long");
    auto it = data_.find(key);
    if (it != data_.end() && it->second.owner != c.rank) {
      return refuse("key '" + key + "' belongs to rank " + std::to_string(it->second.owner));
    }
    const std::uint64_t before = it == data_.end() ? 0 : key.size() + it->second.value.size();
    if (it == data_.end() && data_.size() >= options_.maxKeys) {
      return refuse("the store is full (" + std::to_string(options_.maxKeys) + " keys)");
    }
    if (storedBytes_ - before + key.size() + value.size() > options_.maxStoredBytes) {
      return refuse("the store is full (" + std::to_string(options_.maxStoredBytes) + " bytes)");
    }
    storedBytes_ = storedBytes_ - before + key.size() + value.size();
    data_[key] = Entry{value, c.rank};
    c.out += Writer().u8(kOk).frame();
    // The value goes to every waiting Get: bounded per connection and in all, or the waiter is
    // dropped (it reconnects and finds the key set).
    std::uint64_t unread = 0;
    for (const auto& other : clients_) unread += other->out.size();
    const std::string answer = Writer().u8(kValue).str(value).frame();
    for (auto p = pending_.begin(); p != pending_.end();) {
      if (p->key == key) {
        Client& waiter = *p->client;
        if (waiter.out.size() + answer.size() > options_.maxUnreadReplyBytes ||
            unread + answer.size() > options_.maxTotalUnreadReplyBytes) {
          waiter.closing = true;
        } else {
          waiter.out += answer;
          unread += answer.size();
        }
        --waiter.waiting;
        p = pending_.erase(p);
      } else {
        ++p;
      }
    }
    return true;
  }

  bool get(Client& c, Reader& r) {
    std::string key;
    std::uint32_t timeoutMillis = 0;
    if (!r.str(key) || !r.u32(timeoutMillis) || !r.done()) return false;
    if (key.size() > options_.maxKeyBytes) {
      c.out += Writer().u8(kFailed).str("a key of " + std::to_string(key.size()) + " bytes is too long").frame();
      return true;
    }
    if (auto it = data_.find(key); it != data_.end()) {
      c.out += Writer().u8(kValue).str(it->second.value).frame();
      return true;
    }
    if (c.waiting >= options_.maxWaitingGetsPerConnection || pending_.size() >= options_.maxWaitingGets) {
      c.out += Writer().u8(kFailed).str("too many Gets waiting").frame();
      return true;
    }
    const auto wait = std::min(milliseconds(timeoutMillis), options_.maxGetWait);
    pending_.push_back({&c, key, Clock::now() + wait});
    ++c.waiting;
    return true;
  }

  bool heartbeat(Client& c, Reader& r) {
    std::int64_t step = 0, millisInPhase = 0;
    std::uint8_t phase = 0;
    if (!r.i64(step) || !r.u8(phase) || !r.i64(millisInPhase) || !r.done()) return false;
    if (phase > 3 || step < -1 || step > kMaxHeartbeatStep || millisInPhase < 0 || millisInPhase > kMaxMillisInPhase) {
      return false;
    }
    if (c.registered) {
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

  bool status(Client& c) {
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

  void expire() {
    const auto now = Clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->deadline <= now) {
        it->client->out += Writer().u8(kTimedOut).frame();
        --it->client->waiting;
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& c : clients_) {
      if (!c->authenticated() && now - c->accepted >= options_.authDeadline) c->closing = true;
    }
  }

  void flush(Client& c) {
    while (!c.out.empty()) {
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
      // A rank that reconnected has registered again on another connection: still connected.
      const bool stillThere = std::any_of(clients_.begin(), clients_.end(), [c](const auto& other) {
        return other.get() != c && !other->closing && other->registered && other->rank == c->rank;
      });
      if (c->registered && !stillThere) {
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
  const StoreServerOptions options_;
  int spareFd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  // Touched only by the server thread.
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<PendingGet> pending_;
  std::map<std::string, Entry> data_;
  std::uint64_t storedBytes_ = 0;

  mutable std::mutex mutex_;  // guards ranks_
  std::map<int, RankInfo> ranks_;
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() = default;
std::uint16_t StoreServer::port() const { return impl_->port(); }
void StoreServer::noteRankExit(int rank, std::string note) { impl_->noteRankExit(rank, std::move(note)); }
std::vector<RankLiveness> StoreServer::liveness() const { return impl_->liveness(); }

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& host, std::uint16_t port,
                                                        StoreServerOptions options) {
  if (!isValidStoreSecret(options.secret)) return invalidArgument("rendezvous store: the job secret is not 64 hex digits");
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
  auto impl = std::make_unique<Impl>(fd, wake, bound, std::move(options));
  impl->startThread();
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

}  // namespace lockstep
