#include "lockstep/client/agent_client.h"

#include <atomic>
#include <charconv>
#include <cstring>
#include <optional>
#include <utility>
#include <zmq.hpp>

#include "lockstep/net/zmq_util.h"
#include "lockstep/protocol/codec.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::int64_t kMaxReplyBytes = 256 << 20;

std::atomic<int> g_monitorCounter{0};

// Every client of this process shares one context: one I/O thread for all its connections, not two
// threads and several files each (a supervising agent holds one connection per node of a job, 2,048
// at 16,384 GPUs). Never destroyed: terminating it at exit would wait for sockets of threads still
// running then.
zmq::context_t& sharedContext() {
  static zmq::context_t* context = [] {
    auto* c = new zmq::context_t(1);
    // Three sockets a connection (its own, its monitor and the monitor's own); where libzmq refuses,
    // its default (1,023) stays.
    zmq_ctx_set(c->handle(), ZMQ_MAX_SOCKETS, 65536);
    return c;
  }();
  return *context;
}

template <class T>
Result<T> expect(Result<Reply> reply, const char* what) {
  if (!reply) return reply.error();
  if (auto* error = std::get_if<ErrorReply>(&reply->body)) return Error{error->code, error->message};
  if (auto* body = std::get_if<T>(&reply->body)) return std::move(*body);
  return internalError(std::string("the agent answered a ") + what + " request with something else");
}

}  // namespace

Result<AgentAddress> parseAgentAddress(const std::string& text) {
  AgentAddress a;
  const auto colon = text.rfind(':');
  a.host = colon == std::string::npos ? text : text.substr(0, colon);
  if (a.host.empty()) return invalidArgument("agent address '" + text + "': expected HOST:PORT");
  if (colon != std::string::npos) {
    const std::string port = text.substr(colon + 1);
    unsigned value = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
      return invalidArgument("agent address '" + text + "': the port must be a number from 1 to 65535");
    }
    a.port = static_cast<std::uint16_t>(value);
  }
  return a;
}

class AgentClient::Impl {
 public:
  Impl(AgentAddress address, CurveKeyPair keys, std::string agentKey)
      : address_(std::move(address)), keys_(std::move(keys)), agentKey_(std::move(agentKey)), context_(sharedContext()) {}

  Result<void> open() {
    try {
      socket_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::dealer);
      LOCKSTEP_TRY(makeCurveClient(*socket_, keys_, agentKey_));
      socket_->set(zmq::sockopt::linger, 0);
      socket_->set(zmq::sockopt::maxmsgsize, kMaxReplyBytes);
      socket_->set(zmq::sockopt::reconnect_ivl, 100);
      socket_->set(zmq::sockopt::reconnect_ivl_max, 2000);
      // Handshake events explain a silent agent: refused key, wrong pinned key, nobody there.
      const std::string monitorEndpoint = "inproc://agent-client-monitor-" + std::to_string(++g_monitorCounter);
      if (zmq_socket_monitor(socket_->handle(), monitorEndpoint.c_str(), ZMQ_EVENT_ALL) != 0) {
        return internalError("cannot monitor the agent connection");
      }
      monitor_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pair);
      monitor_->set(zmq::sockopt::linger, 0);
      monitor_->connect(monitorEndpoint);
      socket_->connect(address_.endpoint());
      return {};
    } catch (const zmq::error_t& e) {
      return invalidArgument("cannot connect to " + address_.text() + ": " + e.what());
    }
  }

  Result<Reply> call(decltype(Request::body) body, milliseconds timeout) {
    LOCKSTEP_TRY(send(std::move(body)));
    return receive(Clock::now() + timeout, timeout);
  }

  // Sends without waiting; the answer is receive()'s. A later send() leaves this one's answer unread.
  Result<void> send(decltype(Request::body) body) {
    pending_ = 0;  // a failed send leaves nothing to receive, not the answer of the one before
    const std::uint64_t id = ++nextRequestId_;
    const std::string bytes = encode(Request{id, std::move(body)});
    if (bytes.size() > kMaxMessageBytes) {
      // The agent drops it unread: say so rather than wait for an answer that cannot come.
      return invalidArgument("the request is " + std::to_string(bytes.size() >> 10) + " KiB, over the " +
                             std::to_string(kMaxMessageBytes >> 20) + " MiB an agent takes (a job placing many ranks "
                             "on nodes with long names?): shorten the node names or split the job");
    }
    try {
      if (!socket_->send(zmq::buffer(bytes), zmq::send_flags::dontwait)) {
        // DEALER queues until a peer exists, so a full queue means the agent has not answered for a long time.
        return Error{ErrorCode::kUnavailable, "the request queue to " + address_.text() + " is full"};
      }
    } catch (const zmq::error_t& e) {
      return ioError("talking to " + address_.text() + ": " + e.what());
    }
    pending_ = id;
    return {};
  }

  // The answer to the last request sent, by `deadline`; one that came already is taken even past it.
  // `timeout`: the request's whole allowance, as its error says it.
  Result<Reply> receive(Clock::time_point deadline, milliseconds timeout) {
    if (!pending_) return internalError("no request to " + address_.text() + " awaits an answer");
    const std::uint64_t id = std::exchange(pending_, 0);
    try {
      while (true) {
        const auto left = std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
        zmq::pollitem_t items[] = {{socket_->handle(), 0, ZMQ_POLLIN, 0}, {monitor_->handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 2, left);
        if (items[1].revents & ZMQ_POLLIN) drainMonitor();
        if (authFailed_) return refusedError();
        if (items[0].revents & ZMQ_POLLIN) {
          zmq::message_t message;
          if (!socket_->recv(message, zmq::recv_flags::dontwait)) continue;
          auto reply = decodeReply(message.to_string_view(), static_cast<std::size_t>(kMaxReplyBytes));
          if (!reply) return reply.error().withContext("agent " + address_.text() + " sent a bad reply");
          if (reply->requestId != id && reply->requestId != 0) continue;  // a late answer to an old request
          return reply;
        }
        if (Clock::now() >= deadline) return silenceError(timeout);
      }
    } catch (const zmq::error_t& e) {
      return ioError("talking to " + address_.text() + ": " + e.what());
    }
  }

  void drainMonitor() {
    while (true) {
      zmq::message_t event, endpoint;
      if (!monitor_->recv(event, zmq::recv_flags::dontwait)) return;
      if (event.more()) (void)monitor_->recv(endpoint, zmq::recv_flags::dontwait);
      if (event.size() < 6) continue;
      std::uint16_t kind = 0;
      std::uint32_t value = 0;
      std::memcpy(&kind, event.data(), 2);
      std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
      switch (kind) {
        case ZMQ_EVENT_CONNECTED: connected_ = true; break;
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED: handshakeOk_ = true; break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH: authFailed_ = true; break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL: handshakeFailed_ = true; break;
        case ZMQ_EVENT_DISCONNECTED:
          if (!handshakeOk_) handshakeFailed_ = true;
          break;
        default: break;
      }
    }
  }

  Error refusedError() const {
    return Error{ErrorCode::kPermissionDenied,
                 "agent " + address_.text() + " refused this client's key " + fingerprint(keys_.publicKey) +
                     ": on that node, add this line to the agent's authorized_keys (in its state directory):\n  " +
                     keys_.publicKey + " lockstepctl"};
  }

  Error silenceError(milliseconds timeout) {
    drainMonitor();
    if (authFailed_) return refusedError();
    if (handshakeFailed_ && !handshakeOk_) {
      return Error{ErrorCode::kPermissionDenied,
                   "agent " + address_.text() + " did not complete the encrypted handshake with the pinned key " +
                       fingerprint(agentKey_) +
                       ": this is not that agent, or its key changed. If the agent was reinstalled, get its key on "
                       "the node (lockstep-agent --print-key), check it, then run: lockstepctl trust " +
                       address_.text() + " KEY"};
    }
    if (!connected_) {
      return Error{ErrorCode::kUnavailable, "no agent answers at " + address_.text() + " (is lockstep-agent running "
                                            "there, listening on that address?)"};
    }
    return timeoutError("agent " + address_.text() + " did not answer within " + std::to_string(timeout.count()) + " ms");
  }

  AgentAddress address_;
  CurveKeyPair keys_;
  std::string agentKey_;
  zmq::context_t& context_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::unique_ptr<zmq::socket_t> monitor_;
  std::uint64_t nextRequestId_ = 0;
  std::uint64_t pending_ = 0;  // the request sent whose answer is not yet received; 0: none
  bool connected_ = false, handshakeOk_ = false, handshakeFailed_ = false, authFailed_ = false;
  NodeHello hello_;
};

AgentClient::AgentClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AgentClient::~AgentClient() {
  // The monitor must be stopped before its socket closes.
  if (impl_ && impl_->socket_) zmq_socket_monitor(impl_->socket_->handle(), nullptr, 0);
}

Result<std::unique_ptr<AgentClient>> AgentClient::connect(const AgentAddress& address, const CurveKeyPair& clientKeys,
                                                          const std::string& agentPublicKey, milliseconds timeout) {
  auto client = open(address, clientKeys, agentPublicKey);
  if (client) LOCKSTEP_TRY((*client)->refreshHello(timeout));
  return client;
}

Result<std::unique_ptr<AgentClient>> AgentClient::open(const AgentAddress& address, const CurveKeyPair& clientKeys,
                                                       const std::string& agentPublicKey) {
  auto impl = std::make_unique<Impl>(address, clientKeys, agentPublicKey);
  LOCKSTEP_TRY(impl->open());
  return std::unique_ptr<AgentClient>(new AgentClient(std::move(impl)));
}

const AgentAddress& AgentClient::address() const { return impl_->address_; }
const std::string& AgentClient::agentKey() const { return impl_->agentKey_; }
const NodeHello& AgentClient::hello() const { return impl_->hello_; }

Result<NodeHello> AgentClient::refreshHello(milliseconds timeout) {
  LOCKSTEP_TRY(sendHello());
  return receiveHello(Clock::now() + timeout, timeout);
}

Result<void> AgentClient::sendHello() { return impl_->send(HelloRequest{kProtocolVersion, "lockstep client"}); }

Result<NodeHello> AgentClient::receiveHello(Clock::time_point deadline, milliseconds timeout) {
  auto hello = expect<NodeHello>(impl_->receive(deadline, timeout), "hello");
  if (hello) impl_->hello_ = *hello;
  return hello;
}

Result<ClockOffset> AgentClient::measureClock(int exchanges, milliseconds timeout) {
  std::optional<ClockOffset> best;
  for (int i = 0; i < exchanges; ++i) {
    // The round trip on the steady clock (this machine's own clock may be stepped meanwhile).
    const std::int64_t sent = unixMicrosNow();
    const auto start = std::chrono::steady_clock::now();
    auto hello = refreshHello(timeout);
    const std::int64_t received =
        sent + std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
    if (!hello) return hello.error();
    if (hello->timeUnixUs == 0) {
      return Error{ErrorCode::kFailedPrecondition, "node " + hello->nodeName + "'s agent (" + hello->agentVersion +
                                                  ") does not say its time: upgrade it to line its clock up"};
    }
    const ClockOffset c = ClockOffset::of(sent, hello->timeUnixUs, received);
    if (!best || c.uncertaintyUs < best->uncertaintyUs) best = c;
  }
  if (!best) return invalidArgument("measureClock: no exchanges asked for");
  return *best;
}

Result<StartJobReply> AgentClient::startJob(const JobSpec& spec, const std::string& storeSecret, milliseconds timeout) {
  return expect<StartJobReply>(impl_->call(StartJobRequest{spec, storeSecret}, timeout), "start job");
}

Result<StopJobReply> AgentClient::stopJob(const std::string& jobId, std::uint32_t graceMs, milliseconds timeout) {
  return expect<StopJobReply>(impl_->call(StopJobRequest{jobId, graceMs}, timeout), "stop job");
}

Result<void> AgentClient::sendStopJob(const std::string& jobId, std::uint32_t graceMs) {
  return impl_->send(StopJobRequest{jobId, graceMs});
}

Result<StopJobReply> AgentClient::receiveStopJob(Clock::time_point deadline, milliseconds timeout) {
  return expect<StopJobReply>(impl_->receive(deadline, timeout), "stop job");
}

std::vector<Result<StopJobReply>> stopJobOnEach(const std::vector<AgentClient*>& agents, const std::string& jobId,
                                                std::uint32_t graceMs, milliseconds timeout) {
  std::vector<Result<void>> sent;
  for (AgentClient* agent : agents) sent.push_back(agent->sendStopJob(jobId, graceMs));
  const auto deadline = AgentClient::Clock::now() + timeout;
  std::vector<Result<StopJobReply>> replies;
  for (std::size_t i = 0; i < agents.size(); ++i) {
    replies.push_back(sent[i] ? agents[i]->receiveStopJob(deadline, timeout) : Result<StopJobReply>(sent[i].error()));
  }
  return replies;
}

Result<FetchReply> AgentClient::fetch(std::uint64_t afterSeq, std::uint32_t maxMessages, std::uint32_t waitMs,
                                      milliseconds timeout, std::vector<std::string> jobsLeftOut) {
  return expect<FetchReply>(
      impl_->call(FetchRequest{afterSeq, maxMessages, waitMs, std::move(jobsLeftOut)}, timeout + milliseconds(waitMs)),
      "fetch");
}

Result<void> AgentClient::sendFetch(std::uint64_t afterSeq, std::uint32_t maxMessages) {
  return impl_->send(FetchRequest{afterSeq, maxMessages, 0, {}});
}

Result<FetchReply> AgentClient::receiveFetch(Clock::time_point deadline, milliseconds timeout) {
  return expect<FetchReply>(impl_->receive(deadline, timeout), "fetch");
}

Result<JobsReply> AgentClient::listJobs(milliseconds timeout, std::vector<JobAttempt> knownSpecs) {
  return expect<JobsReply>(impl_->call(ListJobsRequest{std::move(knownSpecs)}, timeout), "list jobs");
}

Result<void> AgentClient::sendListJobs(std::vector<JobAttempt> knownSpecs) {
  return impl_->send(ListJobsRequest{std::move(knownSpecs)});
}

Result<JobsReply> AgentClient::receiveListJobs(Clock::time_point deadline, milliseconds timeout) {
  return expect<JobsReply>(impl_->receive(deadline, timeout), "list jobs");
}

Result<LogsReply> AgentClient::logs(const std::string& jobId, std::uint32_t rank, std::uint32_t maxBytes,
                                    milliseconds timeout) {
  return expect<LogsReply>(impl_->call(LogsRequest{jobId, rank, maxBytes}, timeout), "logs");
}

Result<StacksReply> AgentClient::stacks(const std::string& jobId, std::optional<std::uint32_t> rank, milliseconds timeout) {
  return expect<StacksReply>(impl_->call(StacksRequest{jobId, rank}, timeout), "stacks");
}

Result<FrameReply> AgentClient::frame(const FrameRequest& request, milliseconds timeout) {
  return expect<FrameReply>(impl_->call(request, timeout), "frame");
}

}  // namespace lockstep
