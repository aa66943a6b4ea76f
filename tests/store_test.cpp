// The rendezvous store (store.h) for real on loopback: what ranks rely on, and what a stranger
// who can reach its port cannot do (issue 14). Raw sockets play the attacker; the store's own
// wire helpers (private to common/) build frames a real client would not send.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <thread>

#include "lockstep/common/store.h"
#include "store_wire.h"
#include "support/test_support.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;
using namespace store_wire;
using test::residentKib;

// A raw TCP connection to the store, for frames no StoreClient would send.
class RawConnection {
 public:
  explicit RawConnection(std::uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawConnection() { ::close(fd_); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return connected_; }
  // Sends what it can without blocking; false once the store has closed the connection.
  bool send(std::string_view bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n <= 0) return n < 0 && errno == EAGAIN;
      sent += static_cast<size_t>(n);
    }
    return true;
  }
  // The next frame's payload, or nullopt when the store closed the connection or `timeout` passed.
  std::optional<std::string> frame(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (completeFrame(in_) < 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return std::nullopt;
      in_.append(buf, static_cast<size_t>(n));
    }
    const auto len = static_cast<size_t>(completeFrame(in_));
    std::string payload = in_.substr(4, len);
    in_.erase(0, 4 + len);
    return payload;
  }
  // Whether the store closed this connection within `timeout` (discarding anything it sent).
  bool closedWithin(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
    }
    return false;
  }
  std::string challenge() {
    auto f = frame();
    if (!f || f->size() != 1 + kNonceBytes || static_cast<std::uint8_t>((*f)[0]) != kChallenge) return {};
    return f->substr(1);
  }
  // Answers the challenge as `rank`; returns the store's reply code (kOk, kFailed) or -1.
  int authenticate(const std::string& secret, std::uint32_t rank) {
    const std::string nonce = challenge();
    if (nonce.empty()) return -1;
    return answer(nonce, secret, rank);
  }
  int answer(const std::string& nonce, const std::string& secret, std::uint32_t rank) {
    send(Writer().u8(kOpAuth).u32(rank).raw(authMac(secret, nonce, rank)).frame());
    auto reply = frame();
    return reply && !reply->empty() ? static_cast<std::uint8_t>((*reply)[0]) : -1;
  }

 private:
  int fd_;
  bool connected_ = false;
  std::string in_;
};

struct StoreTest : ::testing::Test {
  void SetUp() override { start({}); }
  void start(StoreServerOptions options) {
    options.secret = secret;
    server.reset();
    auto s = StoreServer::start("127.0.0.1", 0, options);
    ASSERT_TRUE(s.ok()) << s.error().message;
    server = std::move(s).value();
  }
  std::unique_ptr<StoreClient> client(int rank = 0) {
    auto c = StoreClient::connect("127.0.0.1", server->port(), 5s, secret, rank);
    EXPECT_TRUE(c.ok()) << c.error().message;
    return c.ok() ? std::move(c).value() : nullptr;
  }
  // A good client still gets served, promptly.
  void expectServed() {
    const auto start = std::chrono::steady_clock::now();
    auto good = client(1);
    ASSERT_NE(good, nullptr);
    ASSERT_TRUE(good->set("good", "yes").ok());
    auto value = good->get("good", 1s);
  ASSERT_TRUE(value.ok()) << value.error().message;
  EXPECT_EQ(*value, "yes");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  }
  const std::string secret = newStoreSecret();
  std::unique_ptr<StoreServer> server;
};

// ---- what ranks rely on ----

TEST_F(StoreTest, GetWaitsForALaterSet) {
  auto a = client(0);
  auto b = client(1);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(b->set("k", std::string("v\0x", 3)).ok());
  });
  auto value = a->get("k", 5s);
  setter.join();
  ASSERT_TRUE(value.ok()) << value.error().message;
  EXPECT_EQ(*value, std::string("v\0x", 3));
}

TEST_F(StoreTest, GetTimesOutWithTheKeyInTheMessage) {
  auto a = client();
  const auto start = std::chrono::steady_clock::now();
  auto value = a->get("never", 200ms);
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.error().code, ErrorCode::kTimeout);
  EXPECT_NE(value.error().message.find("never"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_TRUE(a->set("still", "works").ok());
}

TEST_F(StoreTest, LivenessTracksRegisteredRanks) {
  auto r0 = client(0);
  auto r1 = client(1);
  ASSERT_TRUE(r0->registerRank().ok());
  ASSERT_TRUE(r1->registerRank().ok());
  ASSERT_TRUE(r1->heartbeat(12, RankPhase::kCheckpoint, 5000).ok());
  auto status = r0->status();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->size(), 2u);
  EXPECT_EQ((*status)[1].step, 12);
  EXPECT_EQ((*status)[1].state, RankLiveness::State::kConnected);
  EXPECT_EQ((*status)[1].phase, RankPhase::kCheckpoint);
  EXPECT_GE((*status)[1].millisInPhase, 5000);
  EXPECT_LT((*status)[1].millisInPhase, 9000);

  r1.reset();  // the rank's process goes away
  server->noteRankExit(1, "exited with signal 9 (Killed)");
  ASSERT_TRUE(test::waitUntil(
      [&] {
        auto s = r0->status();
        return s.ok() && (*s)[1].state == RankLiveness::State::kDisconnected;
      },
      3s));
  EXPECT_EQ(r0->status()->at(1).exitNote, "exited with signal 9 (Killed)");
}

TEST_F(StoreTest, AFailedCallReconnectsAndRegistersAgain) {
  auto r0 = client(0);
  auto r1 = client(1);
  ASSERT_TRUE(r1->registerRank().ok());
  // A get that times out drops r1's connection (its reply could still be on the way) ...
  ASSERT_FALSE(r1->get("never", 100ms).ok());
  // ... and the next call reconnects, authenticates and registers rank 1 again.
  EXPECT_TRUE(r1->set("k", "v").ok());
  ASSERT_TRUE(test::waitUntil(
      [&] {
        auto s = r0->status();
        return s.ok() && s->size() == 1 && (*s)[0].state == RankLiveness::State::kConnected;
      },
      3s));
}

TEST(Store, ConnectToNobodyFailsInTimeSayingWhere) {
  const auto port = test::freePort();
  const auto start = std::chrono::steady_clock::now();
  auto c = StoreClient::connect("127.0.0.1", port, 500ms, newStoreSecret(), 0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kUnavailable);
  EXPECT_NE(c.error().message.find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST(Store, ServerOnABusyPortSaysSo) {
  auto first = StoreServer::start("127.0.0.1", 0);
  ASSERT_TRUE(first.ok());
  auto second = StoreServer::start("127.0.0.1", (*first)->port());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("MASTER_PORT"), std::string::npos) << second.error().message;
}

TEST(Store, SecretsAreRandomAndCheckedForShape) {
  const std::string a = newStoreSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_TRUE(isValidStoreSecret(a));
  EXPECT_NE(a, newStoreSecret());
  EXPECT_TRUE(isValidStoreSecret(""));
  EXPECT_FALSE(isValidStoreSecret("abc"));
  EXPECT_FALSE(isValidStoreSecret(std::string(63, 'a') + "g"));
  auto server = StoreServer::start("127.0.0.1", 0, StoreServerOptions{.secret = "not hex"});
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.error().message.find("64 hex"), std::string::npos);
}

// ---- a stranger who can reach the port ----

TEST_F(StoreTest, AWrongSecretIsRefusedSayingWhy) {
  auto c = StoreClient::connect("127.0.0.1", server->port(), 2s, newStoreSecret(), 0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::kPermissionDenied);
  EXPECT_NE(c.error().message.find("LOCKSTEP_STORE_SECRET"), std::string::npos) << c.error().message;
  expectServed();
}

TEST_F(StoreTest, AnAnswerSeenOnTheWireCannotBeReplayed) {
  RawConnection observed(server->port());
  const std::string nonce = observed.challenge();
  ASSERT_FALSE(nonce.empty());
  // The observer saw the answer to `nonce`; a new connection gets a new challenge.
  RawConnection replay(server->port());
  const std::string fresh = replay.challenge();
  ASSERT_FALSE(fresh.empty());
  EXPECT_NE(fresh, nonce);
  replay.send(Writer().u8(kOpAuth).u32(0).raw(authMac(secret, nonce, 0)).frame());
  auto reply = replay.frame();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(static_cast<std::uint8_t>((*reply)[0]), kFailed);
  EXPECT_TRUE(replay.closedWithin(2s));
  EXPECT_EQ(observed.answer(nonce, secret, 0), kOk);
}

TEST_F(StoreTest, NothingIsReadBeforeTheAnswer) {
  RawConnection c(server->port());
  ASSERT_FALSE(c.challenge().empty());
  c.send(Writer().u8(kOpSet).str("lockstep/j/0/nccl-id").str("evil").frame());
  EXPECT_TRUE(c.closedWithin(2s));
  auto rank0 = client(0);
  EXPECT_FALSE(rank0->get("lockstep/j/0/nccl-id", 200ms).ok()) << "an unauthenticated Set was stored";
}

TEST_F(StoreTest, ARankBeyondTheWorldIsRefused) {
  start({.secret = "", .worldSize = 2});
  RawConnection c(server->port());
  EXPECT_EQ(c.authenticate(secret, 1u << 31), kFailed);
  EXPECT_TRUE(c.closedWithin(2s));
  RawConnection two(server->port());
  EXPECT_EQ(two.authenticate(secret, 2), kFailed);
  RawConnection one(server->port());
  EXPECT_EQ(one.authenticate(secret, 1), kOk);
}

TEST_F(StoreTest, ThousandIdleConnectionsDoNotKeepGoodClientsOut) {
  start({.secret = "", .authDeadline = 1000ms});
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 1000; ++i) {
    idle.push_back(std::make_unique<RawConnection>(server->port()));
    ASSERT_TRUE(idle.back()->connected()) << "connection " << i;
  }
  expectServed();
  // Every idle one is gone once its deadline passed: the oldest were shed earlier to make room.
  for (auto& c : idle) EXPECT_TRUE(c->closedWithin(3s));
  expectServed();
}

TEST_F(StoreTest, HugeFramesBeforeTheAnswerAreCutOffAndMemoryStaysBounded) {
  const std::int64_t before = residentKib();
  const std::string eightMib(8u << 20, 'x');
  std::vector<std::unique_ptr<RawConnection>> attackers;
  for (int i = 0; i < 60; ++i) {
    attackers.push_back(std::make_unique<RawConnection>(server->port()));
    // A 16 MiB frame announced, half of it sent: what grew the agent by 500 MiB before.
    const std::uint32_t len = 16u << 20;
    const std::string header(reinterpret_cast<const char*>(&len), 4);
    attackers.back()->send(header + eightMib);
  }
  for (auto& a : attackers) EXPECT_TRUE(a->closedWithin(3s));
  EXPECT_LT(residentKib() - before, 64 * 1024) << "the store buffered what strangers sent";
  expectServed();
}

TEST_F(StoreTest, AGetCannotWaitLongerThanTheStoreAllows) {
  start({.secret = "", .maxGetWait = 300ms});
  auto c = client();
  const auto start = std::chrono::steady_clock::now();
  auto value = c->get("never", std::chrono::milliseconds(std::int64_t{1} << 32));
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.error().code, ErrorCode::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  // On the wire, the largest timeout there is.
  RawConnection raw(server->port());
  ASSERT_EQ(raw.authenticate(secret, 0), kOk);
  raw.send(Writer().u8(kOpGet).str("never").u32(0xffffffffu).frame());
  auto reply = raw.frame(5s);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(static_cast<std::uint8_t>((*reply)[0]), kTimedOut);
}

TEST_F(StoreTest, WaitingGetsAreBoundedPerConnection) {
  start({.secret = "", .maxWaitingGetsPerConnection = 4});
  RawConnection raw(server->port());
  ASSERT_EQ(raw.authenticate(secret, 0), kOk);
  for (int i = 0; i < 5; ++i) raw.send(Writer().u8(kOpGet).str("k" + std::to_string(i)).u32(60000).frame());
  auto refused = raw.frame(2s);
  ASSERT_TRUE(refused.has_value()) << "the fifth waiting Get was not refused";
  EXPECT_EQ(static_cast<std::uint8_t>((*refused)[0]), kFailed);
  expectServed();
}

TEST_F(StoreTest, AClientThatDoesNotReadItsRepliesIsDropped) {
  start({.secret = "", .maxUnreadReplyBytes = 1u << 20});
  auto owner = client(0);
  ASSERT_TRUE(owner->set("big", std::string(256u << 10, 'v')).ok());
  RawConnection raw(server->port());
  ASSERT_EQ(raw.authenticate(secret, 1), kOk);
  // Asks for 256 KiB again and again and never reads: the store stops queueing for it.
  std::string requests;
  for (int i = 0; i < 64; ++i) requests += Writer().u8(kOpGet).str("big").u32(0).frame();
  raw.send(requests);
  EXPECT_TRUE(raw.closedWithin(5s));
  expectServed();
}

TEST_F(StoreTest, AKeyBelongsToTheRankThatSetItFirst) {
  auto rank0 = client(0);
  auto rank1 = client(1);
  ASSERT_TRUE(rank0->set("lockstep/j/0/nccl-id", "good").ok());
  auto overwrite = rank1->set("lockstep/j/0/nccl-id", "evil");
  ASSERT_FALSE(overwrite.ok());
  EXPECT_NE(overwrite.error().message.find("belongs to rank 0"), std::string::npos) << overwrite.error().message;
  auto kept = rank1->get("lockstep/j/0/nccl-id", 1s);
  ASSERT_TRUE(kept.ok()) << kept.error().message;
  EXPECT_EQ(*kept, "good");
  EXPECT_TRUE(rank0->set("lockstep/j/0/nccl-id", "again").ok());  // its owner may
}

TEST_F(StoreTest, TheStoreRefusesToGrowBeyondItsBounds) {
  start({.secret = "", .maxKeys = 3, .maxStoredBytes = 1000});
  auto c = client();
  EXPECT_TRUE(c->set("a", std::string(500, 'x')).ok());
  auto big = c->set("b", std::string(600, 'x'));
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("full"), std::string::npos);
  EXPECT_TRUE(c->set("b", "1").ok());
  EXPECT_TRUE(c->set("c", "2").ok());
  EXPECT_FALSE(c->set("d", "3").ok());
  EXPECT_TRUE(c->set("a", "smaller now").ok());  // replacing a key frees its bytes
  EXPECT_FALSE(c->set(std::string(5000, 'k'), "").ok());
}

TEST_F(StoreTest, HeartbeatsOutOfRangeAreRefused) {
  for (auto [step, phase, millis] : {std::tuple<std::int64_t, std::uint8_t, std::int64_t>{-5, 1, 0},
                                     {0, 9, 0},
                                     {0, 1, -1},
                                     {0, 1, std::int64_t{1} << 62}}) {
    RawConnection raw(server->port());
    ASSERT_EQ(raw.authenticate(secret, 0), kOk);
    raw.send(Writer().u8(kOpHello).frame());
    ASSERT_TRUE(raw.frame().has_value());
    raw.send(Writer().u8(kOpHeartbeat).i64(step).u8(phase).i64(millis).frame());
    EXPECT_TRUE(raw.closedWithin(2s)) << step << " " << int(phase) << " " << millis;
  }
  auto liveness = server->liveness();
  ASSERT_EQ(liveness.size(), 1u);
  EXPECT_EQ(liveness[0].step, -1) << "an out-of-range heartbeat was recorded";
}

// Out of file descriptors, the store's thread waits instead of spinning on its listening socket.
// In a child process, whose descriptor limit this test may lower.
TEST(Store, RunningOutOfDescriptorsDoesNotSpin) {
  int toParent[2];
  ASSERT_EQ(::pipe(toParent), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto server = StoreServer::start("127.0.0.1", 0, StoreServerOptions{.secret = newStoreSecret()});
    if (!server.ok()) ::_exit(3);
    const std::uint16_t port = (*server)->port();
    // Use up every descriptor there is.
    rlimit limit{256, 256};
    ::setrlimit(RLIMIT_NOFILE, &limit);
    while (::open("/dev/null", O_RDONLY) >= 0) {
    }
    [[maybe_unused]] auto n = ::write(toParent[1], &port, sizeof port);
    std::this_thread::sleep_for(300ms);  // the parent connects meanwhile
    rusage before{}, after{};
    ::getrusage(RUSAGE_SELF, &before);
    std::this_thread::sleep_for(1500ms);
    ::getrusage(RUSAGE_SELF, &after);
    const long micros = (after.ru_utime.tv_sec - before.ru_utime.tv_sec + after.ru_stime.tv_sec - before.ru_stime.tv_sec) * 1000000L +
                        (after.ru_utime.tv_usec - before.ru_utime.tv_usec) + (after.ru_stime.tv_usec - before.ru_stime.tv_usec);
    n = ::write(toParent[1], &micros, sizeof micros);
    ::_exit(0);
  }
  ::close(toParent[1]);
  std::uint16_t port = 0;
  ASSERT_EQ(::read(toParent[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  std::vector<std::unique_ptr<RawConnection>> waiting;
  for (int i = 0; i < 20; ++i) waiting.push_back(std::make_unique<RawConnection>(port));
  long micros = -1;
  ASSERT_EQ(::read(toParent[0], &micros, sizeof micros), static_cast<ssize_t>(sizeof micros));
  ::close(toParent[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_LT(micros, 500'000) << "the store's thread spun for " << micros / 1000 << " ms of 1500";
}

}  // namespace
}  // namespace lockstep
