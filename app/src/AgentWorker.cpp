#include "AgentWorker.h"

#include "lockstep/protocol/validate.h"

#include <algorithm>

#include <QLoggingCategory>

Q_LOGGING_CATEGORY(lcAgent, "lockstep.agent")

namespace lockstep::app {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {
constexpr auto kRequestTimeout = 5s;
constexpr std::uint32_t kFetchWaitMs = 100;  // short, so that queued commands wait at most this long
constexpr std::uint32_t kFetchMax = 5000;
constexpr auto kJobsRefresh = 1s;
constexpr auto kMaxBackoff = 10s;
// A fanned-in job's frame: ten times a second (as often as its supervising agent makes it while
// watched), the rows of its first ranks and of the slowest.
constexpr auto kFrameEvery = 100ms;
constexpr std::uint32_t kFrameRanks = 256;

bool listed(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

bool supervises(const JobStatus& status) {
  const SupervisionState s = status.supervision.state;
  return s == SupervisionState::kFollowing || s == SupervisionState::kRestarting || s == SupervisionState::kEnded;
}

}  // namespace

QString agentStateText(AgentState state) {
  switch (state) {
    case AgentState::kConnecting: return QStringLiteral("connecting");
    case AgentState::kConnected: return QStringLiteral("connected");
    case AgentState::kReconnecting: return QStringLiteral("reconnecting");
    case AgentState::kNotAuthorized: return QStringLiteral("not authorized");
    case AgentState::kWrongKey: return QStringLiteral("refused: wrong agent key");
  }
  return QStringLiteral("?");
}

void registerMetaTypes() {
  qRegisterMetaType<AgentState>();
  qRegisterMetaType<MessageBatch>();
  qRegisterMetaType<JobList>();
  qRegisterMetaType<HelloPtr>();
  qRegisterMetaType<EventBatch>();
  qRegisterMetaType<FramePtr>();
  qRegisterMetaType<ClockOffset>();
  qRegisterMetaType<JobSpec>();
}

AgentWorker::AgentWorker(QString id, AgentAddress address, CurveKeyPair keys, std::string agentKey,
                         std::shared_ptr<FanInBook> fanIn)
    : id_(std::move(id)),
      address_(std::move(address)),
      keys_(std::move(keys)),
      agentKey_(std::move(agentKey)),
      fanIn_(std::move(fanIn)) {}

AgentWorker::~AgentWorker() = default;

void AgentWorker::start() {
  timer_ = new QTimer(this);
  timer_->setSingleShot(true);
  connect(timer_, &QTimer::timeout, this, &AgentWorker::tick);
  timer_->start(0);
}

void AgentWorker::stop() {
  if (timer_) timer_->stop();
  client_.reset();
}

void AgentWorker::setState(AgentState state, const QString& message) {
  // A retry that fails as the last one did changes nothing the GUI shows: at 2,048 agents that
  // nothing answers, re-announcing each one was hundreds of signals a second.
  if (state == state_ && (state != AgentState::kReconnecting || message == stateMessage_)) return;
  state_ = state;
  stateMessage_ = message;
  Q_EMIT stateChanged(id_, state, message);
}

void AgentWorker::fail(const Error& error) {
  client_.reset();
  const QString message = QString::fromStdString(error.message);
  if (error.code == ErrorCode::kPermissionDenied) {
    // A key problem does not fix itself quickly: retry slowly, until someone authorizes the key.
    const bool refusedUs = error.message.find("refused this client's key") != std::string::npos;
    setState(refusedUs ? AgentState::kNotAuthorized : AgentState::kWrongKey, message);
    timer_->start(std::chrono::duration_cast<std::chrono::milliseconds>(kMaxBackoff));
    return;
  }
  qCInfo(lcAgent) << id_ << "reconnecting:" << message;
  setState(AgentState::kReconnecting, message);
  timer_->start(backoff_);
  backoff_ = std::min<std::chrono::milliseconds>(backoff_ * 2, kMaxBackoff);
}

bool AgentWorker::refreshJobs() {
  auto jobs = client_->listJobs(kRequestTimeout, knownSpecs_);
  if (!jobs) {
    fail(jobs.error());
    return false;
  }
  // Every job listed is now known at its attempt: the next list leaves their specs out.
  knownSpecs_.clear();
  for (const auto& j : jobs->jobs) {
    if (knownSpecs_.size() < kMaxKnownSpecs) knownSpecs_.push_back({j.spec.jobId, j.spec.attempt});
  }
  noteFannedIn(jobs->jobs);
  Q_EMIT jobsReceived(id_, std::make_shared<const std::vector<JobStatus>>(std::move(jobs->jobs)));
  nextJobsRefresh_ = Clock::now() + kJobsRefresh;
  return true;
}

void AgentWorker::noteFannedIn(const std::vector<JobStatus>& jobs) {
  leftOut_.clear();
  supervised_.clear();
  if (!fanIn_) return;
  std::vector<std::string> all;
  std::vector<const JobStatus*> fanned;
  for (const auto& j : jobs) {
    const std::string& id = j.spec.jobId;
    all.push_back(id);
    // A spec left out came whole on this connection before: the job was decided then.
    if (!(j.specOmitted ? fanIn_->decided(id).value_or(false) : fanIn_->decide(j.spec))) continue;
    fanned.push_back(&j);
    if (supervises(j) && !listed(done_, id)) supervised_.push_back(id);
  }
  // Past the bound, a job's records still come and the ingest drops them (its frames still do):
  // the running jobs' are left out first, theirs being the records that still flow.
  std::stable_partition(fanned.begin(), fanned.end(), [](const JobStatus* j) { return !jobStateEnded(j->state); });
  for (const JobStatus* j : fanned) {
    if (leftOut_.size() < kMaxJobsLeftOut) leftOut_.push_back(j->spec.jobId);
  }
  std::erase_if(done_, [&](const std::string& id) { return !listed(all, id); });
  std::erase_if(cursors_, [&](const auto& c) { return !listed(all, c.first); });
}

// Each fanned-in job this agent supervises: its frame, with the events after the last one seen.
// Until the agent has read the job's streams it answers UNAVAILABLE, and the next round asks
// again. Any other refusal is final for the job on this agent: a standby that mirrors the job's
// end, a job that ended while nobody asked, a job no longer held or not this user's.
bool AgentWorker::askFrames() {
  if (supervised_.empty() || Clock::now() < nextFrames_) return true;
  nextFrames_ = Clock::now() + kFrameEvery;
  for (const auto& jobId : supervised_) {
    FrameCursor& cursor = cursors_[jobId];
    // With the job's nodes in blocks: its heatmap's rows (kpi/frame.h).
    auto frame = client_->frame(FrameRequest{jobId, 0, kFrameRanks, cursor.eventsAfter, true, cursor.heldUnixUs},
                                kRequestTimeout);
    if (!frame) {
      const ErrorCode code = frame.error().code;
      if (code == ErrorCode::kTimeout || code == ErrorCode::kPeerLost) {
        fail(frame.error());
        return false;
      }
      qCDebug(lcAgent) << id_ << "no frame of" << QString::fromStdString(jobId) << ":" << QString::fromStdString(frame.error().message);
      // The agent's final word on the job; anything else (it reads the streams first, or this
      // client could not read its answer) is asked again.
      const bool final = code == ErrorCode::kFailedPrecondition || code == ErrorCode::kNotFound ||
                         code == ErrorCode::kPermissionDenied || code == ErrorCode::kInvalidArgument;
      if (final) done_.push_back(jobId);
      continue;
    }
    // Events that come again, after their numbers fell, the alerts' log knows already.
    cursor.take(*frame);
    if (frame->ended && cursor.complete(*frame)) done_.push_back(jobId);
    if (frame->kpis.empty() && frame->events.empty()) continue;  // the frame held, and nothing more
    Q_EMIT frameReceived(id_, std::make_shared<const FrameReply>(std::move(frame).value()));
  }
  std::erase_if(supervised_, [&](const std::string& id) { return listed(done_, id); });
  return true;
}

// An agent that started again numbers its jobs' events anew, and may now supervise a job it
// refused before.
void AgentWorker::forgetFrames() {
  cursors_.clear();
  done_.clear();
}

void AgentWorker::connectNow() {
  auto client = AgentClient::connect(address_, keys_, agentKey_, kRequestTimeout);
  if (!client) {
    fail(client.error());
    return;
  }
  client_ = std::move(client).value();
  knownSpecs_.clear();  // a new connection: the first list brings every spec
  // Another instance of the agent, seen before the first fetch (or frame) of this connection.
  if (const std::uint64_t instance = client_->hello().instanceId; instance != 0) {
    if (instanceId_ != 0 && instance != instanceId_) {
      qCInfo(lcAgent) << id_ << "the agent restarted";
      forgetFrames();
    }
    instanceId_ = instance;
  }
  backoff_ = 500ms;
  Q_EMIT helloReceived(id_, std::make_shared<const NodeHello>(client_->hello()));
  setState(AgentState::kConnected, {});
  nextClock_ = {};
  measureClock();
  if (refreshJobs()) timer_->start(0);
}

void AgentWorker::tick() {
  if (!client_) {
    connectNow();
    return;
  }
  if (Clock::now() >= nextJobsRefresh_ && !refreshJobs()) return;
  measureClock();
  if (!askFrames()) return;
  auto batch = client_->fetch(lastSeq_, kFetchMax, kFetchWaitMs, kRequestTimeout, leftOut_);
  if (!batch) {
    fail(batch.error());
    return;
  }
  if (instanceId_ != 0 && batch->instanceId != instanceId_) {
    qCInfo(lcAgent) << id_ << "the agent restarted";
    knownSpecs_.clear();  // the next list brings every spec again
    forgetFrames();
  }
  instanceId_ = batch->instanceId;
  if (!batch->messages.empty()) {
    // The agent took on a job since the last list (its jobs version, of this instance of it,
    // changed): list again first, so that the ingest and the recorder know each job these messages
    // are about; the payloads are the ingest's to read. An agent that does not count (version 0,
    // before this field) is listed again for every batch. A failed list leaves lastSeq_ where it
    // was: the batch is fetched again.
    const std::pair<std::uint64_t, std::uint64_t> version{batch->instanceId, batch->jobsVersion};
    if (batch->jobsVersion == 0 || version != jobsVersion_) {
      const std::vector<std::string> leftOut = leftOut_;
      if (!refreshJobs()) return;
      jobsVersion_ = version;
      // A job to watch fanned in came: fetch the batch again, without its records.
      if (leftOut_ != leftOut) {
        timer_->start(0);
        return;
      }
    }
    lastSeq_ = batch->messages.back().seq;
    Q_EMIT messagesReceived(id_, std::make_shared<const std::vector<StreamMessage>>(std::move(batch->messages)));
  }
  // Catching up: ask again at once; otherwise the long poll already waited.
  timer_->start(0);
}

void AgentWorker::measureClock() {
  if (!client_ || Clock::now() < nextClock_) return;
  nextClock_ = Clock::now() + kClockEvery;
  const std::string node = client_->hello().nodeName;
  if (auto offset = client_->measureClock(kClockExchanges, kRequestTimeout)) {
    Q_EMIT clockMeasured(id_, QString::fromStdString(node), *offset);
  }
}

void AgentWorker::startJob(quint64 tag, lockstep::JobSpec spec, QString storeSecret) {
  if (!client_) {
    Q_EMIT commandDone(tag, false, QStringLiteral("agent %1 is not connected").arg(id_), static_cast<int>(ErrorCode::kUnavailable));
    return;
  }
  auto started = client_->startJob(spec, storeSecret.toStdString(), kRequestTimeout);
  if (!started) {
    Q_EMIT commandDone(tag, false, QString::fromStdString(started.error().message), static_cast<int>(started.error().code));
    return;
  }
  Q_EMIT jobStarted(tag, id_, started->rendezvousPort, QString::fromStdString(started->storeSecret));
  Q_EMIT commandDone(tag, true, {}, 0);
  refreshJobs();
}

void AgentWorker::stopJob(quint64 tag, QString jobId) {
  if (!client_) {
    Q_EMIT commandDone(tag, false, QStringLiteral("agent %1 is not connected").arg(id_), static_cast<int>(ErrorCode::kUnavailable));
    return;
  }
  auto stopped = client_->stopJob(jobId.toStdString(), 0, kRequestTimeout);
  Q_EMIT commandDone(tag, stopped.ok(), stopped ? QString() : QString::fromStdString(stopped.error().message),
                     stopped ? 0 : static_cast<int>(stopped.error().code));
}

}  // namespace lockstep::app
