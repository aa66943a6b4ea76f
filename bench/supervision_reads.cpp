// How far apart a supervising agent's frames come for a job on many nodes (issue 46 §1). The real
// supervision (agent/src/jobs/supervision.h) follows a job whose N nodes are stand-in agents in
// this process: CURVE ROUTER sockets on loopback, served by one thread, that answer the hello, the
// job's status and the job's stream (bench/synthetic_stream.h: 8 ranks a node at S steps/s) after
// a set turnaround, which stands for the network's round trip and each agent's own work. A client
// asks for the job's frame every 50 ms; printed: the period between the frames' moments (one read
// of the streams: every 100 ms, or as often as a read round allows) and how old each frame was
// when first seen.
//
// With --silent K, the last K nodes stop answering 5 s in (a rack lost at once): printed too, the
// polls that followed, which wait for the silent nodes until they are lost (three polls).
//
//   build/bin/lockstep-bench-supervision [--nodes N] [--turnaround-us US] [--steps-per-second S] [--seconds T]
//                                        [--silent K]

#include <dirent.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "alerts/alert_desk.h"
#include "base/log.h"
#include "jobs/supervision.h"
#include "lockstep/common/clock.h"
#include "lockstep/common/files.h"
#include "lockstep/net/zmq_util.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/job_list.h"
#include "synthetic_stream.h"

using namespace lockstep;
using Clock = std::chrono::steady_clock;

namespace {

struct Options {
  int nodes = 2048;
  int turnaroundUs = 200;
  double stepsPerSecond = 10;
  int seconds = 20;
  int silent = 0;
};

// N stand-in agents on one thread. A request is answered when its turnaround has passed, with what
// the node holds then; the stream grows a tick (100 ms) at a time.
class StandIns {
 public:
  StandIns(const Options& o, const CurveKeyPair& keys)
      : o_(o), stream_(o.nodes, 8, o.stepsPerSecond), context_(contextFor(o.nodes)), zap_(context_) {
    spec_ = stream_.job();
    spec_.maxRestarts = 0;
    spec_.agents.clear();  // the stand-ins, below
    buffers_.resize(static_cast<std::size_t>(o.nodes));
    lastSeq_.resize(static_cast<std::size_t>(o.nodes), 0);
    for (int n = 0; n < o.nodes; ++n) {
      sockets_.emplace_back(context_, zmq::socket_type::router);
      auto& s = sockets_.back();
      if (auto made = makeCurveServer(s, keys); !made) throw std::runtime_error(made.error().message);
      s.set(zmq::sockopt::linger, 0);
      s.bind("tcp://127.0.0.1:*");
      const std::string endpoint = s.get(zmq::sockopt::last_endpoint);
      spec_.agents.push_back({bench::nodeName(n), endpoint.substr(endpoint.find("//") + 2), keys.publicKey});
    }
  }
  const JobSpec& spec() const { return spec_; }
  void silence() { silent_ = true; }  // the last o.silent nodes stop answering

  // epoll over the sockets' ZMQ_FDs, which signal edges: each ready socket is drained, and one that
  // was written to is drained again (a send can take the edge). A sweep every 50 ms is the net.
  void run(const std::atomic<bool>& stop) {
    const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
    for (std::size_t i = 0; i <= sockets_.size(); ++i) {
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.u32 = static_cast<std::uint32_t>(i);
      const int fd = i < sockets_.size() ? sockets_[i].get(zmq::sockopt::fd) : zap_.socket().get(zmq::sockopt::fd);
      ::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &e);
    }
    auto nextTick = Clock::now(), nextSweep = Clock::now();
    std::vector<epoll_event> ready(256);
    for (std::uint64_t tick = 0; !stop;) {
      if (o_.stepsPerSecond > 0 && Clock::now() >= nextTick) produce(tick++), nextTick += std::chrono::milliseconds(100);
      answerDue();
      if (Clock::now() >= nextSweep) {
        for (std::size_t i = 0; i < sockets_.size(); ++i) take(i);
        nextSweep = Clock::now() + std::chrono::milliseconds(50);
      }
      const auto next = std::min({nextTick, nextDue(), nextSweep});
      const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
      const int n = ::epoll_wait(epoll, ready.data(), static_cast<int>(ready.size()), static_cast<int>(std::clamp<long>(wait, 0, 20)));
      for (int k = 0; k < n; ++k) {
        const std::size_t i = ready[static_cast<std::size_t>(k)].data.u32;
        if (i == sockets_.size()) {
          while (zap_.socket().get(zmq::sockopt::events) & ZMQ_POLLIN) zap_.handleOne([](const std::string&) { return true; });
        } else {
          take(i);
        }
      }
    }
    ::close(epoll);
  }

 private:
  static zmq::context_t contextFor(int nodes) {
    zmq::context_t c;
    c.set(zmq::ctxopt::max_sockets, nodes + 16);  // before the first socket
    return c;
  }

  struct Due {
    Clock::time_point at;
    std::size_t node;
    zmq::message_t who;
    Request request;
  };

  // One tick of every node's ranks: a step each at 10 steps/s, and a sample round every other tick.
  void produce(std::uint64_t tick) {
    const double steps = o_.stepsPerSecond / 10.0;
    const int taken = static_cast<int>(steps * static_cast<double>(tick + 1)) - static_cast<int>(steps * static_cast<double>(tick));
    stream_.startTick(0.1);
    for (int n = 0; n < o_.nodes; ++n) {
      auto batch = stream_.batchOf(n, taken, tick % 2 == 0 ? 1 : 0, unixMicrosNow());
      auto& buffer = buffers_[static_cast<std::size_t>(n)];
      for (auto& m : batch) buffer.push_back(std::move(m));
      if (!buffer.empty()) lastSeq_[static_cast<std::size_t>(n)] = buffer.back().seq;
      while (buffer.size() > 20'000) buffer.pop_front();
    }
    stream_.endTick(taken);
  }

  void take(std::size_t node) {
    auto& s = sockets_[node];
    while (s.get(zmq::sockopt::events) & ZMQ_POLLIN) {
      auto frames = receiveMultipart(s, 2);
      if (!frames || frames->size() != 2) continue;
      auto request = decodeRequest((*frames)[1].to_string_view());
      if (!request || (silent_ && node >= static_cast<std::size_t>(o_.nodes - o_.silent))) continue;
      due_.push_back({Clock::now() + std::chrono::microseconds(o_.turnaroundUs), node, std::move((*frames)[0]), std::move(*request)});
    }
  }

  Clock::time_point nextDue() const { return due_.empty() ? Clock::now() + std::chrono::hours(1) : due_.front().at; }

  void answerDue() {
    while (!due_.empty() && due_.front().at <= Clock::now()) {
      Due d = std::move(due_.front());
      due_.pop_front();
      const std::string bytes = encode(Reply{d.request.requestId, answer(d.node, d.request)});
      auto& s = sockets_[d.node];
      s.send(d.who, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      s.send(zmq::buffer(bytes), zmq::send_flags::dontwait);
      take(d.node);
    }
  }

  decltype(Reply::body) answer(std::size_t n, const Request& request) {
    const int node = static_cast<int>(n);
    if (std::holds_alternative<HelloRequest>(request.body)) {
      NodeHello h;
      h.agentVersion = "stand-in";
      h.nodeName = bench::nodeName(node);
      h.host = "127.0.0.1";
      h.instanceId = 1;
      h.timeUnixUs = unixMicrosNow();
      return h;
    }
    if (std::holds_alternative<ListJobsRequest>(request.body)) {
      JobStatus st;
      st.spec.jobId = spec_.jobId;
      omitSpec(st);  // the supervision names the spec it holds: the agent's rule, kept short here
      st.state = JobState::kRunning;
      for (std::uint32_t g = 0; g < 8; ++g) {
        const auto rank = static_cast<std::uint32_t>(node) * 8 + g;
        st.ranks.push_back({rank, g, g, 1000 + rank, JobState::kRunning, std::nullopt, std::nullopt, false});
      }
      return JobsReply{{std::move(st)}};
    }
    if (const auto* fetch = std::get_if<FetchRequest>(&request.body)) {
      FetchReply reply{1, 1, lastSeq_[n], {}, 1};
      auto& buffer = buffers_[n];
      while (!buffer.empty() && buffer.front().seq <= fetch->afterSeq) buffer.pop_front();
      for (const auto& m : buffer) {
        if (reply.messages.size() >= fetch->maxMessages) break;
        reply.messages.push_back(m);
      }
      return reply;
    }
    return ErrorReply{ErrorCode::kInvalidArgument, "the stand-in answers hello, list jobs and fetch only"};
  }

  Options o_;
  bench::SyntheticStream stream_;
  zmq::context_t context_;
  ZapHandler zap_;
  JobSpec spec_;
  std::deque<zmq::socket_t> sockets_;
  std::vector<std::deque<StreamMessage>> buffers_;
  std::vector<std::uint64_t> lastSeq_;
  std::deque<Due> due_;  // in the order they fall due: every turnaround is the same
  std::atomic<bool> silent_{false};
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--nodes") o.nodes = std::atoi(argv[i + 1]);
    else if (flag == "--turnaround-us") o.turnaroundUs = std::atoi(argv[i + 1]);
    else if (flag == "--steps-per-second") o.stepsPerSecond = std::atof(argv[i + 1]);
    else if (flag == "--seconds") o.seconds = std::atoi(argv[i + 1]);
    else if (flag == "--silent") o.silent = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      std::exit(2);
    }
  }
  if (o.nodes < 1 || o.turnaroundUs < 0 || o.stepsPerSecond < 0 || o.seconds < 1 || o.silent < 0 || o.silent >= o.nodes) {
    std::fprintf(stderr, "--nodes and --seconds must be at least 1, the others not negative, --silent less than --nodes\n");
    std::exit(2);
  }
  return o;
}

// This process's open files and threads: the stand-ins' and the supervision's together.
std::pair<std::size_t, std::size_t> filesAndThreads() {
  std::size_t files = 0, threads = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++files;
    ::closedir(d);
  }
  std::FILE* f = std::fopen("/proc/self/status", "r");
  char line[256];
  while (f && std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "Threads:", 8) == 0) threads = std::strtoul(line + 8, nullptr, 10);
  }
  if (f) std::fclose(f);
  return {files, threads};
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  raiseOpenFilesLimit();  // each stand-in and each of the supervision's connections holds a few
  auto keys = generateKeyPair();
  if (!keys) return std::fprintf(stderr, "%s\n", keys.error().message.c_str()), 1;

  StandIns standIns(o, *keys);
  std::atomic<bool> stop{false};
  std::thread serving([&] { standIns.run(stop); });

  agent::Log log("/dev/null");
  agent::AlertDesk desk({}, log);
  std::vector<double> periods, ages, silentPeriods;  // the polls before and after the silence
  std::pair<std::size_t, std::size_t> held;
  {
    agent::Supervisions supervisions(bench::nodeName(0), *keys, desk, log);
    supervisions.supervise(standIns.spec());
    const auto start = Clock::now(), end = start + std::chrono::seconds(o.seconds);
    std::int64_t last = 0, first = 0, silentSince = 0;
    while (Clock::now() < end) {
      if (o.silent && !silentSince && Clock::now() - start >= std::chrono::seconds(5)) {
        standIns.silence();
        silentSince = unixMicrosNow();
      }
      auto frame = supervisions.frameOf({standIns.spec().jobId, 0, 256, 0});
      if (frame && frame->timeUnixUs != last) {
        if (!first) first = frame->timeUnixUs;
        const double period = static_cast<double>(frame->timeUnixUs - last) / 1000.0;
        if (last && last != first) (silentSince && frame->timeUnixUs > silentSince ? silentPeriods : periods).push_back(period);
        if (last) ages.push_back(static_cast<double>(unixMicrosNow() - frame->timeUnixUs) / 1000.0);
        last = frame->timeUnixUs;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    held = filesAndThreads();
  }
  stop = true;
  serving.join();
  std::printf("nodes %d (GPUs %d), turnaround %d us, %.1f steps/s, %d s\n", o.nodes, o.nodes * 8, o.turnaroundUs,
              o.stepsPerSecond, o.seconds);
  std::printf("frames seen %zu; frame period ms p50 %.0f p99 %.0f; frame age when seen ms p50 %.0f p99 %.0f\n",
              periods.size() + 1, percentile(periods, 0.5), percentile(periods, 0.99), percentile(ages, 0.5),
              percentile(ages, 0.99));
  if (o.silent) {
    std::printf("after %d nodes fell silent, polls took ms:", o.silent);
    for (double p : silentPeriods) std::printf(" %.0f", p);
    std::printf("\n");
  }
  std::printf("open files %zu, threads %zu (this process: the stand-ins' and the supervision's)\n", held.first, held.second);
  return periods.empty() ? 1 : 0;
}
