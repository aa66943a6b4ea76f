// The agent's event loop: it owns what it polls (the client socket, the rank inbox, the sensors'
// eventfd, the path checks', the evidence taker's, the ranks' pidfds) and hands each readiness to
// the component that owns it. It reads as its phases: init() brings the node's parts up, loop()
// polls, serves and watches, and leaves when told to (or, under Slurm, once its jobs ended).

#include "loop/agent.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <vector>
#include <zmq.hpp>

#include "access/access_policy.h"
#include "alerts/alert_desk.h"
#include "base/host.h"
#include "access/supervisor_keys.h"
#include "jobs/job_cgroup.h"
#include "jobs/jobs.h"
#include "jobs/rank_launch.h"
#include "jobs/starts.h"
#include "jobs/supervision.h"
#include "lockstep/common/files.h"
#include "lockstep/common/identity.h"
#include "loop/client_port.h"
#include "loop/lifecycle.h"
#include "loop/requests.h"
#include "prometheus/publisher.h"
#include "sensors/cpu_peak.h"
#include "sensors/node_sensors.h"
#include "sensors/nvml.h"
#include "stalls/stalls.h"
#include "stream/fetches.h"
#include "stream/node_stream.h"
#include "stream/peaks.h"
#include "stream/rank_inbox.h"

namespace lockstep::agent {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kIdlePoll{200};

std::string version() { return LOCKSTEP_VERSION; }

}  // namespace

class Agent::Impl {
 public:
  Impl(const AgentConfig& config, Log& log) : config_(config), log_(log), context_(1) {}

  Result<void> init();
  Result<void> loop(const std::atomic<int>& stop);
  const CurveKeyPair& keys() const { return keys_; }

 private:
  // What the loop polls, in this order; the ranks' pidfds follow.
  enum Polled : std::size_t {
    kRequests,
    kHandshakes,
    kConnections,
    kReports,
    kSamples,
    kChecks,
    kEvidence,
    kCpuPeak,
    kRankExits
  };

  Result<void> checkStateDir() const;
  Result<JobManagerOptions> jobOptions(const std::string& reportEndpoint) const;
  Result<void> startJobs(const std::string& reportEndpoint);
  Result<AlertDefaults> alertDefaults() const;
  Result<void> listen(const std::string& reportEndpoint);
  void makeComponents();
  bool serving(const std::atomic<int>& stop);
  // Whether the stream holds records no client has fetched yet.
  bool unfetched() const { return fetches_->fetchedUpTo() < stream_->lastSeq(); }
  std::vector<zmq::pollitem_t> pollItems();
  milliseconds pollTimeout() const;
  void serve(const std::vector<zmq::pollitem_t>& items, const std::atomic<int>& stop);
  void onSamples();
  void trackRanks();
  NodeHello hello() const;
  void logFences() const;
  bool authorized(const std::string& key);
  void revoke(const std::vector<std::string>& keys);

  AgentConfig config_;
  Log& log_;
  CurveKeyPair keys_;
  std::uint64_t instanceId_ = 0;
  std::unique_ptr<Nvml> nvml_;
  std::string gpuStatus_;
  NodeCgroups cgroups_;                 // what fences jobs here (job_cgroup.h)
  std::vector<std::string> fencesOff_;  // which are off, and why
  zmq::context_t context_;
  std::unique_ptr<ClientPort> clients_;
  std::unique_ptr<MetricsPublisher> metrics_;  // sees what the stream takes: made before it
  std::unique_ptr<NodeStream> stream_;
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<AccessPolicy> access_;
  std::unique_ptr<Stalls> stalls_;
  std::unique_ptr<CpuPeakMeter> cpuPeak_;  // one core's sgemm peak here (sensors/cpu_peak.h)
  std::unique_ptr<Peaks> peaks_;          // what each rank's MFU is taken against
  std::unique_ptr<RankInbox> inbox_;
  std::unique_ptr<NodeSensors> sensors_;
  std::unique_ptr<Starts> starts_;
  std::unique_ptr<Fetches> fetches_;
  std::unique_ptr<AlertDesk> alerts_;  // before the supervisions, which publish to it
  std::unique_ptr<Lifecycle> lifecycle_;
  std::unique_ptr<Requests> requests_;
  std::unique_ptr<Supervisions> supervisions_;  // last: its threads end before the rest goes
};

Result<void> Agent::Impl::init() {
  LOCKSTEP_TRY(checkStateDir());
  const Identity agent = currentIdentity();
  if (agent.uid == 0) log_.info("running as root: each key's jobs run as the Unix user its line names (user=NAME)");
  bool created = false;
  LOCKSTEP_ASSIGN_OR_RETURN(keys_, loadOrCreateKeyPair(config_.stateDir, "agent", &created));
  if (created) log_.info("created this agent's key pair; public key " + keys_.publicKey);
  std::random_device random;
  instanceId_ = (std::uint64_t{random()} << 32) ^ random();

  nvml_ = Nvml::load(config_.nvmlLibrary, &gpuStatus_);
  if (!gpuStatus_.empty()) log_.info(gpuStatus_);
  if (nvml_) log_.info("NVML: " + std::to_string(nvml_->gpus().size()) + " GPU(s)");
  cgroups_ = probeCgroups();
  // With job-fences = no, jobs get their cgroup2 cgroup only, and the rest stays found: a job
  // adopted from a run with fences still has its cgroups removed.
  fencesOff_ = config_.jobFences ? cgroups_.off : std::vector<std::string>{"all: job-fences = no"};
  logFences();

  metrics_ = std::make_unique<MetricsPublisher>(
      MetricsSettings{config_.name, config_.metricsListen, config_.metricsTargets, config_.slurmJob}, log_);
  stream_ = std::make_unique<NodeStream>(config_.stateDir, config_.name, config_.replayMessages, log_);
  stream_->setTap(
      [this](const StreamPayload& payload) { metrics_->observe(payload, [this] { return jobs_->list(); }); });
  LOCKSTEP_ASSIGN_OR_RETURN(const std::string reportEndpoint, RankInbox::endpointIn(config_.stateDir));
  LOCKSTEP_TRY(startJobs(reportEndpoint));
  cpuPeak_ = std::make_unique<CpuPeakMeter>(
      CpuPeakSettings{config_.name, config_.stateDir, config_.trainer, config_.cpuPeakGflops, config_.cpuPeakOff}, log_);
  access_ = std::make_unique<AccessPolicy>(
      config_.authorizedKeysPath(), config_.name, agent,
      JobLookup{[this] { return jobs_->list(); }, [this](const std::string& id) { return jobs_->ownerOf(id); }}, log_);
  LOCKSTEP_TRY(listen(reportEndpoint));
  makeComponents();
  log_.info("listening on " + config_.listen + " as node " + config_.name + "; public key " + keys_.publicKey +
            "; authorized keys in " + config_.authorizedKeysPath());
  LOCKSTEP_TRY(metrics_->serve());
  return lifecycle_->announce(config_.listen, keys_.publicKey);
}

Result<void> Agent::Impl::checkStateDir() const {
  LOCKSTEP_TRY(makeDirectories(config_.stateDir, 0700));
  // StrictModes, as sshd: a state directory others may write would let them replace our keys.
  if (struct stat st{}; ::stat(config_.stateDir.c_str(), &st) == 0) {
    if (auto why = strictModesProblem(config_.stateDir, st.st_mode, st.st_uid); !why.empty()) {
      return Error{ErrorCode::kPermissionDenied, "the state directory " + why};
    }
  }
  return {};
}

Result<JobManagerOptions> Agent::Impl::jobOptions(const std::string& reportEndpoint) const {
  JobManagerOptions options;
  options.node = {config_.name, cpuCores(), nvml_ ? static_cast<std::uint32_t>(nvml_->gpus().size()) : 0,
                  memoryTotalBytes()};
  options.stateDir = config_.stateDir;
  options.trainerPath = config_.trainer;
  options.listenHost = config_.listenHost();
  options.reportEndpoint = reportEndpoint;
  options.pythonPath = findPythonPackage();
  options.sandbox = config_.jobSandbox;
  options.privateTmp = config_.privateTmp();
  options.cgroups = cgroups_;
  options.memPerRank = config_.memPerRank;
  options.cpuOvercommit = config_.cpuOvercommit;
  options.fences = config_.jobFences;
  if (const std::string shared = privateToJobs(config_.stateDir); config_.privateTmp() && !shared.empty()) {
    return invalidArgument(
        "--state-dir " + config_.stateDir + " is under " + shared +
        ", which each job gets a private one of: choose another state directory, or --job-private-tmp no");
  }
  if (!config_.jobSandbox) log_.info("job-sandbox = no: every job's processes can read this agent's secret key");
  if (options.pythonPath.empty()) {
    log_.info(
        "the lockstep Python package is not beside this agent: command jobs' ranks cannot `import lockstep` "
        "unless it is on their own PYTHONPATH");
  }
  options.defaultStopGrace = milliseconds(config_.stopGraceMs);
  options.keepFinishedJobs = config_.keepJobs;
  // A job whose supervision goes on here stays listed (clients read its verdict from the listing).
  options.stillNeeded = [this](const std::string& id) { return supervisions_ && supervisions_->goesOn(id); };
  return options;
}

// The job table restored, and the jobs this agent supervises and still runs a part of supervised
// again where they stand.
Result<void> Agent::Impl::startJobs(const std::string& reportEndpoint) {
  LOCKSTEP_ASSIGN_OR_RETURN(JobManagerOptions options, jobOptions(reportEndpoint));
  jobs_ = std::make_unique<JobManager>(options, [this](JobEvent e) {
    log_.info("job " + e.jobId + ": " + e.message);
    stream_->append(std::move(e));
  });
  if (auto restored = jobs_->restore(); !restored) return restored.error();
  LOCKSTEP_ASSIGN_OR_RETURN(AlertDefaults defaults, alertDefaults());
  alerts::Webhooks::Options webhooks;
  webhooks.timeout = milliseconds(config_.webhookTimeoutMs);
  webhooks.maxAttempts = static_cast<int>(config_.webhookAttempts);
  alerts_ = std::make_unique<AlertDesk>(std::move(defaults), log_, webhooks);
  supervisions_ = std::make_unique<Supervisions>(config_.name, keys_, *alerts_, log_,
                                                  [this](const std::string& id) { return jobs_->holds(id); });
  for (const auto& job : jobs_->list()) {
    if (!jobStateEnded(job.state)) supervisions_->supervise(job.spec);
  }
  return {};
}

// Every job's rules and webhooks from the configuration, checked before the agent serves.
Result<AlertDefaults> Agent::Impl::alertDefaults() const {
  AlertDefaults defaults;
  if (!config_.alertRules.empty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(defaults.rules, readAlertRulesFile(config_.alertRules));
    log_.info("every job's alert rules: " + std::to_string(defaults.rules.size()) + " from " + config_.alertRules);
  }
  for (const auto& url : config_.notify) {
    if (auto ok = alerts::checkWebhookUrl(url); !ok) return ok.error().withContext("notify");
    log_.info("every job's alerts also go to " + alerts::redactUrl(url));
  }
  defaults.notify = config_.notify;
  return defaults;
}

// The client socket, then the ranks' report socket.
Result<void> Agent::Impl::listen(const std::string& reportEndpoint) {
  try {
    clients_ = std::make_unique<ClientPort>(context_, log_);
    LOCKSTEP_ASSIGN_OR_RETURN(config_.listen, clients_->bind(config_.listen, keys_));
    // A supervising agent opens a connection per job it supervises here, all with its node key.
    clients_->allowMoreConnections(
        [this](const std::string& key) { return jobsSupervisedBy(key, jobs_->list()).size(); });
    stalls_ = std::make_unique<Stalls>(config_.name, *jobs_, *stream_, *clients_, log_);
    peaks_ = std::make_unique<Peaks>(config_.name, nvml_ ? nvml_->gpus() : std::vector<GpuInfo>{});
    peaks_->setCpu(cpuPeak_->now());
    inbox_ = std::make_unique<RankInbox>(context_, *jobs_, *stalls_, *peaks_, *stream_, log_);
    return inbox_->bind(reportEndpoint);
  } catch (const zmq::error_t& e) {
    return Error{ErrorCode::kUnavailable,
                 "cannot listen on " + config_.listen + ": " + e.what() +
                     (e.num() == EADDRINUSE ? " (is another agent running? pick another port)" : "")};
  }
}

void Agent::Impl::makeComponents() {
  sensors_ = std::make_unique<NodeSensors>(nvml_.get(), config_.name, config_.sampleHz);
  starts_ = std::make_unique<Starts>(StartSettings{config_.name, keys_.publicKey, config_.trainer, config_.commandJobs,
                                                   config_.privateTmp(), milliseconds(config_.pathCheckTimeoutMs)},
                                     *access_, *jobs_, *supervisions_, *clients_, log_);
  fetches_ = std::make_unique<Fetches>(*stream_, *jobs_, instanceId_, config_.name, *clients_);
  lifecycle_ = std::make_unique<Lifecycle>(config_, *jobs_, log_);
  requests_ = std::make_unique<Requests>(RequestParts{*clients_, *access_, *jobs_, *starts_, *fetches_, *stalls_,
                                                      *supervisions_, log_, [this] { return hello(); }});
}

Result<void> Agent::Impl::loop(const std::atomic<int>& stop) {
  trackRanks();
  while (serving(stop)) {
    std::vector<zmq::pollitem_t> items = pollItems();
    try {
      zmq::poll(items, std::max(pollTimeout(), milliseconds(0)));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return ioError(std::string("poll failed: ") + e.what());
      continue;
    }
    serve(items, stop);
  }
  // Nobody is there any more.
  metrics_->withdraw();
  lifecycle_->leave();
  return {};
}

// Until told to stop (under Slurm: and its jobs ended), or idle for too long.
bool Agent::Impl::serving(const std::atomic<int>& stop) {
  if (stop.load() != 0 && !lifecycle_->stillEnding(unfetched())) return false;
  return !lifecycle_->idleTooLong(starts_->waiting());
}

std::vector<zmq::pollitem_t> Agent::Impl::pollItems() {
  const auto client = clients_->pollItems();
  std::vector<zmq::pollitem_t> items(client.begin(), client.end());
  items.push_back(inbox_->pollItem());
  items.push_back({nullptr, sensors_->wakeFd(), ZMQ_POLLIN, 0});
  items.push_back({nullptr, starts_->wakeFd(), ZMQ_POLLIN, 0});
  items.push_back({nullptr, stalls_->wakeFd(), ZMQ_POLLIN, 0});
  items.push_back({nullptr, cpuPeak_->wakeFd(), ZMQ_POLLIN, 0});
  for (int fd : jobs_->exitFds()) items.push_back({nullptr, fd, ZMQ_POLLIN, 0});
  return items;
}

milliseconds Agent::Impl::pollTimeout() const {
  auto timeout = std::min(fetches_->until(clients_->timeout(kIdlePoll)), stalls_->untilDue());
  if (starts_->waiting()) {
    const auto next = starts_->nextDeadline();
    if (next != Clock::time_point::max()) {
      timeout = std::min(timeout, std::chrono::duration_cast<milliseconds>(next - Clock::now()) + milliseconds(1));
    }
  }
  return timeout;
}

void Agent::Impl::serve(const std::vector<zmq::pollitem_t>& items, const std::atomic<int>& stop) {
  const auto ready = [&](Polled which) { return (items[which].revents & ZMQ_POLLIN) != 0; };
  if (ready(kHandshakes)) clients_->onHandshake([this](const std::string& key) { return authorized(key); });
  clients_->watchConnections(ready(kConnections));
  revoke(access_->refreshEverySecond());
  const std::uint64_t before = stream_->lastSeq();
  for (int i = 0; i < 64 && ready(kRequests); ++i) {
    if (auto incoming = clients_->receive())
      requests_->handle(incoming->client, incoming->key, std::move(incoming->request));
    if (!clients_->readable()) break;
  }
  if (ready(kReports)) inbox_->onReports();
  if (ready(kSamples)) onSamples();
  // Finished checks, and those past their deadline. Its eventfd is read whenever it fired: a
  // check answered at its deadline still writes it when its thread ends.
  if (ready(kChecks) || starts_->waiting()) {
    starts_->onPreflight();
    trackRanks();
  }
  if (ready(kEvidence)) stalls_->onEvidence();
  if (ready(kCpuPeak)) {
    if (auto measured = cpuPeak_->take()) peaks_->setCpu(std::move(*measured));
  }
  for (auto& event : alerts_->takeEvents()) stream_->append(std::move(event));
  // Slurm ends an allocation by signalling its ranks as it signals this agent: the jobs are
  // stopped with Slurm's reason before a rank that died of it is reaped as a failure.
  if (stop.load() != 0) (void)lifecycle_->stillEnding(unfetched());
  const auto ranksBefore = jobs_->runningRanks().size();
  jobs_->poll();
  if (jobs_->runningRanks().size() != ranksBefore) trackRanks();
  if (cpuPeak_->busy()) cpuPeak_->tick(!jobs_->runningRanks().empty());
  stalls_->tick();
  fetches_->answer(stream_->lastSeq() == before);
  metrics_->publish([this] {
    auto jobs = jobs_->list();
    for (auto& job : jobs) stalls_->withProgress(job);
    return jobs;
  });
}

void Agent::Impl::onSamples() {
  for (auto& sample : sensors_->take()) {
    std::visit([this](auto& s) { stream_->append(std::move(s)); }, sample);
  }
}

// What the sensors sample: the running ranks, and which job holds each GPU.
void Agent::Impl::trackRanks() { sensors_->track(jobs_->runningRanks(), jobs_->busyGpus()); }

NodeHello Agent::Impl::hello() const {
  NodeHello h;
  h.agentVersion = version();
  h.host = hostName();
  h.cpuCores = cpuCores();
  h.memoryTotalBytes = memoryTotalBytes();
  if (nvml_) h.gpus = nvml_->gpus();
  h.gpuStatus = gpuStatus_;
  const NodeFree free = jobs_->free();
  h.freeCores = free.cores;
  h.freeMemoryBytes = free.memoryBytes;
  h.fencesOff = fencesOff_;
  const CpuPeak cpu = cpuPeak_->now();
  h.cpuCorePeakFlops = cpu.perCore;
  h.cpuPeakBasis = cpu.basis;
  h.lastSeq = stream_->lastSeq();
  h.nodeName = config_.name;
  h.instanceId = instanceId_;
  h.sampleHz = config_.sampleHz;
  h.timeUnixUs = stream_->nowUnixUs();
  return h;
}

// Once, at start: which fences jobs get here, and each that is off with why (docs/fences.md).
void Agent::Impl::logFences() const {
  if (cgroups_.unified.available()) log_.info("each job gets a cgroup of its own under " + cgroups_.unified.base);
  std::string on;
  const std::pair<const CgroupHierarchy*, const char*> fences[] = {
      {&cgroups_.memory, "memory"}, {&cgroups_.pids, "processes"}, {&cgroups_.cpuset, "cores"}, {&cgroups_.devices, "GPUs"}};
  for (const auto& [hierarchy, name] : fences) {
    if (hierarchy->available()) on += std::string(on.empty() ? "" : ", ") + name + (hierarchy->v2 ? "" : " (cgroup v1)");
  }
  if (config_.jobFences) log_.info("jobs are fenced: " + (on.empty() ? std::string("nothing") : on) + "; cores " + cpuListText(cgroups_.cpus));
  for (const auto& off : fencesOff_) log_.info("fence off, " + off);
}

// A key added a moment ago is let in without a restart.
bool Agent::Impl::authorized(const std::string& key) {
  revoke(access_->refresh());
  return access_->admits(key);
}

// Keys that left the authorized keys: their waiting requests are refused now, their next ones when
// they come (ZeroMQ cannot close one peer of a ROUTER socket, so the session is refused instead).
void Agent::Impl::revoke(const std::vector<std::string>& keys) {
  if (keys.empty()) return;
  const auto gone = [&](const std::string& key) { return std::find(keys.begin(), keys.end(), key) != keys.end(); };
  const Error why = access_->revokedError();
  fetches_->revoke(gone, why);
  starts_->revoke(gone, why);
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() = default;

Result<std::unique_ptr<Agent>> Agent::create(const AgentConfig& config, Log& log) {
  auto impl = std::make_unique<Impl>(config, log);
  LOCKSTEP_TRY(impl->init());
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

const CurveKeyPair& Agent::keys() const { return impl_->keys(); }
Result<void> Agent::run(const std::atomic<int>& stop) { return impl_->loop(stop); }

}  // namespace lockstep::agent
