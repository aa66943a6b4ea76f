#pragma once
// Webhooks (docs/alerts.md): each alert is POSTed as JSON to the job's and the agent's --notify
// URLs (HTTP or HTTPS; HTTPS checks certificates) on a thread of its own, never the agent's
// event loop: every request is bounded by a timeout, retried with backoff, follows at most a few
// redirects, and many go at once, so a webhook that hangs, refuses, redirects forever or answers
// 500 holds up nothing else. What could not be delivered comes back with why, for the job's
// events. A URL is only ever logged redacted (its path and query can hold a secret).

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/alerts/urls.h"
#include "lockstep/common/result.h"

namespace lockstep::alerts {

class Webhooks {
 public:
  struct Options {
    std::chrono::milliseconds timeout{5000};  // each attempt, connection included
    int maxAttempts = 5;
    std::chrono::milliseconds firstBackoff{500};  // doubled after each failed attempt
    long maxRedirects = 3;
    std::size_t maxQueued = 1024;  // beyond: refused at once, as not delivered
    std::string caFile;            // empty: the system's certificates
  };
  struct Outcome {
    std::string what;         // as given to post()
    std::string redactedUrl;
    bool delivered = false;
    int attempts = 0;
    std::string why;          // not delivered: the last attempt's error ("HTTP 500", "timed out", ...)
  };

  explicit Webhooks(Options options);
  Webhooks() : Webhooks(Options{}) {}
  ~Webhooks();  // stops at once; what is still under way is reported nowhere
  Webhooks(const Webhooks&) = delete;
  Webhooks& operator=(const Webhooks&) = delete;

  // Queues a POST of `json`; never blocks. `what` names it in the outcome ("job j1: gpu_util < 30% firing").
  void post(const std::string& url, std::string json, std::string what);
  // What ended since the last call, delivered or not.
  std::vector<Outcome> take();
  // Waits up to `timeout` until nothing is queued or under way (tests, and an agent that stops).
  bool drain(std::chrono::milliseconds timeout);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lockstep::alerts
