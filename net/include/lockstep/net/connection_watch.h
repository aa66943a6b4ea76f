#pragma once
// A bound on what TCP connections can make a ZeroMQ socket hold (docs/security.md): each one, each
// group's together, and those not yet in a group together.
//
// libzmq 4.3 holds every part of a multipart message until its last part arrives, however many
// there are: ZMQ_MAXMSGSIZE bounds one part, ZMQ_RCVHWM counts whole messages, and nothing counts
// a message's parts. The watch bounds it instead. What a connection holds is what libzmq has read
// from it since it last delivered a whole message; a connection holding more than its bound is
// shut down, and libzmq drops it with the parts it held. It learns connections from the socket's
// monitor (ACCEPTED, DISCONNECTED, CLOSED carry the descriptor), what libzmq read from the kernel
// (TCP_INFO's bytes received less what still waits, FIONREAD), and which connection a message
// came from (ZMQ_SRCFD). Linux only; it cuts nothing where the kernel or libzmq cannot say.
//
// Groups: the caller names the group of a message's connection (the agent: the client's key) as
// it delivers it. libzmq says nothing of a connection's peer before its first message (the monitor
// and the ZAP request name no descriptor), so until then a connection is in no group; those are
// bounded together. A group has at most `connectionsPerGroup` connections: a further one is cut as
// its first message arrives, and that message is not to be served.
//
// Not thread-safe: the socket's thread calls it.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <zmq.hpp>

namespace lockstep {

class ConnectionWatch {
 public:
  struct Bounds {
    std::int64_t connection = 0;  // bytes one connection may hold
    std::int64_t group = 0;       // bytes a group's connections may hold together
    std::int64_t ungrouped = 0;   // bytes the connections in no group yet may hold together
    std::size_t connectionsPerGroup = 0;
  };
  // What a tick cut, by the bound each connection was over.
  struct Cuts {
    int connection = 0, group = 0, ungrouped = 0;
    std::vector<std::string> groups;  // the groups over their bound
    int total() const { return connection + group + ungrouped; }
  };
  enum class Delivery {
    kServe,    // from a connection that is kept (or one the watch does not know)
    kTooMany,  // its connection's group had connectionsPerGroup already: it was cut just now
    kCut,      // its connection was cut before: libzmq has not dropped it yet
  };

  // Watches `socket` (a TCP server socket): make it before the socket binds.
  ConnectionWatch(zmq::context_t& context, zmq::socket_t& socket, const Bounds& bounds);
  // Poll this for ZMQ_POLLIN, and call onEvents() when it is readable.
  zmq::socket_t& events() { return monitor_; }
  void onEvents();
  // More connections for some groups (the agent: a supervising agent's key, one per job), asked
  // as a group's connection beyond connectionsPerGroup arrives; unset: none.
  std::function<std::size_t(const std::string& group)> moreConnections;
  // A whole message arrived (its body frame, which says where from) from a connection of `group`
  // ("": none). A connection's first message puts it in its group.
  Delivery delivered(const zmq::message_t& body, const std::string& group);
  // Cuts the connections over a bound, the largest of a group first; at most every 50 ms.
  Cuts tick();
  static constexpr std::chrono::milliseconds kTick{50};
  // Whether a connection is open: tick() has something to do.
  bool watching() const { return !connections_.empty(); }

 private:
  struct Connection {
    std::int64_t readWhenDelivered = 0;
    std::string group;  // "" until its first message names one
    bool cut = false;   // shut down; kept until libzmq drops it, so that its messages are refused
  };
  using Held = std::vector<std::pair<std::int64_t, int>>;  // bytes held, descriptor
  void cut(int fd, Connection& connection);
  std::map<int, Connection>::iterator forget(std::map<int, Connection>::iterator it);
  void leave(const Connection& connection);
  int cutLargest(Held& held, std::int64_t bound);

  zmq::socket_t& socket_;
  zmq::socket_t monitor_;
  Bounds bounds_;
  int port_ = -1;
  bool works_ = true;
  std::chrono::steady_clock::time_point next_{};
  std::map<int, Connection> connections_;  // by descriptor
  std::map<std::string, std::size_t> members_;  // connections kept, by group
};

}  // namespace lockstep
