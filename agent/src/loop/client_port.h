#pragma once
// The agent's client socket (ZeroMQ ROUTER, CURVE; docs/security.md): the ZAP handler that checks
// each handshake's key, the watch that bounds what connections can make libzmq hold, one, one key's
// and those of no known key yet, and how many one key opens (connection_watch.h), whole requests
// received and decoded, replies sent without waiting.
// Event loop only.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "base/log.h"
#include "base/ports.h"
#include "lockstep/common/result.h"
#include "lockstep/net/connection_watch.h"
#include "lockstep/net/keys.h"
#include "lockstep/net/zmq_util.h"
#include "lockstep/protocol/types.h"

namespace lockstep::agent {

class ClientPort : public ReplyPort {
 public:
  static constexpr std::size_t kMaxRequestBytes = 4u << 20;

  // The ZAP handler first: without it libzmq would let every CURVE client in. Throws zmq::error_t.
  ClientPort(zmq::context_t& context, Log& log);

  // Listens on `listen` with this agent's keys; returns the endpoint as bound (its port, when it
  // was 0). Throws zmq::error_t.
  Result<std::string> bind(const std::string& listen, const CurveKeyPair& keys);
  // How many connections a key may open beyond the bound (a supervising agent's key: one per job
  // it supervises here). Call after bind().
  void allowMoreConnections(std::function<std::size_t(const std::string& key)> more) {
    watch_->moreConnections = std::move(more);
  }

  // What the loop polls for it: requests, handshakes, connection events.
  std::array<zmq::pollitem_t, 3> pollItems();
  // A handshake waits: `authorized` says whether its key is let in.
  void onHandshake(const std::function<bool(const std::string& key)>& authorized) { zap_->handleOne(authorized); }
  // Cuts connections that hold too much (`events`: the watch's socket fired), gives the heap back.
  void watchConnections(bool events);
  // How long the loop may wait: a tick while a connection is watched or the heap is to be given
  // back, else `idle`.
  std::chrono::milliseconds timeout(std::chrono::milliseconds idle) const;

  struct Incoming {
    std::string client;  // the routing id
    std::string key;     // the client's public key, as the ZAP handler tagged it
    Request request;
  };
  // The next request; nothing when none was whole or it was malformed (then answered here), or its
  // connection is cut: a key's beyond its first 16 is, as its first request arrives.
  std::optional<Incoming> receive();
  // Whether another request waits.
  bool readable();

  void reply(const std::string& client, const Reply& reply) override;

 private:
  void sayCuts(const ConnectionWatch::Cuts& cuts);
  void sayOnceAMinute(const std::string& about, const std::string& line);
  bool kept(ConnectionWatch::Delivery delivery, const std::string& key);

  zmq::context_t& context_;
  Log& log_;
  std::unique_ptr<ZapHandler> zap_;
  std::unique_ptr<zmq::socket_t> router_;
  std::unique_ptr<ConnectionWatch> watch_;
  std::vector<std::chrono::steady_clock::time_point> trims_;  // when to give the heap back after a cut
  std::map<std::string, std::chrono::steady_clock::time_point> said_;  // when a line about each was logged
};

}  // namespace lockstep::agent
