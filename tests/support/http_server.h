#pragma once
// A real HTTP server on loopback for tests of webhooks: it accepts connections on a thread of its
// own and answers each request as its behaviour says (200, 500, a redirect to itself, or never),
// keeping what it was sent and when. Plain POSIX sockets; one request per connection.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::test {

class HttpServer {
 public:
  enum class Behaviour { kOk, kFail500, kRedirectLoop, kNeverAnswer };
  struct Request {
    std::string method, target, headers, body;
    std::chrono::system_clock::time_point at;  // when it was read whole
  };

  // `failuresFirst`: with kOk, so many requests are answered 500 before the first 200.
  explicit HttpServer(Behaviour behaviour, int failuresFirst = 0);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  std::uint16_t port() const { return port_; }
  std::string url(const std::string& path = "/hook") const;
  std::vector<Request> requests() const;
  int connections() const;

 private:
  void run();
  void serve(int fd);

  Behaviour behaviour_;
  int failuresLeft_;
  int listenFd_ = -1;
  int wakeFd_ = -1;
  std::uint16_t port_ = 0;
  mutable std::mutex mutex_;
  std::vector<Request> requests_;
  std::vector<int> held_;  // connections never answered, closed at the end
  int connections_ = 0;
  std::thread thread_;
};

}  // namespace lockstep::test
