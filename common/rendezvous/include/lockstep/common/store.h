#pragma once
// The rendezvous store: a small key-value service over TCP that ranks use to find each other
// (Debian's Gloo has no TCP store). It also keeps each rank's liveness, so that a rank whose
// collective fails can ask which peer went away and name it.
//
// Hosted by rank 0 at MASTER_ADDR:MASTER_PORT (torchrun's convention), or by whoever launched the
// ranks (the trainer's --nproc launcher, or the agent), which then also records how each rank
// exited.
//
// Every connection proves it belongs to the job before anything else is read (docs/security.md):
// the server opens with a random 32-byte challenge, and the client answers with its rank and
// HMAC-SHA256(job secret, challenge || rank); an observer who saw one answer cannot replay it. A
// connection that has not answered may send one small frame within the auth deadline. After it,
// keys, bytes, waiting Gets and unread replies are bounded per connection and in all; a key
// belongs to the rank that set it first; only the connection that authenticated as rank k
// registers or heartbeats as rank k. The secret reaches ranks in LOCKSTEP_STORE_SECRET, never on
// their command line. An empty secret is an open store (ranks started by hand without one).
//
// Wire format (both directions): u32 little-endian length, then that many bytes; the first byte of
// a request is its op. Frames over kMaxFrameBytes are refused and the connection closed.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/common/store_secret.h"

namespace lockstep {

inline constexpr std::uint32_t kStoreMaxFrameBytes = 16u << 20;

// A new job secret: 32 random bytes as 64 hex characters (what LOCKSTEP_STORE_SECRET holds).
std::string newStoreSecret();

// What a rank's main thread is doing, as its heartbeats say.
enum class RankPhase : std::uint8_t { kStartup = 0, kCompute = 1, kCommunicate = 2, kCheckpoint = 3 };
std::string_view rankPhaseName(RankPhase phase);

struct RankLiveness {
  enum class State { kNeverSeen, kConnected, kDisconnected };
  int rank = 0;
  State state = State::kNeverSeen;
  std::int64_t step = -1;                 // last completed step, from the latest heartbeat
  RankPhase phase = RankPhase::kStartup;
  std::int64_t millisInPhase = 0;         // how long the main thread has been in that phase
  std::int64_t millisSinceHeartbeat = 0;  // or since it connected, before its first heartbeat
  std::string exitNote;                   // how the process ended, when its launcher knows
};

struct StoreServerOptions {
  std::string secret;              // the job's (newStoreSecret()); empty: an open store
  std::uint32_t worldSize = 4096;  // ranks 0..worldSize-1 may authenticate
  std::chrono::milliseconds authDeadline{5000};  // for a new connection's answer to the challenge
  std::size_t maxUnauthenticated = 64;   // beyond it, the oldest unauthenticated connection goes
  std::size_t maxConnections = 8192;     // authenticated ones
  std::size_t maxKeys = 1u << 16;
  std::size_t maxKeyBytes = 4096;
  std::uint64_t maxStoredBytes = 256ull << 20;  // keys and values in all
  std::size_t maxWaitingGetsPerConnection = 64;
  std::size_t maxWaitingGets = 8192;
  std::size_t maxUnreadReplyBytes = 64u << 20;  // per connection: a client that does not read goes
  std::uint64_t maxTotalUnreadReplyBytes = 1ull << 30;  // in all
  std::chrono::milliseconds maxGetWait{3600 * 1000};
};

// Serves the store from its own thread. Thread-safe; the destructor stops the thread.
class StoreServer {
 public:
  // Binds host:port (port 0 picks a free one, see port()). The socket is listening on return.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& host, std::uint16_t port,
                                                    StoreServerOptions options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const;
  // Records how a rank's process ended; included in status replies ("exit code 1", "signal 9").
  void noteRankExit(int rank, std::string note);
  std::vector<RankLiveness> liveness() const;

  class Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One connection to a store. Calls are serialized by an internal mutex, so one client may be
// shared by threads; every call has a deadline. A call that fails mid-exchange drops the
// connection; the next call reconnects (authenticates and registers the rank again).
class StoreClient {
 public:
  // Connects and authenticates as `rank` with the job's secret, retrying refused connections
  // until `timeout` (the server may not be up yet). A wrong secret is PermissionDenied.
  static Result<std::unique_ptr<StoreClient>> connect(const std::string& host, std::uint16_t port,
                                                      std::chrono::milliseconds timeout, const std::string& secret,
                                                      int rank);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  Result<void> set(const std::string& key, const std::string& value);
  // Waits until the key exists (server side, no polling) or the timeout passes.
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  // Registers this connection as its rank's: when it closes, the store marks the rank disconnected.
  Result<void> registerRank();
  // Called when a wait is interrupted by a signal: returning true ends the call with kCancelled
  // (a stop request); otherwise the wait goes on.
  void setInterruptCheck(std::function<bool()> interrupted);
  // The rank's progress: its last completed step, and the phase its main thread has been in for
  // millisInPhase. Gives up after 2 s.
  Result<void> heartbeat(std::int64_t step, RankPhase phase, std::int64_t millisInPhase);
  Result<std::vector<RankLiveness>> status(std::chrono::milliseconds timeout = std::chrono::seconds(10));

  // The local address of this connection: the interface that routes to the store's host.
  std::string localAddress() const;

 private:
  StoreClient(int fd, std::string host, std::uint16_t port, std::string secret, int rank);
  Result<std::string> call(const std::string& request, std::chrono::milliseconds timeout);
  Result<std::string> exchange(const std::string& request, std::chrono::steady_clock::time_point deadline);

  mutable std::mutex mutex_;  // guards everything below
  int fd_;
  const std::string host_;
  const std::uint16_t port_;
  const std::string secret_;
  const int rank_;
  bool registered_ = false;
  std::function<bool()> interrupted_;
  std::chrono::milliseconds ioTimeout_{10000};
};

}  // namespace lockstep
