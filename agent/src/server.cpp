#include "server.h"

#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <nlohmann/json.hpp>
#include <set>
#include <zmq.hpp>

#include "host.h"
#include "job_cgroup.h"
#include "jobs.h"
#include "key_ring.h"
#include "lockstep/common/clock.h"
#include "lockstep/client/slurm.h"
#include "lockstep/common/files.h"
#include "lockstep/net/zmq_util.h"
#include "lockstep/protocol/codec.h"
#include "lockstep/protocol/stream.h"
#include "metrics.h"
#include "nvml.h"
#include "preflight.h"
#include "rank_launch.h"
#include "sampler.h"
#include "stream_buffer.h"
#include "server_impl.h"
#include "supervision.h"

namespace lockstep::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr std::size_t kMaxRequestBytes = 4u << 20;
// Whole requests libzmq holds per connection before it stops reading from it.
constexpr int kRequestQueue = 4;
// What libzmq may have read from a connection and not yet handed over: the requests it holds, the
// one being decoded and the next, and the handshake. More is a multipart message that goes on and
// on (connection_watch.h): its connection is cut.
constexpr std::int64_t kMaxUndelivered = (kRequestQueue + 2) * std::int64_t{kMaxRequestBytes + 64} + (64 << 10);
constexpr std::size_t kFetchDefaultMessages = 2000;
constexpr std::size_t kFetchMaxMessages = 20000;
constexpr std::uint32_t kFetchMaxWaitMs = 30000;
// Long polls that may wait at once: per client key (the app and lockstepctl use one or two), and
// in all. Beyond, a Fetch is refused at once instead of held.
constexpr std::size_t kMaxWaitingFetchesPerKey = 16;
constexpr std::size_t kMaxWaitingFetches = 1024;
constexpr std::chrono::seconds kFirstJobWait{300};  // --exit-when-idle-s before the first job

std::string version() { return LOCKSTEP_VERSION; }

}  // namespace

Result<void> Agent::Impl::init() {
  LOCKSTEP_TRY(makeDirectories(config_.stateDir, 0700));
  // StrictModes, as sshd: a state directory others may write would let them replace our keys.
  if (struct stat st {}; ::stat(config_.stateDir.c_str(), &st) == 0) {
    if (auto why = strictModesProblem(config_.stateDir, st.st_mode, st.st_uid); !why.empty()) {
      return Error{ErrorCode::kPermissionDenied, "the state directory " + why};
    }
  }
  owners_.agent = currentIdentity();
  owners_.node = config_.name;
  owners_.keysPath = config_.authorizedKeysPath();
  if (owners_.agent.uid == 0) log_.info("running as root: each key's jobs run as the Unix user its line names (user=NAME)");
  bool created = false;
  LOCKSTEP_ASSIGN_OR_RETURN(keys_, loadOrCreateKeyPair(config_.stateDir, "agent", &created));
  if (created) log_.info("created this agent's key pair; public key " + keys_.publicKey);
  std::random_device random;
  instanceId_ = (std::uint64_t{random()} << 32) ^ random();
  // A test stands in for a node whose clock is off: its hellos' time and everything it streams
  // are stamped this much later than they happened.
  if (const char* shift = std::getenv("LOCKSTEP_TEST_CLOCK_OFFSET_US")) clockShiftUs_ = std::strtoll(shift, nullptr, 10);

  nvml_ = Nvml::load(config_.nvmlLibrary, &gpuStatus_);
  if (!gpuStatus_.empty()) log_.info(gpuStatus_);
  if (nvml_) log_.info("NVML: " + std::to_string(nvml_->gpus().size()) + " GPU(s)");

  // Sequence numbers continue after the last block an earlier run of the agent reserved.
  const std::string seqPath = (fs::path(config_.stateDir) / "seq").string();
  std::uint64_t nextSeq = 1;
  if (auto text = readFile(seqPath, 64)) {
    std::uint64_t reserved = 0;
    if (std::from_chars(text->data(), text->data() + text->size(), reserved).ec == std::errc()) nextSeq = reserved + 1;
  }
  stream_ = std::make_unique<StreamBuffer>(config_.name, nextSeq, config_.replayMessages, [seqPath](std::uint64_t upTo) {
    return writeFileAtomic(seqPath, std::to_string(upTo) + "\n");
  });

  // In a directory of its own: jobs' sandboxes keep that directory, so a restarted agent's new
  // socket is the one their ranks reach.
  LOCKSTEP_TRY(makeDirectories((fs::path(config_.stateDir) / "run").string(), 0700));
  const std::string reportSocket = (fs::path(config_.stateDir) / "run" / "report.sock").string();
  if (reportSocket.size() > 100) {
    return invalidArgument("--state-dir " + config_.stateDir + " is too long for a UNIX socket path (" +
                           std::to_string(reportSocket.size()) + " bytes); use a shorter one");
  }
  const std::string reportEndpoint = "ipc://" + reportSocket;

  JobManagerOptions jobOptions;
  jobOptions.node = {config_.name, cpuCores(), nvml_ ? static_cast<std::uint32_t>(nvml_->gpus().size()) : 0};
  jobOptions.stateDir = config_.stateDir;
  jobOptions.trainerPath = config_.trainer;
  jobOptions.listenHost = config_.listenHost();
  jobOptions.reportEndpoint = reportEndpoint;
  jobOptions.pythonPath = findPythonPackage();
  jobOptions.sandbox = config_.jobSandbox;
  jobOptions.privateTmp = config_.privateTmp();
  std::string noCgroups;
  jobOptions.cgroupBase = jobCgroupBase(&noCgroups).value_or("");
  log_.info(jobOptions.cgroupBase.empty() ? "jobs get no cgroup of their own: " + noCgroups
                                          : "each job gets a cgroup of its own under " + jobOptions.cgroupBase);
  if (const std::string shared = privateToJobs(config_.stateDir); config_.privateTmp() && !shared.empty()) {
    return invalidArgument("--state-dir " + config_.stateDir + " is under " + shared +
                           ", which each job gets a private one of: choose another state directory, or --job-private-tmp no");
  }
  if (!config_.jobSandbox) log_.info("job-sandbox = no: every job's processes can read this agent's secret key");
  if (jobOptions.pythonPath.empty()) {
    log_.info("the lockstep Python package is not beside this agent: command jobs' ranks cannot `import lockstep` "
              "unless it is on their own PYTHONPATH");
  }
  jobOptions.defaultStopGrace = milliseconds(config_.stopGraceMs);
  jobs_ = std::make_unique<JobManager>(jobOptions, [this](JobEvent e) {
    log_.info("job " + e.jobId + ": " + e.message);
    append(std::move(e));
  });
  if (auto restored = jobs_->restore(); !restored) return restored.error();
  // The jobs this agent supervises and still runs a part of: supervised again where they stand.
  supervisions_ = std::make_unique<Supervisions>(config_.name, keys_, log_);
  for (const auto& job : jobs_->list()) {
    if (!jobStateEnded(job.state)) supervisions_->supervise(job.spec);
  }

  try {
    // The ZAP handler first: without it libzmq would let every CURVE client in.
    zap_ = std::make_unique<ZapHandler>(context_);
    router_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::router);
    LOCKSTEP_TRY(makeCurveServer(*router_, keys_));
    router_->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(kMaxRequestBytes));
    router_->set(zmq::sockopt::router_mandatory, 1);
    router_->set(zmq::sockopt::linger, 0);
    router_->set(zmq::sockopt::sndhwm, 10000);
    router_->set(zmq::sockopt::rcvhwm, kRequestQueue);
    watch_ = std::make_unique<ConnectionWatch>(context_, *router_, kMaxUndelivered);
    router_->bind(config_.listen);
    config_.listen = router_->get(zmq::sockopt::last_endpoint);  // the port, when it was 0
    reports_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::pull);
    reports_->set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(kMaxReportBytes));
    reports_->set(zmq::sockopt::rcvhwm, 100000);
    reports_->set(zmq::sockopt::linger, 0);
    ::unlink(reportSocket.c_str());  // left by an agent that did not exit cleanly
    reports_->bind(reportEndpoint);
    // Every job's ranks connect, whatever their user: they reach run/ only from their sandboxes,
    // since the state directory itself is the agent's alone (0700).
    if (::chmod(reportSocket.c_str(), 0666) != 0 || ::chmod(fs::path(reportSocket).parent_path().c_str(), 0711) != 0) {
      return errnoError("cannot open " + reportSocket + " to the jobs' users", errno);
    }
  } catch (const zmq::error_t& e) {
    return Error{ErrorCode::kUnavailable, "cannot listen on " + config_.listen + ": " + e.what() +
                                              (e.num() == EADDRINUSE ? " (is another agent running? pick another port)" : "")};
  }
  sampler_ = std::make_unique<Sampler>(nvml_.get(), config_.name, config_.sampleHz);
  preflight_ = std::make_unique<Preflight>(milliseconds(config_.pathCheckTimeoutMs));
  log_.info("listening on " + config_.listen + " as node " + config_.name + "; public key " + keys_.publicKey +
            "; authorized keys in " + config_.authorizedKeysPath());
  LOCKSTEP_TRY(serveMetrics());
  return announce();
}

Result<void> Agent::Impl::serveMetrics() {
  if (config_.metricsListen.empty()) return {};
  LOCKSTEP_ASSIGN_OR_RETURN(metricsServer_, MetricsServer::start(config_.metricsListen));
  metricsPage_ = std::make_unique<MetricsPage>(config_.name);
  log_.info("serving metrics for Prometheus at http://" + metricsServer_->address() + "/metrics" +
            (metricsServer_->loopback() ? "" : " to anyone who can reach that address: they are not authenticated"));
  return writeMetricsTargets();
}

// Prometheus' file-based service discovery (docs/cluster.md): a target group naming where this
// node's metrics are, labelled with the node and its Slurm job; the file goes when the agent does.
Result<void> Agent::Impl::writeMetricsTargets() const {
  if (config_.metricsTargets.empty()) return {};
  const std::string served = metricsServer_->address();
  const std::string host = served.substr(0, served.rfind(':'));
  const bool wildcard = host == "0.0.0.0" || host == "::" || host == "[::]";
  const std::string target = (wildcard ? hostName() : host) + served.substr(served.rfind(':'));
  nlohmann::json labels = {{"node", config_.name}};
  if (!config_.slurmJob.empty()) labels["slurm_job"] = config_.slurmJob;
  const nlohmann::json group = nlohmann::json::array({{{"targets", {target}}, {"labels", labels}}});
  // Prometheus may run as another user: the file is readable, and holds nothing secret.
  if (auto written = writeFileAtomic(config_.metricsTargets, group.dump() + "\n", 0644); !written) {
    return written.error().withContext("--metrics-targets");
  }
  log_.info("named " + target + " for Prometheus in " + config_.metricsTargets);
  return {};
}

// Where a client finds this agent when it cannot be told in advance (a Slurm job's agents,
// docs/cluster.md): the address it listens on, with this node's host name for a wildcard, and its
// public key, written once it listens.
Result<void> Agent::Impl::announce() const {
  if (config_.announce.empty()) return {};
  const std::string port = config_.listen.substr(config_.listen.rfind(':') + 1);
  const std::string host = config_.listenHost();
  const bool wildcard = host == "0.0.0.0" || host == "*" || host == "[::]";
  const std::string address = (wildcard ? hostName() : host) + ":" + port;
  if (auto written = writeFileAtomic(config_.announce, address + " " + keys_.publicKey + "\n", 0600); !written) {
    return written.error().withContext("--announce");
  }
  log_.info("announced " + address + " in " + config_.announce);
  return {};
}

void Agent::Impl::publishMetrics() {
  if (!metricsServer_ || Clock::now() < nextMetrics_) return;
  nextMetrics_ = Clock::now() + std::chrono::seconds(1);
  auto jobs = jobs_->list();
  for (auto& job : jobs) withProgress(job);
  metricsServer_->publish(metricsPage_->render(unixMicrosNow(), jobs));
}

bool Agent::Impl::authorized(const std::string& key) {
  revoke(keyRing_.refresh());  // a key added a moment ago is let in without a restart
  const bool ok = keyRing_.allows(key) || !jobsSupervisedBy(key, jobs_->list()).empty();
  if (!ok) keyRing_.noteRefusedHandshake(key);
  return ok;
}

// Keys that left the authorized keys: their waiting requests are refused now, their next ones in
// onRequest (ZeroMQ cannot close one peer of a ROUTER socket, so the session is refused instead).
void Agent::Impl::revoke(const std::vector<std::string>& keys) {
  if (keys.empty()) return;
  const auto gone = [&](const std::string& key) { return std::find(keys.begin(), keys.end(), key) != keys.end(); };
  const Error why = revokedError();
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    if (gone(it->key)) {
      replyError(it->client, it->requestId, why);
      it = fetches_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = starts_.begin(); it != starts_.end();) {
    if (gone(it->second.key)) {
      log_.info("job " + it->second.spec.jobId + ": not started, its client's key was revoked");
      replyError(it->second.client, it->second.requestId, why);
      it = starts_.erase(it);
    } else {
      ++it;
    }
  }
}

Error Agent::Impl::revokedError() const {
  return Error{ErrorCode::kPermissionDenied, "this client's key is no longer in the authorized keys of node " +
                                                 config_.name + " (" + config_.authorizedKeysPath() + ")"};
}

NodeHello Agent::Impl::hello() const {
  NodeHello h;
  h.agentVersion = version();
  h.host = hostName();
  h.cpuCores = cpuCores();
  h.memoryTotalBytes = memoryTotalBytes();
  if (nvml_) h.gpus = nvml_->gpus();
  h.gpuStatus = gpuStatus_;
  h.lastSeq = stream_->lastSeq();
  h.nodeName = config_.name;
  h.instanceId = instanceId_;
  h.sampleHz = config_.sampleHz;
  h.timeUnixUs = unixMicrosNow() + clockShiftUs_;
  return h;
}

void Agent::Impl::append(StreamBuffer::Payload payload) {
  if (clockShiftUs_ != 0) std::visit([this](auto& record) { record.timeUnixUs += clockShiftUs_; }, payload);
  if (metricsPage_) metricsPage_->observe(payload, [this] { return jobs_->list(); });
  // Said once per episode: while the state disk is full every append fails the same way.
  auto r = stream_->append(std::move(payload));
  if (!r && !reserveFailing_) {
    log_.error("cannot reserve sequence numbers: " + r.error().message +
               "; new messages wait unnumbered (the newest " + std::to_string(config_.replayMessages) + ") until it can");
  } else if (r && reserveFailing_) {
    log_.info("sequence numbers reserved again; " + std::to_string(stream_->droppedWaiting()) +
              " waiting message(s) were dropped so far");
  }
  reserveFailing_ = !r;
}

void Agent::Impl::reply(const std::string& client, const Reply& message) {
  const std::string bytes = encode(message);
  try {
    router_->send(zmq::buffer(client), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    router_->send(zmq::buffer(bytes), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // The client left (EHOSTUNREACH) or stopped reading (EAGAIN): it will ask again.
  }
}

void Agent::Impl::replyError(const std::string& client, std::uint64_t requestId, const Error& error) {
  reply(client, Reply{requestId, ErrorReply{error.code, error.message}});
}

void Agent::Impl::onRequest() {
  // The routing id and one body frame are kept; further frames are dropped as they are read.
  bool dropped = false;
  auto frames = receiveMultipart(*router_, 2, &dropped);
  if (!frames) {
    if (frames.error().code != ErrorCode::kUnavailable) log_.info("dropped a request: " + frames.error().message);
    return;
  }
  const std::string client = (*frames)[0].to_string();
  if (frames->size() > 1) watch_->delivered((*frames)[1]);
  if (dropped || frames->size() != 2) {
    replyError(client, 0, invalidArgument("a request is one frame holding a lockstep.v1.Request"));
    return;
  }
  const std::string key = clientKeyOf((*frames)[1]);
  auto request = decodeRequest((*frames)[1].to_string_view(), kMaxRequestBytes);
  if (!request) {
    replyError(client, 0, request.error());
    return;
  }
  const std::uint64_t id = request->requestId;
  auto access = accessOf(key, *request);
  if (!access) {
    replyError(client, id, access.error());
    return;
  }
  // Acting on a job: only its owner's keys, an admin's, or its supervising agent's.
  const auto denied = [&](const std::string& jobId) {
    auto may = mayActOn(*access, jobId);
    if (!may) replyError(client, id, may.error());
    return !may;
  };
  std::visit(
      [&](auto& body) {
        using T = std::decay_t<decltype(body)>;
        if constexpr (std::is_same_v<T, HelloRequest>) {
          if (body.protocolVersion != kProtocolVersion) {
            replyError(client, id, Error{ErrorCode::kFailedPrecondition,
                                         "this agent speaks protocol version " + std::to_string(kProtocolVersion) +
                                             ", the client " + std::to_string(body.protocolVersion) +
                                             ": upgrade the older one"});
          } else {
            reply(client, Reply{id, hello()});
          }
        } else if constexpr (std::is_same_v<T, StartJobRequest>) {
          onStartJob(client, key, *access, id, std::move(body.spec), std::move(body.storeSecret));
        } else if constexpr (std::is_same_v<T, StopJobRequest>) {
          if (denied(body.jobId)) return;
          log_.info("job " + body.jobId + ": stop asked by " + access->describe);
          if (access->user) stoppedByUser_.insert(body.jobId);  // its supervising agent does not restart it
          if (cancelPendingStart(body.jobId)) {
            reply(client, Reply{id, StopJobReply{body.jobId, JobState::kStopped}});
            return;
          }
          auto stopped = jobs_->stop(body.jobId, body.graceMs);
          if (stopped) {
            reply(client, Reply{id, *stopped});
          } else {
            replyError(client, id, stopped.error());
          }
        } else if constexpr (std::is_same_v<T, FetchRequest>) {
          onFetch(client, key, *access, id, body);
        } else if constexpr (std::is_same_v<T, ListJobsRequest>) {
          reply(client, Reply{id, JobsReply{listFor(key, *access)}});
        } else if constexpr (std::is_same_v<T, StacksRequest>) {
          if (!denied(body.jobId)) onStacks(client, id, body);
        } else {
          if (denied(body.jobId)) return;
          auto logs = jobs_->logs(body.jobId, body.rank, body.maxBytes);
          if (logs) {
            reply(client, Reply{id, *logs});
          } else {
            replyError(client, id, logs.error());
          }
        }
      },
      request->body);
}

void Agent::Impl::onStartJob(const std::string& client, const std::string& key, const Access& access,
                             std::uint64_t id, JobSpec spec, std::string storeSecret) {
  const auto refuse = [&](const Error& why) {
    log_.info("refused job " + spec.jobId + ": " + why.message);
    replyError(client, id, why);
  };
  if (spec.command && !config_.commandJobs) {
    return refuse(Error{ErrorCode::kPermissionDenied,
                        "node " + config_.name + " runs no jobs of their own program (its agent sets command-jobs = no); "
                        "run lockstep-trainer there, or ask its admin"});
  }
  // A supervising agent's key restarts only what a user's started here (supervisorMay checked),
  // with the rights that user still has.
  Identity owner = access.runAs;
  if (!access.user) {
    auto restart = restartOwner(spec);
    if (!restart) return refuse(restart.error());
    owner = std::move(restart).value();
  } else if (spec.command && !keyRing_.allowsCommandJobs(key)) {
    return refuse(Error{ErrorCode::kPermissionDenied,
                        "this client's key may not start jobs that run their own program on " + config_.name +
                            " (its authorized keys give it the no-command-jobs option)"});
  }
  const SupervisingRole mine = supervisingRole(spec, [&](const JobAgent& a) { return a.node == config_.name; });
  if (mine && mine.agent->publicKey != keys_.publicKey) {
    return refuse(invalidArgument("job " + spec.jobId + " names " + config_.name +
                                  "'s agent with a key that is not this agent's: pin this agent's key again"));
  }
  const bool pending = std::any_of(starts_.begin(), starts_.end(),
                                   [&](const auto& entry) { return entry.second.spec.jobId == spec.jobId; });
  if (pending) {
    return refuse(Error{ErrorCode::kAlreadyExists, "job " + spec.jobId + " is already being started on " +
                                                       config_.name + ": pick another job id"});
  }
  const std::uint64_t check = nextPreflightId_++;
  const PathFacts facts{config_.name, config_.trainer, std::getenv("PATH") != nullptr ? std::getenv("PATH") : "", owner,
                        config_.privateTmp()};
  auto paths = [spec, facts] { return checkJobPaths(spec, facts); };
  if (auto submitted = preflight_->submit(check, std::move(paths), config_.name); !submitted) {
    return refuse(submitted.error());
  }
  log_.info("job " + spec.jobId + ": start asked by " + access.describe + ", to run as " + owner.user);
  starts_.emplace(check, PendingStart{client, key, id, std::move(spec), std::move(storeSecret), std::move(owner)});
}

std::string Agent::Impl::launcherPath(const std::string& jobId) const { return jobs_->launcherPath(jobId); }

// Who a restart the job's supervising agent asks for runs as: the user the key that launched it
// maps to now. Refused when a user stopped the job, or that key lost the right to start it (left
// the authorized keys, or may run no program of its own).
Result<Identity> Agent::Impl::restartOwner(const JobSpec& spec) const {
  if (stoppedByUser_.count(spec.jobId)) {
    return Error{ErrorCode::kFailedPrecondition, "job " + spec.jobId + " was stopped by a user on " + config_.name +
                                                     ": it is not restarted"};
  }
  auto launcher = readFile(launcherPath(spec.jobId), 256);
  const KeyGrant* grant = keyRing_.grant(launcher ? launcher->substr(0, launcher->find('\n')) : "");
  if (grant == nullptr || (spec.command && !grant->commandJobs)) {
    return Error{ErrorCode::kPermissionDenied, "the key that launched job " + spec.jobId + " may no longer start it on " +
                                                   config_.name + ": it is not restarted"};
  }
  return owners_.runAs(*grant);
}

bool Agent::Impl::cancelPendingStart(const std::string& jobId) {
  // A StopJob while the job's paths are still being checked: it never starts (a client that
  // gave up waiting for StartJob's answer undoes it so).
  for (auto it = starts_.begin(); it != starts_.end(); ++it) {
    if (it->second.spec.jobId != jobId) continue;
    log_.info("job " + jobId + ": stopped before it started");
    replyError(it->second.client, it->second.requestId,
               Error{ErrorCode::kCancelled, "job " + jobId + " was stopped on " + config_.name + " before it started"});
    starts_.erase(it);
    return true;
  }
  return false;
}

void Agent::Impl::onPreflight() {
  for (auto& done : preflight_->take()) {
    auto it = starts_.find(done.id);
    if (it == starts_.end()) continue;
    PendingStart pending = std::move(it->second);
    starts_.erase(it);
    Result<StartJobReply> started =
        done.result ? jobs_->start(pending.spec, *done.result, pending.owner, pending.storeSecret)
                    : Result<StartJobReply>(done.result.error());
    if (started) {
      // Who launched it, for the restarts its supervising agent may ask for (restartOwner).
      if (keyRing_.allows(pending.key)) {
        const std::string path = launcherPath(pending.spec.jobId);
        auto kept = makeDirectories(fs::path(path).parent_path().string(), 0700);
        if (kept) kept = writeFileAtomic(path, pending.key + "\n", 0600);
        if (!kept) {
          log_.error("job " + pending.spec.jobId + ": cannot keep who launched it: " + kept.error().message);
        }
      }
      supervisions_->supervise(pending.spec);
      reply(pending.client, Reply{pending.requestId, *started});
    } else {
      log_.info("refused job " + pending.spec.jobId + ": " + started.error().message);
      replyError(pending.client, pending.requestId, started.error());
    }
  }
  sampler_->track(jobs_->runningRanks(), jobs_->busyGpus());
}

void Agent::Impl::onSamples() {
  for (auto& sample : sampler_->take()) {
    std::visit([this](auto& s) { append(std::move(s)); }, sample);
  }
}

// A long poll: answered at once when something newer than afterSeq is there for this client,
// else held until it is or the wait ends. Messages of jobs the client may not see do not answer it.
void Agent::Impl::onFetch(const std::string& client, const std::string& key, const Access& access, std::uint64_t id,
                          const FetchRequest& body) {
  fetchedUpTo_ = std::max(fetchedUpTo_, body.afterSeq);
  const std::size_t max =
      std::min<std::size_t>(body.maxMessages > 0 ? body.maxMessages : kFetchDefaultMessages, kFetchMaxMessages);
  std::uint64_t after = body.afterSeq;
  if (stream_->hasAfter(after) || body.waitMs == 0) {
    FetchReply now = fetchFor(access.onlyOwner(), after, max);
    if (!now.messages.empty() || body.waitMs == 0) return reply(client, Reply{id, std::move(now)});
    after = std::max(after, now.lastSeq);  // nothing up to there is this client's
  }
  const auto waiting = static_cast<std::size_t>(
      std::count_if(fetches_.begin(), fetches_.end(), [&](const PendingFetch& f) { return f.key == key; }));
  if (waiting >= kMaxWaitingFetchesPerKey || fetches_.size() >= kMaxWaitingFetches) {
    return replyError(client, id, Error{ErrorCode::kResourceExhausted,
                                        "this client already has " + std::to_string(waiting) + " Fetches waiting on node " +
                                            config_.name + " (at most " + std::to_string(kMaxWaitingFetchesPerKey) +
                                            "): wait for their answers before asking again"});
  }
  fetches_.push_back(PendingFetch{client, key, id, after, max,
                                  Clock::now() + milliseconds(std::min(body.waitMs, kFetchMaxWaitMs)), access.onlyOwner()});
}

void Agent::Impl::answerFetches(bool onlyExpired) {
  const auto now = Clock::now();
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    const bool expired = now >= it->deadline;
    if (!expired && (onlyExpired || !stream_->hasAfter(it->afterSeq))) {
      ++it;
      continue;
    }
    FetchReply fetched = fetchFor(it->owner, it->afterSeq, it->max);
    if (fetched.messages.empty() && !expired) {
      it->afterSeq = std::max(it->afterSeq, fetched.lastSeq);  // none of them is this client's: wait on
      ++it;
      continue;
    }
    reply(it->client, Reply{it->requestId, std::move(fetched)});
    it = fetches_.erase(it);
  }
}

// Under Slurm, SIGTERM means the allocation is ending (scancel, its time limit, preemption): the
// agent stops its jobs with Slurm's reason and keeps serving until they ended and a client has
// fetched the last of the stream (or a few seconds passed), so that the reason reaches the
// dashboard and the history. Elsewhere it exits at once and leaves its jobs running.
bool Agent::Impl::stillEnding() {
  if (config_.slurmJob.empty()) return false;
  const auto now = Clock::now();
  if (!endingSince_) {
    endingSince_ = now;
    const std::string why = slurmEndReason();
    log_.info(why);
    for (const auto& job : jobs_->list()) {
      if (!jobStateEnded(job.state)) (void)jobs_->stop(job.spec.jobId, 2000, why);
    }
  }
  if (now - *endingSince_ > std::chrono::seconds(20)) return false;
  if (!jobs_->runningRanks().empty()) return true;
  // A second for a following client to list the ended jobs, three at most for one to fetch the rest.
  if (!endedAt_) endedAt_ = now;
  const auto since = now - *endedAt_;
  return since < std::chrono::seconds(1) || (fetchedUpTo_ < stream_->lastSeq() && since < std::chrono::seconds(3));
}

std::string Agent::Impl::slurmEndReason() const {
  auto info = slurm::query(config_.slurmJob, milliseconds(3000));
  if (!info) return "Slurm job " + config_.slurmJob + " is ending (the agent got SIGTERM; " + info.error().message + ")";
  if (info->ended() || info->ending()) return "ended by " + info->describe();
  return "the agent was told to stop (SIGTERM) while " + info->describe() + " runs";
}

// A job counts as work until it ended and its supervision (restarts) did too. Before its first
// job an agent waits at least kFirstJobWait: its client may still be waiting for the
// allocation's other nodes to start.
bool Agent::Impl::idleTooLong() {
  if (config_.exitWhenIdleS == 0) return false;
  const auto jobs = jobs_->list();
  const bool busy = !starts_.empty() || std::any_of(jobs.begin(), jobs.end(), [](const JobStatus& j) {
                      return !jobStateEnded(j.state) || j.supervision.state == SupervisionState::kFollowing ||
                             j.supervision.state == SupervisionState::kRestarting;
                    });
  hadJob_ = hadJob_ || !jobs.empty() || busy;
  if (busy) {
    idleSince_.reset();
    return false;
  }
  if (!idleSince_) idleSince_ = Clock::now();
  const auto limit = std::chrono::seconds(config_.exitWhenIdleS);
  if (Clock::now() - *idleSince_ < (hadJob_ ? limit : std::max<std::chrono::seconds>(limit, kFirstJobWait))) return false;
  log_.info("no job ran for " + std::to_string(config_.exitWhenIdleS) + " s: exiting (--exit-when-idle-s)");
  return true;
}

void Agent::Impl::watchConnections(bool events) {
  if (events) watch_->onEvents();
  const auto now = Clock::now();
  if (const int cut = watch_->tick(); cut > 0) {
    log_.info("cut " + std::to_string(cut) + " client connection(s) that sent more than " +
              std::to_string(kMaxUndelivered >> 20) + " MiB without finishing a message");
    // libzmq frees the parts as it tears the connection down, on its own time: give the heap back
    // (a message of many tiny parts leaves it in pieces) a few times over the next seconds.
    trims_ = {now + milliseconds(200), now + milliseconds(1000), now + milliseconds(3000)};
  }
  if (!trims_.empty() && now >= trims_.front()) {
    ::malloc_trim(0);
    trims_.erase(trims_.begin());
  }
}

Result<void> Agent::Impl::loop(const std::atomic<int>& stop) {
  sampler_->track(jobs_->runningRanks(), jobs_->busyGpus());
  while (!(stop.load() != 0 && !stillEnding()) && !idleTooLong()) {
    std::vector<zmq::pollitem_t> items = {
        {router_->handle(), 0, ZMQ_POLLIN, 0},
        {zap_->socket().handle(), 0, ZMQ_POLLIN, 0},
        {reports_->handle(), 0, ZMQ_POLLIN, 0},
        {nullptr, sampler_->wakeFd(), ZMQ_POLLIN, 0},
        {nullptr, preflight_->wakeFd(), ZMQ_POLLIN, 0},
        {nullptr, evidence_.wakeFd(), ZMQ_POLLIN, 0},
        {watch_->events().handle(), 0, ZMQ_POLLIN, 0},
    };
    for (int fd : jobs_->exitFds()) items.push_back({nullptr, fd, ZMQ_POLLIN, 0});
    // Every tick while a client's connection is watched or the heap is to be given back.
    auto timeout = watch_->watching() || !trims_.empty() ? ConnectionWatch::kTick : milliseconds(200);
    for (const auto& f : fetches_) {
      timeout = std::min(timeout, std::chrono::duration_cast<milliseconds>(f.deadline - Clock::now()) + milliseconds(1));
    }
    if (!starts_.empty()) {
      const auto next = preflight_->nextDeadline();
      if (next != Clock::time_point::max()) {
        timeout = std::min(timeout, std::chrono::duration_cast<milliseconds>(next - Clock::now()) + milliseconds(1));
      }
    }
    try {
      zmq::poll(items, std::max(timeout, milliseconds(0)));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return ioError(std::string("poll failed: ") + e.what());
      continue;
    }
    if (items[1].revents & ZMQ_POLLIN) zap_->handleOne([this](const std::string& key) { return authorized(key); });
    watchConnections(items[6].revents & ZMQ_POLLIN);
    revoke(keyRing_.refreshEverySecond());
    const std::uint64_t before = stream_->lastSeq();
    for (int i = 0; i < 64 && (items[0].revents & ZMQ_POLLIN); ++i) {
      onRequest();
      if (!(router_->get(zmq::sockopt::events) & ZMQ_POLLIN)) break;
    }
    if (items[2].revents & ZMQ_POLLIN) onReports();
    if (items[3].revents & ZMQ_POLLIN) onSamples();
    // Finished checks, and those past their deadline. Its eventfd is read whenever it fired: a
    // check answered at its deadline still writes it when its thread ends.
    if ((items[4].revents & ZMQ_POLLIN) || !starts_.empty()) onPreflight();
    if (items[5].revents & ZMQ_POLLIN) onEvidence();
    const auto ranksBefore = jobs_->runningRanks().size();
    jobs_->poll();
    if (jobs_->runningRanks().size() != ranksBefore) sampler_->track(jobs_->runningRanks(), jobs_->busyGpus());
    tickStalls();
    answerFetches(stream_->lastSeq() == before);
    publishMetrics();
  }
  // Nobody is there any more.
  if (!config_.announce.empty()) ::unlink(config_.announce.c_str());
  if (!config_.metricsTargets.empty()) ::unlink(config_.metricsTargets.c_str());
  if (config_.slurmJob.empty()) log_.info("stopping; running jobs keep running and are adopted when the agent starts again");
  return {};
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
