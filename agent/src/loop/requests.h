#pragma once
// The agent's requests, answered in order of arrival: who sent one (access/access_policy.h), then
// a table of handlers, one per kind of request, each handing its request to the component that
// owns what it asks about. Event loop only.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <variant>

#include "access/access_policy.h"
#include "base/log.h"
#include "base/ports.h"
#include "jobs/jobs.h"
#include "jobs/starts.h"
#include "jobs/supervision.h"
#include "lockstep/protocol/types.h"
#include "stalls/stalls.h"
#include "stream/fetches.h"

namespace lockstep::agent {

// What the handlers act on, owned by the loop.
struct RequestParts {
  ReplyPort& replies;
  AccessPolicy& access;
  JobManager& jobs;
  Starts& starts;
  Fetches& fetches;
  Stalls& stalls;
  Supervisions& supervisions;
  Log& log;
  std::function<NodeHello()> hello;
};

class Requests {
 public:
  explicit Requests(RequestParts parts) : parts_(std::move(parts)) {}

  // Answers (or holds, or hands on) one request from `client`, whose key is `key`.
  void handle(const std::string& client, const std::string& key, Request request);

 private:
  using Body = decltype(Request::body);
  struct Call {
    const std::string& client;
    const std::string& key;
    std::uint64_t id;
    const Caller& caller;
  };
  using Handler = void (Requests::*)(const Call&, Body&);
  struct Route {
    std::size_t kind;  // the index of its request in Request::body
    Handler handle;
  };
  static constexpr std::size_t kKinds = std::variant_size_v<Body>;
  // Request kind → handler (requests.cpp).
  static constexpr std::array<Route, kKinds> routes();

  template <class T, void (Requests::*H)(const Call&, T&)>
  void route(const Call& call, Body& body) {
    (this->*H)(call, std::get<T>(body));
  }
  template <class T, std::size_t I = 0>
  static constexpr std::size_t kindOf() {
    if constexpr (std::is_same_v<std::variant_alternative_t<I, Body>, T>) {
      return I;
    } else {
      return kindOf<T, I + 1>();
    }
  }
  template <class T, void (Requests::*H)(const Call&, T&)>
  static constexpr Route routeOf() {
    return Route{kindOf<T>(), &Requests::route<T, H>};
  }

  void hello(const Call& call, HelloRequest& body);
  void start(const Call& call, StartJobRequest& body);
  void stop(const Call& call, StopJobRequest& body);
  void fetch(const Call& call, FetchRequest& body);
  void list(const Call& call, ListJobsRequest& body);
  void logs(const Call& call, LogsRequest& body);
  void stacks(const Call& call, StacksRequest& body);
  void frame(const Call& call, FrameRequest& body);
  // Whether `call` may not act on the job (then answered with why).
  bool denied(const Call& call, const std::string& jobId);

  RequestParts parts_;
};

}  // namespace lockstep::agent
