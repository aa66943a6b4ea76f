#include "prometheus/page.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "lockstep/alerts/alert.h"
#include "lockstep/protocol/collectives.h"
#include "lockstep/protocol/names.h"

namespace lockstep::agent {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- the page ----

// Every family the page has, in the order it shows them. Names follow Prometheus' conventions:
// base units in the name (seconds, bytes, joules, hertz, ratio for 0..1), `_total` on counters
// (added when written: an OpenMetrics family's name has no `_total`).
struct FamilyDef {
  const char* name;
  const char* type;
  const char* unit;
  const char* help;
};
enum Family : std::size_t {
  kGpuUtilization, kGpuMemory, kGpuPower, kGpuEnergy, kGpuTemperature, kGpuClock,
  kRankSteps, kRankStepRate, kRankSamples, kRankStepTime, kRankDataTime, kRankComputeTime, kRankExposedTime,
  kRankOverhead, kRankBusBandwidth, kRankLoss, kRankMfu,
  kCollectiveTime, kCollectiveExposed, kCollectiveBytes, kCollectiveCount,
  kJobState, kJobWorldSize, kJobStalled, kAlertFiring, kRankStill, kJobSamples, kJobMfu, kJobModelFlops,
  kJobPeakFlops, kJobGpuSeconds, kJobCpuSeconds, kJobCost,
  kNetReceiveBytes, kNetTransmitBytes, kNetReceivePackets, kNetTransmitPackets, kNetReceiveErrors, kNetTransmitErrors,
  kNetReceiveDrops, kNetTransmitDrops, kNetSpeed,
  kFamilies,
};
constexpr std::array<FamilyDef, kFamilies> kDefs = {{
    {"lockstep_gpu_utilization_ratio", "gauge", "ratio", "GPU utilization (NVML), 0 to 1"},
    {"lockstep_gpu_memory_used_bytes", "gauge", "bytes", "GPU memory in use"},
    {"lockstep_gpu_power_watts", "gauge", "watts", "GPU power draw"},
    {"lockstep_gpu_energy_joules", "counter", "joules", "GPU energy since the driver loaded"},
    {"lockstep_gpu_temperature_celsius", "gauge", "celsius", "GPU temperature"},
    {"lockstep_gpu_sm_clock_hertz", "gauge", "hertz", "GPU SM clock"},
    {"lockstep_rank_steps", "counter", "", "The last step the rank completed"},
    {"lockstep_rank_steps_per_second", "gauge", "", "Steps per second over the last 10 s"},
    {"lockstep_rank_samples_per_second", "gauge", "", "Training samples per second over the last 10 s"},
    {"lockstep_rank_step_seconds", "gauge", "seconds", "Mean step time over the last 10 s"},
    {"lockstep_rank_data_seconds", "gauge", "seconds", "Mean time per step waiting for data"},
    {"lockstep_rank_compute_seconds", "gauge", "seconds", "Mean time per step computing"},
    {"lockstep_rank_exposed_communication_seconds", "gauge", "seconds",
     "Mean time per step waiting on collectives, not hidden behind compute"},
    {"lockstep_rank_communication_overhead_ratio", "gauge", "ratio", "Exposed communication over step time, 0 to 1"},
    {"lockstep_rank_bus_bandwidth_bytes_per_second", "gauge", "", "All-reduce bus bandwidth, as nccl-tests reports it"},
    {"lockstep_rank_loss", "gauge", "", "The rank's last reported loss"},
    {"lockstep_rank_model_flops_utilization", "gauge", "",
     "Model FLOPs utilization: the rank's model FLOP/s over its peak, 0 to 1, last 10 s (docs/kpis.md, MFU)"},
    {"lockstep_collective_seconds", "counter", "seconds",
     "Time in the rank's collectives of the kind, issue to completion, hidden or not"},
    {"lockstep_collective_exposed_seconds", "counter", "seconds",
     "Time the rank waited on its collectives of the kind, computing nothing"},
    {"lockstep_collective_bytes", "counter", "bytes",
     "Bytes of the rank's collectives of the kind, as nccl-tests sizes them"},
    {"lockstep_collectives", "counter", "", "Collectives of the kind the rank issued"},
    {"lockstep_job_state", "gauge", "", "1 for the state this node's part of the job is in"},
    {"lockstep_job_world_size", "gauge", "", "Ranks in the job"},
    {"lockstep_job_stalled", "gauge", "", "1 while this node sees the job stalled (docs/stalls.md), else 0"},
    {"lockstep_alert_firing", "gauge", "", "1 while the job's alert rule fires on its supervising agent (docs/alerts.md), else 0"},
    {"lockstep_rank_progress_age_seconds", "gauge", "seconds", "Since the rank's progress record last moved"},
    {"lockstep_job_samples_per_second", "gauge", "", "This node's ranks' samples per second"},
    {"lockstep_job_model_flops_utilization", "gauge", "",
     "Model FLOPs utilization of this node's ranks: their model FLOP/s over their peaks, 0 to 1, last 10 s"},
    {"lockstep_job_model_flops_per_second", "gauge", "", "This node's ranks' model FLOPs per second, last 10 s"},
    {"lockstep_job_peak_flops", "gauge", "", "The sum of the peaks (FLOP/s) this node's ranks' MFU is taken against"},
    {"lockstep_job_gpu_seconds", "counter", "seconds", "GPU time this node's part of the job has held"},
    {"lockstep_job_cpu_seconds", "counter", "seconds", "CPU time this node's ranks of the job used"},
    {"lockstep_job_cost", "counter", "", "Spent so far by this node's part of the job, in its currency"},
    {"lockstep_network_receive_bytes", "counter", "bytes", "Bytes the interface received"},
    {"lockstep_network_transmit_bytes", "counter", "bytes", "Bytes the interface sent"},
    {"lockstep_network_receive_packets", "counter", "", "Packets the interface received"},
    {"lockstep_network_transmit_packets", "counter", "", "Packets the interface sent"},
    {"lockstep_network_receive_errors", "counter", "", "Receive errors on the interface"},
    {"lockstep_network_transmit_errors", "counter", "", "Transmit errors on the interface"},
    {"lockstep_network_receive_drops", "counter", "", "Received packets the interface dropped"},
    {"lockstep_network_transmit_drops", "counter", "", "Packets the interface dropped instead of sending"},
    {"lockstep_network_speed_bytes_per_second", "gauge", "", "The link's speed, where the driver says it"},
}};

// The name a family's samples carry: a counter's with `_total`.
std::string seriesName(const FamilyDef& d) { return std::string(d.name) + (std::strcmp(d.type, "counter") == 0 ? "_total" : ""); }

std::string escaped(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

using Labels = std::vector<std::pair<const char*, std::string>>;

class Writer {
 public:
  void add(Family f, const Labels& labels, std::optional<double> value) {
    if (!value || !std::isfinite(*value)) return;  // unknown stays out of the page, never 0
    std::string& body = bodies_[f];
    body += seriesName(kDefs[f]) + '{';
    for (std::size_t i = 0; i < labels.size(); ++i) {
      body += (i ? "," : "") + std::string(labels[i].first) + "=\"" + escaped(labels[i].second) + '"';
    }
    char number[32];
    // Plain digits for what fits them ("3125000000", not "3.125e+09"), the shortest exact form.
    const double size = std::abs(*value);
    const auto format = size == 0 || (size >= 1e-6 && size < 1e15) ? std::chars_format::fixed : std::chars_format::general;
    const auto [end, ec] = std::to_chars(number, number + sizeof number, *value, format);
    body += "} " + std::string(number, ec == std::errc() ? end : number) + "\n";
  }
  std::string page() const {
    std::string out;
    for (std::size_t f = 0; f < kFamilies; ++f) {
      if (bodies_[f].empty()) continue;
      const FamilyDef& d = kDefs[f];
      out += std::string("# TYPE ") + d.name + " " + d.type + "\n";
      if (*d.unit) out += std::string("# UNIT ") + d.name + " " + d.unit + "\n";
      out += std::string("# HELP ") + d.name + " " + d.help + "\n" + bodies_[f];
    }
    return out + "# EOF\n";
  }

 private:
  std::array<std::string, kFamilies> bodies_;
};

std::optional<double> scaled(const kpi::Maybe& v, double by) { return v ? std::optional(*v * by) : std::nullopt; }
template <class T>
std::optional<double> scaled(const std::optional<T>& v, double by) {
  return v ? std::optional(static_cast<double>(*v) * by) : std::nullopt;
}

void writeGpu(Writer& w, const GpuSample& g) {
  Labels labels = {{"node", g.node}, {"gpu", std::to_string(g.gpuIndex)}};
  if (!g.jobId.empty()) labels.push_back({"job_id", g.jobId});
  w.add(kGpuUtilization, labels, scaled(g.utilizationPct, 0.01));
  w.add(kGpuMemory, labels, scaled(g.memoryUsedBytes, 1));
  w.add(kGpuPower, labels, scaled(g.powerMilliwatts, 1e-3));
  w.add(kGpuEnergy, labels, scaled(g.energyMillijoules, 1e-3));
  w.add(kGpuTemperature, labels, scaled(g.temperatureC, 1));
  w.add(kGpuClock, labels, scaled(g.smClockMhz, 1e6));
}

void writeNet(Writer& w, const NetSample& n) {
  const Labels labels = {{"node", n.node}, {"interface", n.interface}};
  w.add(kNetReceiveBytes, labels, static_cast<double>(n.rxBytes));
  w.add(kNetTransmitBytes, labels, static_cast<double>(n.txBytes));
  w.add(kNetReceivePackets, labels, static_cast<double>(n.rxPackets));
  w.add(kNetTransmitPackets, labels, static_cast<double>(n.txPackets));
  w.add(kNetReceiveErrors, labels, scaled(n.rxErrors, 1));
  w.add(kNetTransmitErrors, labels, scaled(n.txErrors, 1));
  w.add(kNetReceiveDrops, labels, scaled(n.rxDrops, 1));
  w.add(kNetTransmitDrops, labels, scaled(n.txDrops, 1));
  w.add(kNetSpeed, labels, scaled(n.linkBitsPerSecond, 1.0 / 8));
}

// Rates and the last window's times only while the job runs: an ended job did not keep its pace.
void writeRank(Writer& w, const std::string& jobId, const kpi::RankKpis& r, bool running) {
  const Labels labels = {{"node", r.node}, {"job_id", jobId}, {"rank", std::to_string(r.rank)}};
  w.add(kRankSteps, labels, static_cast<double>(r.step));
  w.add(kRankLoss, labels, r.loss);
  if (!running) return;
  w.add(kRankStepRate, labels, r.meanStepUs && *r.meanStepUs > 0 ? std::optional(1e6 / *r.meanStepUs) : std::nullopt);
  w.add(kRankSamples, labels, r.samplesPerSecond);
  w.add(kRankStepTime, labels, scaled(r.meanStepUs, 1e-6));
  w.add(kRankDataTime, labels, scaled(r.meanDataUs, 1e-6));
  w.add(kRankComputeTime, labels, scaled(r.meanComputeUs, 1e-6));
  w.add(kRankExposedTime, labels, scaled(r.meanExposedUs, 1e-6));
  w.add(kRankOverhead, labels, r.commOverhead);
  w.add(kRankBusBandwidth, labels, r.busBandwidth);
  w.add(kRankMfu, labels, r.mfu);
}

// Each rank's collectives, by kind, summed over the step reports seen: counters, kept once the
// job ended. At most one series per rank and kind of lockstep.proto's CollectiveKind.
void writeCollectives(Writer& w, const std::string& node, const std::string& jobId, const JobFigures::Counts& counts) {
  for (const auto& [key, c] : counts) {
    const Labels labels = {{"node", node},
                           {"job_id", jobId},
                           {"rank", std::to_string(key.first)},
                           {"kind", std::string(nameOf(key.second))}};
    w.add(kCollectiveTime, labels, static_cast<double>(c.timeUs) * 1e-6);
    w.add(kCollectiveExposed, labels, static_cast<double>(c.exposedUs) * 1e-6);
    w.add(kCollectiveBytes, labels, static_cast<double>(c.bytes));
    w.add(kCollectiveCount, labels, static_cast<double>(c.count));
  }
}

void writeJob(Writer& w, const std::string& node, const JobStatus& status, const kpi::JobKpis* k) {
  const Labels labels = {{"node", node}, {"job_id", status.spec.jobId}};
  Labels state = labels;
  state.push_back({"state", std::string(jobStateName(status.state))});
  w.add(kJobState, state, 1.0);
  w.add(kJobWorldSize, labels, static_cast<double>(status.spec.worldSize));
  if (!jobStateEnded(status.state)) {
    w.add(kJobStalled, labels, status.stall ? 1.0 : 0.0);
    for (const auto& p : status.progress) {
      if (!p.recorded) continue;
      Labels rank = {{"node", node}, {"job_id", status.spec.jobId}, {"rank", std::to_string(p.rank)}};
      w.add(kRankStill, rank, static_cast<double>(p.stillMs) / 1000.0);
    }
  }
  if (k == nullptr) return;
  if (!jobStateEnded(status.state)) {
    w.add(kJobSamples, labels, k->samplesPerSecond);
    w.add(kJobMfu, labels, k->mfu);
    w.add(kJobModelFlops, labels, k->modelFlopsPerSecond);
    w.add(kJobPeakFlops, labels, k->peakFlops);
  }
  w.add(kJobGpuSeconds, labels, scaled(k->gpuHours, 3600));
  w.add(kJobCpuSeconds, labels, scaled(k->coreHours, 3600));
  Labels cost = labels;
  cost.push_back({"currency", status.spec.prices.currency});
  w.add(kJobCost, cost, k->costSoFar);
}

// This node's part of the job: its ranks, and its share of the allocated GPUs. Each node's page
// counts its own, so that summing the nodes' pages gives the job's figures.
JobSpec nodePart(JobSpec spec, const std::string& node) {
  std::set<std::string> nodes;
  for (const auto& r : spec.ranks) nodes.insert(r.node);
  if (!nodes.empty()) spec.allocatedGpus /= static_cast<std::uint32_t>(nodes.size());
  std::erase_if(spec.ranks, [&](const RankPlacement& r) { return r.node != node; });
  return spec;
}

}  // namespace

void JobFigures::onEvent(const std::string& node, const JobEvent& e) {
  tracker_.onEvent(node, e);
  if (e.jobId != tracker_.spec().jobId) return;
  if (auto alert = alerts::alertOf(e); alert && !alerts::isInstant(alert->kpi)) {
    alerts_[alert->rule] = alert->state == alerts::State::kFiring;
  }
}

void JobFigures::onStep(const std::string& node, const StepReport& report) {
  tracker_.onStep(node, report);
  if (report.jobId != tracker_.spec().jobId) return;
  for (const auto& c : collectivesOf(report)) {
    CollectiveTimes& sum = counts_[{report.rank, c.kind}];
    sum.kind = c.kind;
    sum.count += c.count;
    sum.timeUs += std::max<std::int64_t>(0, c.timeUs);
    sum.exposedUs += std::max<std::int64_t>(0, c.exposedUs);
    sum.bytes += c.bytes;
  }
}

std::vector<std::string> MetricsPage::seriesNames() {
  std::vector<std::string> out;
  for (const auto& d : kDefs) out.push_back(seriesName(d));
  return out;
}

MetricsPage::MetricsPage(std::string node)
    : node_(std::move(node)),
      reader_([this](const std::string& jobId) { return trackerOf(jobId); }, kpi::kNewestOnly) {}

RecordSink* MetricsPage::trackerOf(const std::string& jobId) {
  auto it = trackers_.find(jobId);
  if (it != trackers_.end()) return &it->second;
  for (const auto& job : (*jobs_)()) {
    if (job.spec.jobId == jobId) return &trackers_.try_emplace(jobId, nodePart(job.spec, node_)).first->second;
  }
  return nullptr;
}

void MetricsPage::observe(const Payload& payload, const std::function<std::vector<JobStatus>()>& jobs) {
  jobs_ = &jobs;
  reader_.read(node_, payload);
  jobs_ = nullptr;
}

std::string MetricsPage::render(std::int64_t nowUnixUs, const std::vector<JobStatus>& jobs) {
  std::erase_if(trackers_, [&](const auto& entry) {
    return std::none_of(jobs.begin(), jobs.end(), [&](const JobStatus& j) { return j.spec.jobId == entry.first; });
  });
  Writer w;
  if (const kpi::NodeTracker* node = reader_.node(node_)) {
    for (const auto& gpu : node->snapshot().gpus) writeGpu(w, gpu);
    for (const auto& net : node->newestSamples()) writeNet(w, net);
  }
  for (const auto& job : jobs) {
    const auto it = trackers_.find(job.spec.jobId);
    if (it == trackers_.end()) {
      writeJob(w, node_, job, nullptr);
      continue;
    }
    const std::int64_t at = jobStateEnded(job.state) && job.endedUnixUs > 0 ? job.endedUnixUs : nowUnixUs;
    const kpi::JobKpis k = it->second.tracker().snapshot(at);
    for (const auto& rank : k.ranks) writeRank(w, job.spec.jobId, rank, !jobStateEnded(job.state));
    writeCollectives(w, node_, job.spec.jobId, it->second.counts());
    for (const auto& [rule, firing] : it->second.alerts()) {
      w.add(kAlertFiring, {{"node", node_}, {"job_id", job.spec.jobId}, {"rule", rule}}, firing ? 1.0 : 0.0);
    }
    writeJob(w, node_, job, &k);
  }
  return w.page();
}

// ---- the server ----

namespace {

constexpr std::size_t kMaxRequestBytes = 8192;
constexpr milliseconds kConnectionDeadline{2000};
constexpr std::size_t kMaxConnections = 64;  // beyond these, new ones wait in the listen backlog
constexpr const char* kContentType = "application/openmetrics-text; version=1.0.0; charset=utf-8";

std::string response(const char* status, const char* type, const std::string& body, bool withBody) {
  return std::string("HTTP/1.1 ") + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + (withBody ? body : "");
}

bool isLoopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == 127;
  }
  return a.ss_family == AF_INET6 && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr);
}

}  // namespace

Result<std::pair<std::string, std::uint16_t>> parseMetricsListen(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return invalidArgument("--metrics-listen " + text + ": " + why +
                           " (give HOST:PORT, e.g. 127.0.0.1:9464, or 0.0.0.0:9464 to let other hosts scrape it)");
  };
  std::string host = "127.0.0.1", port = text;
  if (const auto colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host.empty()) host = "127.0.0.1";
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535) {
    return bad("'" + port + "' is not a port from 0 to 65535");
  }
  return std::pair(host, static_cast<std::uint16_t>(value));
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& hostPort) {
  LOCKSTEP_ASSIGN_OR_RETURN(const auto where, parseMetricsListen(hostPort));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(where.first.c_str(), std::to_string(where.second).c_str(), &hints, &found); rc != 0) {
    return invalidArgument("--metrics-listen " + hostPort + ": " + ::gai_strerror(rc));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 16) != 0) {
      why = std::strerror(errno);
      ::close(fd);
      continue;
    }
    ::freeaddrinfo(found);
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
    const auto port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6&>(bound).sin6_port
                                                        : reinterpret_cast<sockaddr_in&>(bound).sin_port);
    const bool v6 = where.first.find(':') != std::string::npos;
    const std::string address = (v6 ? "[" + where.first + "]" : where.first) + ":" + std::to_string(port);
    return std::unique_ptr<MetricsServer>(new MetricsServer(fd, address, isLoopback(bound)));
  }
  ::freeaddrinfo(found);
  return Error{ErrorCode::kUnavailable, "cannot serve metrics on " + hostPort + ": " + why +
                                            (why == std::strerror(EADDRINUSE) ? " (pick another port)" : "")};
}

MetricsServer::MetricsServer(int fd, std::string address, bool loopback)
    : fd_(fd), address_(std::move(address)), loopback_(loopback), page_(std::make_shared<const std::string>("# EOF\n")) {
  thread_ = std::thread([this] { run(); });
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  thread_.join();
  ::close(fd_);
}

void MetricsServer::publish(std::string page) {
  auto next = std::make_shared<const std::string>(std::move(page));
  std::lock_guard lock(mutex_);
  page_ = std::move(next);
}

// One thread serves every connection, none blocking: each gets kConnectionDeadline to send its
// request (at most kMaxRequestBytes) and take the answer, so a slow or silent client costs a
// slot for two seconds, never the other scrapes, and the agent's event loop nothing.
struct MetricsServer::Connection {
  int fd;
  Clock::time_point deadline;
  std::string in, out;
  std::size_t sent = 0;
};

void MetricsServer::run() {
  std::vector<Connection> connections;
  auto acceptAfter = Clock::now();
  while (!stop_.load()) {
    const auto now = Clock::now();
    std::erase_if(connections, [&](Connection& c) {
      const bool over = now >= c.deadline || c.fd < 0;
      if (over && c.fd >= 0) ::close(c.fd);
      return over;
    });
    std::vector<pollfd> fds;
    const bool accepting = connections.size() < kMaxConnections && now >= acceptAfter;
    fds.push_back({fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    auto wait = milliseconds(200);
    for (const auto& c : connections) {
      fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      wait = std::min(wait, std::chrono::duration_cast<milliseconds>(c.deadline - now) + milliseconds(1));
    }
    if (::poll(fds.data(), fds.size(), static_cast<int>(std::max<long>(wait.count(), 1))) <= 0) continue;
    for (std::size_t i = 0; i < connections.size(); ++i) {
      if (fds[i + 1].revents != 0) step(connections[i]);
    }
    if (fds[0].revents & POLLIN) {
      for (std::size_t n = connections.size(); n < kMaxConnections; ++n) {
        const int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          connections.push_back({fd, Clock::now() + kConnectionDeadline, {}, {}});
          continue;
        }
        // Out of descriptors or memory: the backlog waits a little rather than spin.
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
          acceptAfter = Clock::now() + milliseconds(100);
        }
        break;
      }
    }
  }
  for (auto& c : connections) ::close(c.fd);
}

// Reads what the connection sent, answers once the request's head is in, writes what it can.
// A finished, failed or oversized exchange is closed (fd = -1).
void MetricsServer::step(Connection& c) {
  const auto finish = [&] {
    ::close(c.fd);
    c.fd = -1;
  };
  if (c.out.empty()) {
    char buffer[2048];
    const ssize_t n = ::recv(c.fd, buffer, std::min(sizeof buffer, kMaxRequestBytes - c.in.size()), 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) return finish();
    c.in.append(buffer, static_cast<std::size_t>(n));
    if (c.in.find("\r\n\r\n") == std::string::npos) {
      if (c.in.size() >= kMaxRequestBytes) finish();
      return;
    }
    c.out = answer(c.in);
  }
  const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) return finish();
  c.sent += static_cast<std::size_t>(n);
  if (c.sent == c.out.size()) finish();
}

std::string MetricsServer::answer(const std::string& request) {
  const std::string line = request.substr(0, request.find("\r\n"));
  const auto space = line.find(' ');
  const std::string method = line.substr(0, space);
  std::string target = space == std::string::npos ? "" : line.substr(space + 1, line.find(' ', space + 1) - space - 1);
  target = target.substr(0, target.find('?'));
  const char* text = "text/plain; charset=utf-8";
  if (method != "GET" && method != "HEAD") {
    return response("405 Method Not Allowed", text, "lockstep-agent serves GET /metrics only\n", true);
  }
  if (target != "/metrics") return response("404 Not Found", text, "lockstep-agent serves its metrics at /metrics\n", true);
  std::shared_ptr<const std::string> page;
  {
    std::lock_guard lock(mutex_);
    page = page_;
  }
  return response("200 OK", kContentType, *page, method == "GET");
}

}  // namespace lockstep::agent
