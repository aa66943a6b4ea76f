#pragma once
// The rendezvous store: a small key-value service over TCP that ranks use to find each other
// (Debian's Gloo has no TCP store). It also keeps each rank's liveness, so that a rank whose
// collective fails can ask which peer went away and name it.
//
// Hosted by rank 0 at MASTER_ADDR:MASTER_PORT (torchrun's convention), or by whoever launched the
// ranks (the trainer's --nproc launcher, later the agent), which then also records how each rank
// exited. Unauthenticated, like torchrun's TCPStore: bind it to loopback or a private network.
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

namespace lockstep {

inline constexpr std::uint32_t kStoreMaxFrameBytes = 16u << 20;

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

// Serves the store from its own thread. Thread-safe; the destructor stops the thread.
class StoreServer {
 public:
  // Binds host:port (port 0 picks a free one, see port()). The socket is listening on return.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& host, std::uint16_t port);
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
// connection; the next call reconnects (and registers the rank again).
class StoreClient {
 public:
  // Connects, retrying refused connections until `timeout` (the server may not be up yet).
  static Result<std::unique_ptr<StoreClient>> connect(const std::string& host, std::uint16_t port,
                                                      std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  Result<void> set(const std::string& key, const std::string& value);
  // Waits until the key exists (server side, no polling) or the timeout passes.
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  // Registers this connection as `rank`'s: when it closes, the store marks the rank disconnected.
  Result<void> registerRank(int rank);
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
  StoreClient(int fd, std::string host, std::uint16_t port);
  Result<std::string> call(const std::string& request, std::chrono::milliseconds timeout);
  Result<std::string> exchange(const std::string& request, std::chrono::steady_clock::time_point deadline);

  mutable std::mutex mutex_;  // guards everything below
  int fd_;
  const std::string host_;
  const std::uint16_t port_;
  int rank_ = -1;
  std::function<bool()> interrupted_;
  std::chrono::milliseconds ioTimeout_{10000};
};

}  // namespace lockstep
