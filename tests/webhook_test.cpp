// Webhooks against real HTTP servers on loopback (plain POSIX sockets on threads, no mocks):
// one that answers, one that never does, one that fails then recovers, a redirect loop, a 404,
// a closed port. The key property: a webhook that hangs holds up no other.

#include "lockstep/alerts/webhook.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::alerts {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Request {
  std::string method;
  std::string target;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
};

// The raw answer to the n-th request (from 0); empty: never answer, hold the connection open.
using Handler = std::function<std::string(const Request&, int n)>;

std::string answer(int status, const std::string& reason, const std::string& extraHeaders = "") {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason + "\r\n" + extraHeaders +
         "Content-Length: 2\r\nConnection: close\r\n\r\nok";
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// An HTTP/1.1 server on 127.0.0.1, one thread per connection; every thread ends when it stops.
class Server {
 public:
  explicit Server(Handler handler) : handler_(std::move(handler)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(::listen(listener_, 64), 0);
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    EXPECT_EQ(::pipe(stop_), 0);
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~Server() {
    (void)!::write(stop_[1], "x", 1);
    acceptor_.join();
    for (auto& t : connections_) t.join();
    ::close(listener_);
    ::close(stop_[0]);
    ::close(stop_[1]);
  }

  std::string url(const std::string& path = "/hook") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  int port() const { return port_; }
  std::vector<Request> requests() {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  // Waits for `fd` to be readable; false once the server stops.
  bool readable(int fd) const {
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_[0], POLLIN, 0}};
    return ::poll(fds, 2, -1) > 0 && (fds[1].revents & POLLIN) == 0;
  }

  void acceptLoop() {
    while (readable(listener_)) {
      const int fd = ::accept(listener_, nullptr, nullptr);
      if (fd >= 0) connections_.emplace_back([this, fd] { serve(fd); });
    }
  }

  bool readRequest(int fd, Request& r) const {
    std::string data;
    std::size_t headerEnd = std::string::npos;
    std::size_t length = 0;
    char buf[4096];
    while (headerEnd == std::string::npos || data.size() < headerEnd + 4 + length) {
      if (!readable(fd)) return false;
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) return false;
      data.append(buf, static_cast<std::size_t>(n));
      if (headerEnd == std::string::npos && (headerEnd = data.find("\r\n\r\n")) != std::string::npos) {
        parseHead(data.substr(0, headerEnd), r);
        if (r.headers.count("content-length")) length = std::stoul(r.headers["content-length"]);
      }
    }
    r.body = data.substr(headerEnd + 4, length);
    return true;
  }

  static void parseHead(const std::string& head, Request& r) {
    std::size_t lineEnd = head.find("\r\n");
    const std::string first = head.substr(0, lineEnd);
    r.method = first.substr(0, first.find(' '));
    r.target = first.substr(first.find(' ') + 1, first.rfind(' ') - first.find(' ') - 1);
    while (lineEnd != std::string::npos) {
      const std::size_t start = lineEnd + 2;
      lineEnd = head.find("\r\n", start);
      const std::string line = head.substr(start, lineEnd == std::string::npos ? std::string::npos : lineEnd - start);
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      r.headers[lower(line.substr(0, colon))] = line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }

  void serve(int fd) {
    Request r;
    if (readRequest(fd, r)) {
      int n = 0;
      {
        std::lock_guard lock(mutex_);
        n = static_cast<int>(requests_.size());
        requests_.push_back(r);
      }
      const std::string reply = handler_(r, n);
      if (reply.empty()) {
        readable(fd);  // hang until the client gives up or the server stops
      } else {
        (void)!::write(fd, reply.data(), reply.size());
      }
    }
    ::close(fd);
  }

  Handler handler_;
  int listener_ = -1;
  int stop_[2] = {-1, -1};
  int port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // only the acceptor's thread adds, only ~Server joins
  std::mutex mutex_;
  std::vector<Request> requests_;
};

Handler always(int status, const std::string& reason) {
  return [=](const Request&, int) { return answer(status, reason); };
}
Handler never() {
  return [](const Request&, int) { return std::string(); };
}

// A port where nothing listens: bound, then closed.
int closedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

Webhooks::Options fast() {
  Webhooks::Options o;
  o.timeout = 300ms;
  o.maxAttempts = 2;
  o.firstBackoff = 20ms;
  return o;
}

// Waits for `count` outcomes in all.
std::vector<Webhooks::Outcome> waitFor(Webhooks& hooks, std::size_t count, std::chrono::milliseconds limit = 3s) {
  std::vector<Webhooks::Outcome> all;
  const auto end = Clock::now() + limit;
  while (all.size() < count && Clock::now() < end) {
    for (auto& o : hooks.take()) all.push_back(std::move(o));
    if (all.size() < count) std::this_thread::sleep_for(5ms);
  }
  return all;
}

TEST(Webhooks, DeliversTheJsonWithItsHeaders) {
  Server server(always(200, "OK"));
  Webhooks hooks(fast());
  const std::string json = R"({"alert":"gpu_util < 30%","job":"j1"})";
  hooks.post(server.url(), json, "job j1: gpu_util firing");
  ASSERT_TRUE(hooks.drain(3s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].delivered);
  EXPECT_EQ(outcomes[0].attempts, 1);
  EXPECT_EQ(outcomes[0].what, "job j1: gpu_util firing");
  EXPECT_EQ(outcomes[0].redactedUrl, "http://127.0.0.1:" + std::to_string(server.port()) + "/…");
  EXPECT_EQ(outcomes[0].why, "");
  const auto requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "POST");
  EXPECT_EQ(requests[0].target, "/hook");
  EXPECT_EQ(requests[0].body, json);
  EXPECT_EQ(requests[0].headers.at("content-type"), "application/json");
  EXPECT_EQ(requests[0].headers.at("user-agent"), "lockstep/1");
  EXPECT_TRUE(hooks.take().empty());
}

TEST(Webhooks, AHangingWebhookTimesOutAndHoldsUpNoOther) {
  Server hanging(never());
  Server healthy(always(204, "No Content"));
  Webhooks hooks(fast());
  const auto start = Clock::now();
  hooks.post(hanging.url(), "{}", "hanging");
  std::this_thread::sleep_for(50ms);  // the hanging one is under way first
  hooks.post(healthy.url(), "{}", "healthy");
  auto first = waitFor(hooks, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].what, "healthy");
  EXPECT_TRUE(first[0].delivered);
  // Well before the hanging one's first attempt (300 ms) ran out.
  EXPECT_LT(Clock::now() - start, 250ms);

  auto last = waitFor(hooks, 1);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].what, "hanging");
  EXPECT_FALSE(last[0].delivered);
  EXPECT_EQ(last[0].attempts, 2);
  EXPECT_EQ(last[0].why, "timed out after 300 ms");
  EXPECT_EQ(hanging.requests().size(), 2u);
  // Two attempts of 300 ms and a backoff of 20 ms, no more.
  EXPECT_LT(Clock::now() - start, 1500ms);
}

TEST(Webhooks, RetriesA500UntilItSucceeds) {
  Server server([](const Request&, int n) { return n < 2 ? answer(500, "Oops") : answer(200, "OK"); });
  auto options = fast();
  options.maxAttempts = 5;
  Webhooks hooks(options);
  hooks.post(server.url(), "{}", "flaky");
  ASSERT_TRUE(hooks.drain(3s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].delivered);
  EXPECT_EQ(outcomes[0].attempts, 3);
  EXPECT_EQ(server.requests().size(), 3u);
  for (const auto& r : server.requests()) EXPECT_EQ(r.body, "{}");
}

TEST(Webhooks, GivesUpOnA500AfterMaxAttemptsWithBackoff) {
  Server server(always(500, "Oops"));
  auto options = fast();
  options.maxAttempts = 3;
  options.firstBackoff = 100ms;
  Webhooks hooks(options);
  const auto start = Clock::now();
  hooks.post(server.url(), "{}", "broken");
  ASSERT_TRUE(hooks.drain(3s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].delivered);
  EXPECT_EQ(outcomes[0].attempts, 3);
  EXPECT_EQ(outcomes[0].why, "HTTP 500");
  EXPECT_GE(Clock::now() - start, 300ms);  // 100 ms, then 200 ms
}

TEST(Webhooks, ARedirectLoopEndsWithTooManyRedirects) {
  Server server([](const Request&, int) { return answer(302, "Found", "Location: /loop\r\n"); });
  Webhooks hooks(fast());
  const auto start = Clock::now();
  hooks.post(server.url("/loop"), "{}", "loop");
  ASSERT_TRUE(hooks.drain(3s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].delivered);
  EXPECT_EQ(outcomes[0].why, "too many redirects (more than 3) (not retried)");
  EXPECT_EQ(outcomes[0].attempts, 1);
  EXPECT_LT(Clock::now() - start, 1s);
  const auto requests = server.requests();
  EXPECT_EQ(requests.size(), 4u);  // the first and 3 redirects
  for (const auto& r : requests) EXPECT_EQ(r.method, "POST");  // a 302 keeps POSTing
}

TEST(Webhooks, FollowsARedirectWithThePost) {
  Server target(always(200, "OK"));
  Server moved([&](const Request&, int) { return answer(301, "Moved", "Location: " + target.url("/new") + "\r\n"); });
  Webhooks hooks(fast());
  hooks.post(moved.url(), R"({"a":1})", "moved");
  ASSERT_TRUE(hooks.drain(3s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].delivered);
  ASSERT_EQ(target.requests().size(), 1u);
  EXPECT_EQ(target.requests()[0].method, "POST");
  EXPECT_EQ(target.requests()[0].body, R"({"a":1})");
}

TEST(Webhooks, A404IsNotRetriedButA429Is) {
  Server missing(always(404, "Not Found"));
  Server busy(always(429, "Too Many Requests"));
  Webhooks hooks(fast());
  hooks.post(missing.url(), "{}", "missing");
  hooks.post(busy.url(), "{}", "busy");
  ASSERT_TRUE(hooks.drain(3s));
  std::map<std::string, Webhooks::Outcome> byWhat;
  for (auto& o : hooks.take()) byWhat[o.what] = o;
  ASSERT_EQ(byWhat.size(), 2u);
  EXPECT_EQ(byWhat["missing"].attempts, 1);
  EXPECT_EQ(byWhat["missing"].why, "HTTP 404 (not retried)");
  EXPECT_FALSE(byWhat["missing"].delivered);
  EXPECT_EQ(byWhat["busy"].attempts, 2);
  EXPECT_EQ(byWhat["busy"].why, "HTTP 429");
}

TEST(Webhooks, AClosedPortCannotConnect) {
  Webhooks hooks(fast());
  hooks.post("http://127.0.0.1:" + std::to_string(closedPort()) + "/x", "{}", "closed");
  ASSERT_TRUE(hooks.drain(3s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].delivered);
  EXPECT_EQ(outcomes[0].attempts, 2);
  EXPECT_EQ(outcomes[0].why, "could not connect (refused or unreachable)");
}

TEST(Webhooks, HttpsToAPlainHttpServerIsNotDelivered) {
  Server server(always(200, "OK"));
  Webhooks hooks(fast());
  std::string url = server.url();
  url.replace(0, 4, "https");
  hooks.post(url, "{}", "tls");
  ASSERT_TRUE(hooks.drain(3s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].delivered);
  EXPECT_FALSE(outcomes[0].why.empty());
  EXPECT_EQ(outcomes[0].redactedUrl.rfind("https://127.0.0.1:", 0), 0u);
}

// `openssl s_server` with a self-signed certificate for localhost, in a process of its own. It
// speaks TLS but does not answer a POST: enough to see whether the handshake is trusted.
class TlsServer {
 public:
  TlsServer() {
    dir_ = std::filesystem::temp_directory_path() / ("webhook_test_tls_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    const std::string make = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1"
                             " -subj /CN=localhost -addext subjectAltName=DNS:localhost -keyout " +
                             (dir_ / "key.pem").string() + " -out " + cert() + " >/dev/null 2>&1";
    if (std::system(make.c_str()) != 0) return;
    port_ = closedPort();
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string accept = "127.0.0.1:" + std::to_string(port_);
      const std::string key = (dir_ / "key.pem").string();
      const std::string certificate = cert();
      ::freopen("/dev/null", "w", stdout);
      ::freopen("/dev/null", "w", stderr);
      ::execlp("openssl", "openssl", "s_server", "-quiet", "-accept", accept.c_str(), "-cert", certificate.c_str(),
               "-key", key.c_str(), nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !ready_; ++i) {
      ready_ = connects();
      if (!ready_) std::this_thread::sleep_for(10ms);
    }
  }
  ~TlsServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  bool ready() const { return ready_; }
  std::string cert() const { return (dir_ / "cert.pem").string(); }
  std::string url() const { return "https://localhost:" + std::to_string(port_) + "/hooks/SECRET123"; }

 private:
  bool connects() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    return ok;
  }

  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
  bool ready_ = false;
};

TEST(Webhooks, ASelfSignedCertificateIsNotTrustedUnlessItIsTheCaFile) {
  TlsServer server;
  if (!server.ready()) GTEST_SKIP() << "openssl could not make a certificate or run s_server";
  auto options = fast();
  options.maxAttempts = 1;
  Webhooks untrusting(options);
  untrusting.post(server.url(), "{}", "self-signed");
  ASSERT_TRUE(untrusting.drain(3s));
  auto outcomes = untrusting.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].delivered);
  EXPECT_EQ(outcomes[0].why, "the server's TLS certificate is not trusted (or not for this host)");

  // Trusted through caFile, the handshake passes: what fails then is that s_server does not answer
  // HTTP (it closes the connection, or lets it time out).
  options.caFile = server.cert();
  Webhooks trusting(options);
  trusting.post(server.url(), "{}", "self-signed, trusted");
  ASSERT_TRUE(trusting.drain(3s));
  outcomes = trusting.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].why.find("certificate"), std::string::npos) << outcomes[0].why;
  EXPECT_EQ(outcomes[0].why.find("TLS"), std::string::npos) << outcomes[0].why;
}

TEST(Webhooks, TheUrlsSecretAppearsInNoOutcome) {
  const std::string secretPath = "/hooks/SECRET123?token=abc";
  Server ok(always(200, "OK"));
  Server missing(always(404, "Not Found"));
  Server hanging(never());
  Server loop([](const Request&, int) { return answer(302, "Found", "Location: /hooks/SECRET123?token=abc\r\n"); });
  Webhooks hooks(fast());
  std::vector<std::string> urls = {ok.url(secretPath), missing.url(secretPath), hanging.url(secretPath),
                                   loop.url(secretPath),
                                   "http://user:SECRET123@127.0.0.1:" + std::to_string(closedPort()) + secretPath,
                                   "ftp://127.0.0.1/SECRET123", "http://127.0.0.1/SECRET123 x"};
  for (const auto& url : urls) hooks.post(url, "{}", "w");
  ASSERT_TRUE(hooks.drain(3s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), urls.size());
  for (const auto& o : outcomes) {
    for (const std::string& field : {o.redactedUrl, o.why}) {
      EXPECT_EQ(field.find("SECRET123"), std::string::npos) << field;
      EXPECT_EQ(field.find("token"), std::string::npos) << field;
      EXPECT_EQ(field.find("abc"), std::string::npos) << field;
    }
  }
}

TEST(Webhooks, TheDestructorReturnsAtOnceWhileARequestHangs) {
  Server hanging(never());
  auto options = fast();
  options.timeout = 10s;
  auto hooks = std::make_unique<Webhooks>(options);
  hooks->post(hanging.url(), "{}", "hanging");
  for (int i = 0; i < 100 && hanging.requests().empty(); ++i) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(hanging.requests().size(), 1u);
  EXPECT_FALSE(hooks->drain(50ms));
  const auto start = Clock::now();
  hooks.reset();
  EXPECT_LT(Clock::now() - start, 500ms);
}

TEST(Webhooks, BeyondTheQueueBoundAPostIsRefusedAtOnce) {
  Server hanging(never());
  auto options = fast();
  options.maxQueued = 2;
  options.timeout = 10s;
  Webhooks hooks(options);
  for (int i = 0; i < 3; ++i) hooks.post(hanging.url(), "{}", "alert " + std::to_string(i));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].what, "alert 2");
  EXPECT_FALSE(outcomes[0].delivered);
  EXPECT_EQ(outcomes[0].attempts, 0);
  EXPECT_EQ(outcomes[0].why, "too many alerts waiting to be delivered");
}

TEST(Webhooks, AnInvalidUrlIsNotTried) {
  Webhooks hooks(fast());
  hooks.post("gopher://example.com/x", "{}", "bad");
  ASSERT_TRUE(hooks.drain(1s));
  const auto outcomes = hooks.take();
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_FALSE(outcomes[0].delivered);
  EXPECT_EQ(outcomes[0].attempts, 0);
  EXPECT_NE(outcomes[0].why.find("not http:// or https://"), std::string::npos) << outcomes[0].why;
}

TEST(RedactUrl, KeepsSchemeHostAndPortOnly) {
  EXPECT_EQ(redactUrl("https://hooks.slack.com/services/T0/B0/XYZ"), "https://hooks.slack.com/…");
  EXPECT_EQ(redactUrl("http://127.0.0.1:8080/hooks/SECRET123?token=abc"), "http://127.0.0.1:8080/…");
  EXPECT_EQ(redactUrl("https://example.com?token=abc"), "https://example.com/…");
  EXPECT_EQ(redactUrl("https://example.com/"), "https://example.com/");
  EXPECT_EQ(redactUrl("https://example.com"), "https://example.com");
  EXPECT_EQ(redactUrl("https://user:pass@example.com:8443/x"), "https://example.com:8443/…");
  EXPECT_EQ(redactUrl("http://[::1]:9000/a"), "http://[::1]:9000/…");
  EXPECT_EQ(redactUrl("not a url"), "(a URL that could not be read)");
  EXPECT_EQ(redactUrl(""), "(a URL that could not be read)");
  EXPECT_EQ(redactUrl("https:///path"), "(a URL that could not be read)");
  EXPECT_EQ(redactUrl("://host/x"), "(a URL that could not be read)");
}

TEST(CheckWebhookUrl, AcceptsHttpAndHttps) {
  EXPECT_TRUE(checkWebhookUrl("https://hooks.slack.com/services/T0/B0/XYZ").ok());
  EXPECT_TRUE(checkWebhookUrl("http://127.0.0.1:8080/hook?x=1").ok());
  EXPECT_TRUE(checkWebhookUrl("HTTPS://example.com").ok());
  EXPECT_TRUE(checkWebhookUrl("http://[::1]:9000/a").ok());
}

TEST(CheckWebhookUrl, RefusesWhatCannotBeAWebhook) {
  const auto refused = [](std::string_view url, std::string_view words) {
    const auto r = checkWebhookUrl(url);
    ASSERT_FALSE(r.ok()) << url;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find(words), std::string::npos) << r.error().message;
    EXPECT_EQ(r.error().message.find("SECRET"), std::string::npos) << r.error().message;
  };
  refused("ftp://example.com/SECRET", "not http:// or https://");
  refused("example.com/SECRET", "not http:// or https://");
  refused("https:///SECRET", "names no host");
  refused("https://:443/SECRET", "names no host");
  refused("https://example.com/SECRET x", "blank or a control character");
  refused("https://example.com/SECRET\n", "blank or a control character");
  refused("https://example.com:99999/SECRET", "port");
  refused("https://example.com:http/SECRET", "port");
  refused("https://example.com/SECRET" + std::string(2100, 'a'), "at most 2048");
}

}  // namespace
}  // namespace lockstep::alerts
