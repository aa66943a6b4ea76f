#include "lockstep/net/connection_watch.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

namespace lockstep {
namespace {

// What the kernel received on `fd` less what still waits there: what libzmq has read.
std::int64_t readByLibzmq(int fd) {
  tcp_info info{};
  socklen_t length = sizeof info;
  int waiting = 0;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 ||
      length < offsetof(tcp_info, tcpi_bytes_received) + sizeof info.tcpi_bytes_received ||
      ::ioctl(fd, FIONREAD, &waiting) != 0) {
    return -1;
  }
  return static_cast<std::int64_t>(info.tcpi_bytes_received) - waiting;
}

int localPort(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return -2;
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  return -2;
}

}  // namespace

ConnectionWatch::ConnectionWatch(zmq::context_t& context, zmq::socket_t& socket, std::int64_t limit)
    : socket_(socket), monitor_(context, zmq::socket_type::pair), limit_(limit) {
  const std::string at = "inproc://lockstep.connection-watch." + std::to_string(reinterpret_cast<std::uintptr_t>(this));
  if (zmq_socket_monitor(socket.handle(), at.c_str(), ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED) != 0) {
    throw zmq::error_t();
  }
  monitor_.set(zmq::sockopt::linger, 0);
  monitor_.connect(at);
}

void ConnectionWatch::onEvents() {
  zmq::message_t event, endpoint;
  while (monitor_.recv(event, zmq::recv_flags::dontwait)) {
    if (event.more()) (void)monitor_.recv(endpoint, zmq::recv_flags::none);
    if (event.size() < 6) continue;
    std::uint16_t id = 0;
    std::uint32_t fd = 0;
    std::memcpy(&id, event.data(), sizeof id);
    std::memcpy(&fd, static_cast<const char*>(event.data()) + 2, sizeof fd);
    if (id == ZMQ_EVENT_ACCEPTED) {
      readWhenDelivered_[static_cast<int>(fd)] = 0;  // everything read since it began counts
    } else {
      readWhenDelivered_.erase(static_cast<int>(fd));
    }
  }
}

void ConnectionWatch::delivered(const zmq::message_t& body) {
  const int fd = zmq_msg_get(body.handle(), ZMQ_SRCFD);
  if (fd < 0) {
    works_ = false;  // a libzmq that does not say: never cut what cannot be accounted for
    return;
  }
  if (auto it = readWhenDelivered_.find(fd); it != readWhenDelivered_.end()) it->second = readByLibzmq(fd);
}

int ConnectionWatch::tick() {
  const auto now = std::chrono::steady_clock::now();
  if (!works_ || now < next_) return 0;
  next_ = now + kTick;
  if (port_ < 0) {
    const std::string endpoint = socket_.get(zmq::sockopt::last_endpoint);
    port_ = std::atoi(endpoint.c_str() + endpoint.rfind(':') + 1);
  }
  int cut = 0;
  for (auto it = readWhenDelivered_.begin(); it != readWhenDelivered_.end();) {
    const std::int64_t read = readByLibzmq(it->first);
    // A descriptor that is no longer one of the socket's connections (closed, its number reused).
    if (read < 0 || localPort(it->first) != port_) {
      it = readWhenDelivered_.erase(it);
      continue;
    }
    if (read - it->second > limit_) {
      ::shutdown(it->first, SHUT_RDWR);  // libzmq reads the end, drops the connection and its parts
      ++cut;
      it = readWhenDelivered_.erase(it);
      continue;
    }
    ++it;
  }
  return cut;
}

}  // namespace lockstep
