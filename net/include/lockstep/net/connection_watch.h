#pragma once
// A bound on what one TCP connection can make a ZeroMQ socket hold (docs/security.md).
//
// libzmq 4.3 holds every part of a multipart message until its last part arrives, however many
// there are: ZMQ_MAXMSGSIZE bounds one part, ZMQ_RCVHWM counts whole messages, and nothing counts
// a message's parts. The watch bounds it per connection instead: a connection from which libzmq
// has read more than `limit` bytes since it last delivered a whole message is shut down, and
// libzmq drops it with the parts it held. It learns connections from the socket's monitor
// (ACCEPTED, DISCONNECTED, CLOSED carry the descriptor), what libzmq read from the kernel
// (TCP_INFO's bytes received less what still waits, FIONREAD), and which connection a message
// came from (ZMQ_SRCFD). Linux only; it cuts nothing where the kernel or libzmq cannot say.
//
// Not thread-safe: the socket's thread calls it.

#include <chrono>
#include <cstdint>
#include <map>

#include <zmq.hpp>

namespace lockstep {

class ConnectionWatch {
 public:
  // Watches `socket` (a TCP server socket): make it before the socket binds.
  ConnectionWatch(zmq::context_t& context, zmq::socket_t& socket, std::int64_t limit);
  // Poll this for ZMQ_POLLIN, and call onEvents() when it is readable.
  zmq::socket_t& events() { return monitor_; }
  void onEvents();
  // A whole message arrived (its body frame, which says where from).
  void delivered(const zmq::message_t& body);
  // Cuts the connections over the limit; at most every 50 ms. Returns how many it cut.
  int tick();
  static constexpr std::chrono::milliseconds kTick{50};
  // Whether a connection is open: tick() has something to do.
  bool watching() const { return !readWhenDelivered_.empty(); }

 private:
  zmq::socket_t& socket_;
  zmq::socket_t monitor_;
  std::int64_t limit_;
  int port_ = -1;
  bool works_ = true;
  std::chrono::steady_clock::time_point next_{};
  std::map<int, std::int64_t> readWhenDelivered_;  // by descriptor
};

}  // namespace lockstep
