#include "loop/client_port.h"

#include <malloc.h>

#include "lockstep/net/keys.h"
#include "lockstep/protocol/codec.h"

namespace lockstep::agent {
namespace {

using std::chrono::milliseconds;

// Whole requests libzmq holds per connection before it stops reading from it.
constexpr int kRequestQueue = 4;
// What libzmq may have read from a connection and not yet handed over: the requests it holds, the
// one being decoded and the next, and the handshake. More is a multipart message that goes on and
// on (connection_watch.h): its connection is cut.
constexpr std::int64_t kMaxUndelivered =
    (kRequestQueue + 2) * std::int64_t{ClientPort::kMaxRequestBytes + 64} + (64 << 10);
// One key may open several connections (the app, lockstepctl, a supervising agent's per job); so
// many at most, which together hold so much. The connections that have sent no whole message yet
// are of no known key (libzmq names a connection's key only in its messages): all of those hold so
// much together, whoever opened them. Over a bound, the largest are cut.
constexpr std::int64_t kMaxUndeliveredPerKey = std::int64_t{64} << 20;
constexpr std::int64_t kMaxUndeliveredUnknown = std::int64_t{128} << 20;
constexpr std::size_t kMaxConnectionsPerKey = 16;
constexpr auto kSayAgainAfter = std::chrono::minutes(1);

}  // namespace

ClientPort::ClientPort(zmq::context_t& context, Log& log)
    : context_(context),
      log_(log),
      zap_(std::make_unique<ZapHandler>(context)),
      router_(std::make_unique<zmq::socket_t>(context, zmq::socket_type::router)) {}

Result<std::string> ClientPort::bind(const std::string& listen, const CurveKeyPair& keys) {
  LOCKSTEP_TRY(makeCurveServer(*router_, keys));
  router_->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(kMaxRequestBytes));
  router_->set(zmq::sockopt::router_mandatory, 1);
  router_->set(zmq::sockopt::linger, 0);
  router_->set(zmq::sockopt::sndhwm, 10000);
  router_->set(zmq::sockopt::rcvhwm, kRequestQueue);
  watch_ = std::make_unique<ConnectionWatch>(
      context_, *router_,
      ConnectionWatch::Bounds{kMaxUndelivered, kMaxUndeliveredPerKey, kMaxUndeliveredUnknown, kMaxConnectionsPerKey});
  router_->bind(listen);
  return router_->get(zmq::sockopt::last_endpoint);
}

std::array<zmq::pollitem_t, 3> ClientPort::pollItems() {
  return {{{router_->handle(), 0, ZMQ_POLLIN, 0},
           {zap_->socket().handle(), 0, ZMQ_POLLIN, 0},
           {watch_->events().handle(), 0, ZMQ_POLLIN, 0}}};
}

void ClientPort::watchConnections(bool events) {
  if (events) watch_->onEvents();
  const auto now = std::chrono::steady_clock::now();
  if (const auto cuts = watch_->tick(); cuts.total() > 0) {
    sayCuts(cuts);
    // libzmq frees the parts as it tears the connection down, on its own time: give the heap back
    // (a message of many tiny parts leaves it in pieces) a few times over the next seconds.
    trims_ = {now + milliseconds(200), now + milliseconds(1000), now + milliseconds(3000)};
  }
  if (!trims_.empty() && now >= trims_.front()) {
    ::malloc_trim(0);
    trims_.erase(trims_.begin());
  }
}

void ClientPort::sayCuts(const ConnectionWatch::Cuts& cuts) {
  if (cuts.connection > 0) {
    log_.info("cut " + std::to_string(cuts.connection) + " client connection(s) that sent more than " +
              std::to_string(kMaxUndelivered >> 20) + " MiB without finishing a message");
  }
  for (const std::string& key : cuts.groups) {
    sayOnceAMinute("bytes of " + key, "key " + fingerprint(key) + "'s connections held more than " +
                            std::to_string(kMaxUndeliveredPerKey >> 20) +
                            " MiB of unfinished messages together; the largest are cut");
  }
  if (cuts.ungrouped > 0) {
    sayOnceAMinute("bytes of no key", "connections that sent no whole message yet held more than " +
                           std::to_string(kMaxUndeliveredUnknown >> 20) +
                           " MiB together; the largest are cut (" + std::to_string(cuts.ungrouped) + " now)");
  }
}

// `line`, unless a line `about` the same was said less than a minute ago.
void ClientPort::sayOnceAMinute(const std::string& about, const std::string& line) {
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(said_, [&](const auto& entry) { return now - entry.second >= kSayAgainAfter; });
  if (said_.emplace(about, now).second) log_.info(line + " (said at most once a minute)");
}

milliseconds ClientPort::timeout(milliseconds idle) const {
  return watch_->watching() || !trims_.empty() ? ConnectionWatch::kTick : idle;
}

std::optional<ClientPort::Incoming> ClientPort::receive() {
  // The routing id and one body frame are kept; further frames are dropped as they are read.
  bool dropped = false;
  auto frames = receiveMultipart(*router_, 2, &dropped);
  if (!frames) {
    if (frames.error().code != ErrorCode::kUnavailable) log_.info("dropped a request: " + frames.error().message);
    return std::nullopt;
  }
  const std::string client = (*frames)[0].to_string();
  const std::string key = frames->size() > 1 ? clientKeyOf((*frames)[1]) : "";
  if (frames->size() > 1 && !kept(watch_->delivered((*frames)[1], key), key)) return std::nullopt;
  if (dropped || frames->size() != 2) {
    replyError(client, 0, invalidArgument("a request is one frame holding a lockstep.v1.Request"));
    return std::nullopt;
  }
  auto request = decodeRequest((*frames)[1].to_string_view(), kMaxRequestBytes);
  if (!request) {
    replyError(client, 0, request.error());
    return std::nullopt;
  }
  return Incoming{client, key, std::move(request).value()};
}

// Whether a request that came in this way is served: not from a connection that is cut.
bool ClientPort::kept(ConnectionWatch::Delivery delivery, const std::string& key) {
  if (delivery == ConnectionWatch::Delivery::kTooMany) {
    sayOnceAMinute("connections of " + key, "key " + fingerprint(key) + " opened more than " +
                                                std::to_string(kMaxConnectionsPerKey) + " connections; the newest is cut");
  }
  return delivery == ConnectionWatch::Delivery::kServe;
}

bool ClientPort::readable() { return (router_->get(zmq::sockopt::events) & ZMQ_POLLIN) != 0; }

void ClientPort::reply(const std::string& client, const Reply& message) {
  const std::string bytes = encode(message);
  try {
    router_->send(zmq::buffer(client), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    router_->send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // The client left (EHOSTUNREACH) or stopped reading (EAGAIN): it will ask again.
  }
}

}  // namespace lockstep::agent
