#include "lockstep/net/connection_watch.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <functional>
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

ConnectionWatch::ConnectionWatch(zmq::context_t& context, zmq::socket_t& socket, const Bounds& bounds)
    : socket_(socket), monitor_(context, zmq::socket_type::pair), bounds_(bounds) {
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
    if (auto it = connections_.find(static_cast<int>(fd)); it != connections_.end()) forget(it);
    // A new one: everything read since it began counts, and it is in no group yet.
    if (id == ZMQ_EVENT_ACCEPTED) connections_[static_cast<int>(fd)] = Connection{};
  }
}

ConnectionWatch::Delivery ConnectionWatch::delivered(const zmq::message_t& body, const std::string& group) {
  const int fd = zmq_msg_get(body.handle(), ZMQ_SRCFD);
  if (fd < 0) {
    works_ = false;  // a libzmq that does not say: never cut what cannot be accounted for
    return Delivery::kServe;
  }
  onEvents();  // a descriptor closed and accepted anew before this message was read
  const auto it = connections_.find(fd);
  if (it == connections_.end()) return Delivery::kServe;
  Connection& connection = it->second;
  if (connection.cut) return Delivery::kCut;
  if (connection.group.empty() && !group.empty()) {
    std::size_t& members = members_[group];
    if (members >= bounds_.connectionsPerGroup &&
        (!moreConnections || members >= bounds_.connectionsPerGroup + moreConnections(group))) {
      cut(fd, connection);
      if (members == 0) members_.erase(group);
      return Delivery::kTooMany;
    }
    ++members;
    connection.group = group;
  }
  connection.readWhenDelivered = readByLibzmq(fd);
  return Delivery::kServe;
}

ConnectionWatch::Cuts ConnectionWatch::tick() {
  Cuts cuts;
  const auto now = std::chrono::steady_clock::now();
  if (!works_ || now < next_) return cuts;
  next_ = now + kTick;
  if (port_ < 0) {
    const std::string endpoint = socket_.get(zmq::sockopt::last_endpoint);
    port_ = std::atoi(endpoint.c_str() + endpoint.rfind(':') + 1);
  }
  std::map<std::string, Held> held;  // by group, "" for none
  for (auto it = connections_.begin(); it != connections_.end();) {
    const std::int64_t read = readByLibzmq(it->first);
    // A descriptor that is no longer one of the socket's connections (closed, its number reused).
    if (read < 0 || localPort(it->first) != port_) {
      it = forget(it);
      continue;
    }
    Connection& connection = it->second;
    const std::int64_t bytes = read - connection.readWhenDelivered;
    if (!connection.cut && bytes > bounds_.connection) {
      cut(it->first, connection);
      ++cuts.connection;
    } else if (!connection.cut) {
      held[connection.group].emplace_back(bytes, it->first);
    }
    ++it;
  }
  for (auto& [group, connections] : held) {
    const int over = cutLargest(connections, group.empty() ? bounds_.ungrouped : bounds_.group);
    if (over == 0) continue;
    (group.empty() ? cuts.ungrouped : cuts.group) += over;
    if (!group.empty()) cuts.groups.push_back(group);
  }
  return cuts;
}

void ConnectionWatch::cut(int fd, Connection& connection) {
  ::shutdown(fd, SHUT_RDWR);  // libzmq reads the end, drops the connection and its parts
  leave(connection);
  connection.cut = true;
}

std::map<int, ConnectionWatch::Connection>::iterator ConnectionWatch::forget(std::map<int, Connection>::iterator it) {
  leave(it->second);
  return connections_.erase(it);
}

// A connection no longer counts among its group's.
void ConnectionWatch::leave(const Connection& connection) {
  if (connection.cut || connection.group.empty()) return;
  if (auto it = members_.find(connection.group); it != members_.end() && --it->second == 0) members_.erase(it);
}

// Cuts the largest of `connections` until what the rest hold is within `bound`; how many.
int ConnectionWatch::cutLargest(Held& connections, std::int64_t bound) {
  std::int64_t total = 0;
  for (const auto& [bytes, fd] : connections) total += bytes;
  if (total <= bound) return 0;
  std::sort(connections.begin(), connections.end(), std::greater<>());
  int count = 0;
  for (const auto& [bytes, fd] : connections) {
    if (total <= bound) break;
    cut(fd, connections_.at(fd));
    total -= bytes;
    ++count;
  }
  return count;
}

}  // namespace lockstep
