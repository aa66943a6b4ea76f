#include "support/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>

namespace lockstep::test {
namespace {

constexpr int kReadDeadlineMs = 2000;

// Reads one request: headers, then Content-Length bytes of body. Empty on a deadline or error.
std::string readRequest(int fd) {
  std::string data;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kReadDeadlineMs);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto end = data.find("\r\n\r\n");
    if (end != std::string::npos) {
      const auto at = data.find("Content-Length:");
      const std::size_t length = at == std::string::npos ? 0 : std::strtoul(data.c_str() + at + 15, nullptr, 10);
      if (data.size() >= end + 4 + length) return data;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buffer[4096];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) return {};
    data.append(buffer, static_cast<std::size_t>(n));
  }
  return {};
}

void answer(int fd, const std::string& status, const std::string& extraHeaders) {
  const std::string text = "HTTP/1.1 " + status + "\r\nContent-Length: 0\r\nConnection: close\r\n" + extraHeaders + "\r\n";
  (void)!::write(fd, text.data(), text.size());
}

}  // namespace

HttpServer::HttpServer(Behaviour behaviour, int failuresFirst) : behaviour_(behaviour), failuresLeft_(failuresFirst) {
  listenFd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof a;
  if (::bind(listenFd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listenFd_, 64) != 0 ||
      ::getsockname(listenFd_, reinterpret_cast<sockaddr*>(&a), &size) != 0) {
    throw std::runtime_error("the test's HTTP server cannot listen");
  }
  port_ = ntohs(a.sin_port);
  wakeFd_ = ::eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { run(); });
}

HttpServer::~HttpServer() {
  const std::uint64_t one = 1;
  (void)!::write(wakeFd_, &one, sizeof one);
  thread_.join();
  for (int fd : held_) ::close(fd);
  ::close(listenFd_);
  ::close(wakeFd_);
}

std::string HttpServer::url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }

std::vector<HttpServer::Request> HttpServer::requests() const {
  std::lock_guard lock(mutex_);
  return requests_;
}

int HttpServer::connections() const {
  std::lock_guard lock(mutex_);
  return connections_;
}

void HttpServer::run() {
  while (true) {
    pollfd p[2] = {{listenFd_, POLLIN, 0}, {wakeFd_, POLLIN, 0}};
    if (::poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) return;
    const int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) serve(fd);
  }
}

void HttpServer::serve(int fd) {
  {
    std::lock_guard lock(mutex_);
    ++connections_;
  }
  if (behaviour_ == Behaviour::kNeverAnswer) {
    held_.push_back(fd);
    return;
  }
  const std::string data = readRequest(fd);
  Request r;
  const auto headEnd = data.find("\r\n\r\n");
  const auto lineEnd = data.find("\r\n");
  if (headEnd != std::string::npos) {
    const std::string line = data.substr(0, lineEnd);
    r.method = line.substr(0, line.find(' '));
    r.target = line.substr(line.find(' ') + 1, line.rfind(' ') - line.find(' ') - 1);
    r.headers = data.substr(lineEnd + 2, headEnd - lineEnd - 2);
    r.body = data.substr(headEnd + 4);
  }
  r.at = std::chrono::system_clock::now();
  bool fail = behaviour_ == Behaviour::kFail500;
  {
    std::lock_guard lock(mutex_);
    requests_.push_back(r);
    if (behaviour_ == Behaviour::kOk && failuresLeft_ > 0) {
      --failuresLeft_;
      fail = true;
    }
  }
  if (behaviour_ == Behaviour::kRedirectLoop) answer(fd, "302 Found", "Location: " + url(r.target) + "\r\n");
  else answer(fd, fail ? "500 Internal Server Error" : "200 OK", "");
  ::close(fd);
}

}  // namespace lockstep::test
