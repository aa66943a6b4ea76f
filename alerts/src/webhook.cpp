#include "lockstep/alerts/webhook.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

namespace lockstep::alerts {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The error of an attempt in our own words: curl's error buffer can quote the URL, with its secret.
std::string describe(CURLcode code, const Webhooks::Options& options) {
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT: return "timed out after " + std::to_string(options.timeout.count()) + " ms";
    case CURLE_COULDNT_CONNECT: return "could not connect (refused or unreachable)";
    case CURLE_COULDNT_RESOLVE_HOST: return "could not resolve the host name";
    case CURLE_COULDNT_RESOLVE_PROXY: return "could not resolve the proxy's host name";
    case CURLE_TOO_MANY_REDIRECTS:
      return "too many redirects (more than " + std::to_string(options.maxRedirects) + ")";
    case CURLE_UNSUPPORTED_PROTOCOL: return "redirected to a scheme other than http or https";
    case CURLE_PEER_FAILED_VERIFICATION: return "the server's TLS certificate is not trusted (or not for this host)";
    case CURLE_SSL_CACERT_BADFILE: return "could not read the CA certificates file";
    case CURLE_SSL_CONNECT_ERROR: return "the TLS handshake failed";
    case CURLE_GOT_NOTHING: return "the server closed the connection without answering";
    case CURLE_SEND_ERROR: return "the connection failed while sending";
    case CURLE_RECV_ERROR: return "the connection failed while receiving";
    case CURLE_WEIRD_SERVER_REPLY: return "the server did not answer in HTTP";
    default: return curl_easy_strerror(code);  // a fixed text per code, never the URL
  }
}

// A wrong URL, a redirect loop or a scheme we refuse will not heal by trying again; a server
// that is down, slow or busy (5xx, 408, 429, timeouts) may.
bool worthRetrying(CURLcode code, long status) {
  if (code == CURLE_OK) return !(status >= 400 && status < 500 && status != 408 && status != 429);
  return code != CURLE_TOO_MANY_REDIRECTS && code != CURLE_UNSUPPORTED_PROTOCOL && code != CURLE_URL_MALFORMAT;
}

size_t discardBody(char*, size_t size, size_t count, void*) { return size * count; }

std::once_flag curlInitialized;

}  // namespace

// One alert to one URL, from post() until its outcome.
struct Delivery {
  std::string url;
  std::string json;
  Webhooks::Outcome outcome;
  Clock::time_point retryAt;
};

// The thread owns the curl multi handle and every Delivery once taken from `queued_`; the mutex
// guards only what post(), take() and drain() share with it.
class Webhooks::Impl {
 public:
  explicit Impl(Options options) : options_(std::move(options)) {
    std::call_once(curlInitialized, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    multi_ = curl_multi_init();
    headers_ = curl_slist_append(headers_, "Content-Type: application/json");
    // No "Expect: 100-continue" round trip: a webhook answers the POST as a whole.
    headers_ = curl_slist_append(headers_, "Expect:");
    thread_ = std::thread([this] { run(); });
  }

  ~Impl() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    curl_multi_wakeup(multi_);
    thread_.join();
    curl_multi_cleanup(multi_);
    curl_slist_free_all(headers_);
  }

  void post(const std::string& url, std::string json, std::string what) {
    Delivery d{url, std::move(json), Outcome{std::move(what), redactUrl(url), false, 0, ""}, {}};
    if (auto valid = checkWebhookUrl(url); !valid) {
      d.outcome.why = valid.error().message;
      finishedAtOnce(std::move(d.outcome));
      return;
    }
    {
      std::lock_guard lock(mutex_);
      if (unfinished_ >= options_.maxQueued) {
        d.outcome.why = "too many alerts waiting to be delivered";
        done_.push_back(std::move(d.outcome));
        return;
      }
      ++unfinished_;
      queued_.push_back(std::move(d));
    }
    curl_multi_wakeup(multi_);
  }

  std::vector<Outcome> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(done_, {});
  }

  bool drain(milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return idle_.wait_for(lock, timeout, [this] { return unfinished_ == 0; });
  }

 private:
  void finishedAtOnce(Outcome outcome) {
    std::lock_guard lock(mutex_);
    done_.push_back(std::move(outcome));
  }

  void finished(Outcome outcome) {
    std::lock_guard lock(mutex_);
    done_.push_back(std::move(outcome));
    if (--unfinished_ == 0) idle_.notify_all();
  }

  void run() {
    while (true) {
      std::deque<Delivery> fresh;
      {
        std::lock_guard lock(mutex_);
        if (stopping_) break;
        fresh.swap(queued_);
      }
      for (auto& d : fresh) start(std::make_unique<Delivery>(std::move(d)));
      startDueRetries();
      int running = 0;
      curl_multi_perform(multi_, &running);
      collectFinished();
      // curl_multi_poll also wakes for curl's own timers (timeouts) and for curl_multi_wakeup.
      curl_multi_poll(multi_, nullptr, 0, untilNextRetryMs(), nullptr);
    }
    stopAll();
  }

  void start(std::unique_ptr<Delivery> d) {
    CURL* easy = curl_easy_init();
    if (easy == nullptr) {
      d->outcome.why = "could not start a transfer (out of memory)";
      finished(std::move(d->outcome));
      return;
    }
    ++d->outcome.attempts;
    configure(easy, *d);
    curl_multi_add_handle(multi_, easy);
    active_.emplace(easy, std::move(d));
  }

  void configure(CURL* easy, Delivery& d) const {
    curl_easy_setopt(easy, CURLOPT_URL, d.url.c_str());
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(d.json.size()));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, d.json.data());  // `d` outlives the transfer
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(easy, CURLOPT_USERAGENT, "lockstep/1");
    curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout.count()));
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);  // a thread may not take signals for DNS timeouts
    curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(easy, CURLOPT_MAXREDIRS, options_.maxRedirects);
    curl_easy_setopt(easy, CURLOPT_POSTREDIR, static_cast<long>(CURL_REDIR_POST_ALL));  // keep POSTing
    curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
    // An https webhook is never redirected to plain http: the alert (its stacks) would go out in clear.
    const bool secure = d.url.size() >= 8 && std::equal(d.url.begin(), d.url.begin() + 8, "https://", [](char a, char b) {
                          return std::tolower(static_cast<unsigned char>(a)) == b;
                        });
    curl_easy_setopt(easy, CURLOPT_REDIR_PROTOCOLS_STR, secure ? "https" : "http,https");
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 2L);
    if (!options_.caFile.empty()) curl_easy_setopt(easy, CURLOPT_CAINFO, options_.caFile.c_str());
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, discardBody);  // else curl writes it to stdout
  }

  void collectFinished() {
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* easy = msg->easy_handle;
      const CURLcode code = msg->data.result;
      long status = 0;
      curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
      curl_multi_remove_handle(multi_, easy);
      curl_easy_cleanup(easy);
      auto it = active_.find(easy);
      std::unique_ptr<Delivery> d = std::move(it->second);
      active_.erase(it);
      attemptEnded(std::move(d), code, status);
    }
  }

  void attemptEnded(std::unique_ptr<Delivery> d, CURLcode code, long status) {
    if (code == CURLE_OK && status >= 200 && status < 300) {
      d->outcome.delivered = true;
      d->outcome.why.clear();
      finished(std::move(d->outcome));
      return;
    }
    d->outcome.why = code == CURLE_OK ? "HTTP " + std::to_string(status) : describe(code, options_);
    if (!worthRetrying(code, status)) {
      d->outcome.why += " (not retried)";
      finished(std::move(d->outcome));
      return;
    }
    if (d->outcome.attempts >= options_.maxAttempts) {
      finished(std::move(d->outcome));
      return;
    }
    d->retryAt = Clock::now() + backoff(d->outcome.attempts);
    waiting_.push_back(std::move(d));
  }

  // firstBackoff after the first failure, doubled after each one after it (capped: no overflow).
  milliseconds backoff(int failures) const {
    const int doublings = std::min(failures - 1, 20);
    return std::min(options_.firstBackoff * (milliseconds::rep{1} << doublings), milliseconds(std::chrono::hours(1)));
  }

  void startDueRetries() {
    const auto now = Clock::now();
    auto due = std::stable_partition(waiting_.begin(), waiting_.end(),
                                     [&](const std::unique_ptr<Delivery>& d) { return d->retryAt > now; });
    std::vector<std::unique_ptr<Delivery>> starting(std::make_move_iterator(due),
                                                    std::make_move_iterator(waiting_.end()));
    waiting_.erase(due, waiting_.end());
    for (auto& d : starting) start(std::move(d));
  }

  int untilNextRetryMs() const {
    milliseconds wait{1000};
    const auto now = Clock::now();
    for (const auto& d : waiting_) {
      wait = std::min(wait, std::chrono::ceil<milliseconds>(d->retryAt - now));
    }
    return static_cast<int>(std::max(wait, milliseconds(0)).count());
  }

  // What is under way is dropped unreported (the header's promise): removing a transfer closes it.
  void stopAll() {
    for (auto& [easy, d] : active_) {
      curl_multi_remove_handle(multi_, easy);
      curl_easy_cleanup(easy);
    }
    active_.clear();
    waiting_.clear();
  }

  const Options options_;
  CURLM* multi_ = nullptr;
  curl_slist* headers_ = nullptr;

  std::mutex mutex_;
  std::condition_variable idle_;
  std::deque<Delivery> queued_;  // posted, not yet taken by the thread
  std::vector<Outcome> done_;
  std::size_t unfinished_ = 0;   // queued, under way or waiting to retry
  bool stopping_ = false;

  // The thread's alone.
  std::map<CURL*, std::unique_ptr<Delivery>> active_;
  std::vector<std::unique_ptr<Delivery>> waiting_;
  std::thread thread_;
};

Webhooks::Webhooks(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Webhooks::~Webhooks() = default;

void Webhooks::post(const std::string& url, std::string json, std::string what) {
  impl_->post(url, std::move(json), std::move(what));
}
std::vector<Webhooks::Outcome> Webhooks::take() { return impl_->take(); }
bool Webhooks::drain(std::chrono::milliseconds timeout) { return impl_->drain(timeout); }

}  // namespace lockstep::alerts
