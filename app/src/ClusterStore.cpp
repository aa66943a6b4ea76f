#include "ClusterStore.h"

#include "lockstep/kpi/stall.h"

#include <QLoggingCategory>
#include <QTimer>
#include <algorithm>
#include <set>

#include "AgentWorker.h"
#include "HistoryRecorder.h"
#include "lockstep/client/launch.h"
#include "lockstep/common/clock.h"
#include "lockstep/history/history.h"
#include "lockstep/protocol/validate.h"

Q_LOGGING_CATEGORY(lcStore, "lockstep.store")

namespace lockstep::app {

namespace {

// Stops the worker in its thread, then the thread; the worker is deleted once its thread is done.
void closeAgent(AgentEntry& a) {
  QMetaObject::invokeMethod(a.worker.get(), &AgentWorker::stop, Qt::BlockingQueuedConnection);
  a.thread->quit();
  a.thread->wait();
  a.worker.reset();
  a.thread.reset();
}

}  // namespace

ClusterStore::ClusterStore(CurveKeyPair keys, HistoryRecorder* history, QObject* parent, FanInRule fanIn)
    : QObject(parent),
      keys_(std::move(keys)),
      fanIn_(std::make_shared<FanInBook>(fanIn)),
      history_(history),
      alerts_(std::make_unique<AlertLog>()),
      ingest_(std::make_unique<Ingest>(history ? history->path() : QString(), fanIn_)) {
  registerMetaTypes();
  connect(ingest_.get(), &Ingest::published, this, &ClusterStore::onPublished);
  connect(ingest_.get(), &Ingest::nodesPublished, this, &ClusterStore::onNodes);
  connect(ingest_.get(), &Ingest::alertEvents, alerts_.get(), &AlertLog::add);
  ingest_->start();
}

ClusterStore::~ClusterStore() {
  for (const auto& a : agents_) closeAgent(*a);
}

void ClusterStore::addSlurmCluster(SlurmClusterEntry cluster) {
  for (const auto& c : slurmClusters_) {
    if (c.login == cluster.login) return;
  }
  slurmClusters_.push_back(std::move(cluster));
  Q_EMIT agentsChanged();
}

void ClusterStore::addAgent(const AgentAddress& address, const std::string& publicKey) {
  const QString id = QString::fromStdString(address.text());
  if (findAgent(id)) return;
  auto entry = std::make_unique<AgentEntry>();
  entry->id = id;
  entry->address = address;
  entry->publicKey = publicKey;
  entry->thread = std::make_unique<QThread>();
  entry->thread->setObjectName(QStringLiteral("agent ") + id);
  entry->worker = std::make_unique<AgentWorker>(id, address, keys_, publicKey, fanIn_);
  entry->worker->moveToThread(entry->thread.get());
  AgentWorker* worker = entry->worker.get();
  connect(worker, &AgentWorker::stateChanged, this, &ClusterStore::onState);
  connect(worker, &AgentWorker::helloReceived, this, &ClusterStore::onHello);
  connect(worker, &AgentWorker::jobsReceived, this, &ClusterStore::onJobs);
  // Messages skip the GUI thread: the ingest thread folds them into KPIs (its job lists first).
  connect(worker, &AgentWorker::jobsReceived, ingest_.get(), &Ingest::onJobs);
  connect(worker, &AgentWorker::messagesReceived, ingest_.get(), &Ingest::onMessages);
  connect(worker, &AgentWorker::frameReceived, ingest_.get(), &Ingest::onFrame);
  connect(worker, &AgentWorker::clockMeasured, ingest_.get(), &Ingest::onClock);
  connect(worker, &AgentWorker::jobStarted, this, &ClusterStore::jobStarted);
  connect(worker, &AgentWorker::commandDone, this, &ClusterStore::commandDone);
  if (history_) {
    // Straight from the worker's thread to the recorder's: recording never waits for the GUI.
    connect(worker, &AgentWorker::helloReceived, history_, &HistoryRecorder::onHello);
    connect(worker, &AgentWorker::jobsReceived, history_, &HistoryRecorder::onJobs);
    connect(worker, &AgentWorker::messagesReceived, history_, &HistoryRecorder::onMessages);
    connect(worker, &AgentWorker::clockMeasured, history_, &HistoryRecorder::onClock);
  }
  entry->thread->start();
  QMetaObject::invokeMethod(worker, &AgentWorker::start, Qt::QueuedConnection);
  byId_.insert(id, entry.get());
  agents_.push_back(std::move(entry));
  placeAgent(agents_.back().get());
  ++gpuLayoutSerial_;
  Q_EMIT agentsChanged();
}

namespace {

std::string sortName(const AgentEntry& e) { return e.hello ? e.hello->nodeName : e.id.toStdString(); }

}  // namespace

void ClusterStore::placeAgent(AgentEntry* agent) {
  auto it = std::find_if(agents_.begin(), agents_.end(), [&](const auto& a) { return a.get() == agent; });
  std::unique_ptr<AgentEntry> moved = std::move(*it);
  agents_.erase(it);
  const std::string name = sortName(*moved);
  const auto at = std::upper_bound(agents_.begin(), agents_.end(), name,
                                   [](const std::string& n, const auto& a) { return naturalLess(n, sortName(*a)); });
  agents_.insert(at, std::move(moved));
}

void ClusterStore::removeAgent(const QString& id) {
  auto it = std::find_if(agents_.begin(), agents_.end(), [&](const auto& a) { return a->id == id; });
  if (it == agents_.end()) return;
  closeAgent(**it);
  byId_.remove(id);
  if (const auto node = (*it)->hello ? byNode_.find((*it)->hello->nodeName) : byNode_.end(); node != byNode_.end() && node->second == it->get()) {
    byNode_.erase(node);
  }
  agents_.erase(it);
  ++gpuLayoutSerial_;
  Q_EMIT agentsChanged();
  Q_EMIT gpusChanged();
}

AgentEntry* ClusterStore::findAgent(const QString& id) { return byId_.value(id, nullptr); }

int ClusterStore::agentRow(const QString& id) const {
  const AgentEntry* a = agent(id);
  const auto it = std::find_if(agents_.begin(), agents_.end(), [&](const auto& e) { return e.get() == a; });
  return a && it != agents_.end() ? static_cast<int>(it - agents_.begin()) : -1;
}

const AgentEntry* ClusterStore::agent(const QString& id) const {
  return const_cast<ClusterStore*>(this)->findAgent(id);
}

const AgentEntry* ClusterStore::agentOfNode(const std::string& node) const {
  const auto it = byNode_.find(node);
  return it == byNode_.end() ? nullptr : it->second;
}

bool ClusterStore::startOn(const QString& agentId, quint64 tag, const JobSpec& spec, const QString& storeSecret) {
  AgentEntry* a = findAgent(agentId);
  if (!a) return false;
  AgentWorker* worker = a->worker.get();
  QMetaObject::invokeMethod(worker, [worker, tag, spec, storeSecret] { worker->startJob(tag, spec, storeSecret); },
                            Qt::QueuedConnection);
  return true;
}

bool ClusterStore::stopOn(const QString& agentId, quint64 tag, const std::string& jobId) {
  AgentEntry* a = findAgent(agentId);
  if (!a) return false;
  AgentWorker* worker = a->worker.get();
  const QString id = QString::fromStdString(jobId);
  QMetaObject::invokeMethod(worker, [worker, tag, id] { worker->stopJob(tag, id); }, Qt::QueuedConnection);
  return true;
}

void ClusterStore::setJobMessage(const std::string& jobId, const QString& message) {
  auto it = jobs_.find(jobId);
  if (it == jobs_.end()) return;
  it->second->message = message;
  Q_EMIT jobsChanged();
}

std::vector<GpuEntry> ClusterStore::gpus() const {
  std::vector<GpuEntry> out;
  for (const auto& a : agents_) {
    if (!a->hello) continue;
    for (const auto& g : a->hello->gpus) out.push_back({a->id, a->hello->nodeName, g, latestGpu(a->hello->nodeName, g.index)});
  }
  return out;
}

std::optional<GpuSample> ClusterStore::latestGpu(const std::string& node, std::uint32_t gpuIndex) const {
  const auto it = nodes_.find(node);
  if (it == nodes_.end()) return std::nullopt;
  std::optional<GpuSample> latest;
  for (const auto& sample : it->second.figures.gpus) {
    if (sample.gpuIndex == gpuIndex) latest = sample;
  }
  return latest;
}

std::vector<std::string> ClusterStore::nodesChangedSince(std::uint64_t serial) const {
  std::vector<std::string> out;
  for (const auto& [name, node] : nodes_) {
    if (node.serial > serial) out.push_back(name);
  }
  return out;
}

std::vector<const JobEntry*> ClusterStore::jobs() const {
  std::vector<const JobEntry*> out;
  for (const auto& id : jobOrder_) out.push_back(jobs_.at(id).get());
  return out;
}

const JobEntry* ClusterStore::job(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

bool ClusterStore::knowsSpec(const JobSpec& stub) const {
  const auto it = jobs_.find(stub.jobId);
  return it != jobs_.end() && it->second->spec.attempt >= stub.attempt;
}

JobEntry& ClusterStore::jobEntry(const JobSpec& spec) {
  auto& slot = jobs_[spec.jobId];
  if (!slot) {
    slot = std::make_unique<JobEntry>();
    slot->id = spec.jobId;
    slot->setSpec(spec);
    slot->live = ingest_->job(spec);
    jobOrder_.push_back(spec.jobId);
  }
  return *slot;
}

void ClusterStore::updateJobState(JobEntry& job) {
  std::vector<JobState> states;
  QString message;
  job.startedUnixUs = 0;
  for (const auto& [agent, part] : job.parts) {
    states.push_back(part.state);
    if (!part.message.empty() && message.isEmpty()) message = QString::fromStdString(part.message);
    if (job.startedUnixUs == 0 || (part.startedUnixUs != 0 && part.startedUnixUs < job.startedUnixUs)) {
      job.startedUnixUs = part.startedUnixUs;
    }
  }
  job.state = jobOutcome(job.supervision, states);  // as lockstepctl's
  job.over = jobOver(job.supervision, states);
  job.message = message;
}

void ClusterStore::onState(QString id, AgentState state, QString message) {
  AgentEntry* a = findAgent(id);
  if (!a) return;
  a->state = state;
  a->message = message;
  // What a supervising agent that stopped answering said is not known to hold any more.
  bool forgotten = false;
  for (auto& [jobId, job] : jobs_) {
    if (state == AgentState::kConnected || job->supervisor != id) continue;
    job->supervision = {};
    job->supervisor.clear();
    updateJobState(*job);
    forgotten = true;
  }
  if (forgotten) Q_EMIT jobsChanged();
  Q_EMIT agentChanged(id);
}

void ClusterStore::onHello(QString id, HelloPtr hello) {
  AgentEntry* a = findAgent(id);
  if (!a) return;
  if (const auto was = a->hello ? byNode_.find(a->hello->nodeName) : byNode_.end(); was != byNode_.end() && was->second == a) byNode_.erase(was);
  a->hello = *hello;
  byNode_[hello->nodeName] = a;
  // The agents (and so their GPUs) in natural order of their nodes, as every list of nodes.
  placeAgent(a);
  ++gpuLayoutSerial_;
  Q_EMIT agentsChanged();
  Q_EMIT gpusChanged();
}

void ClusterStore::onJobs(QString id, JobList jobs) {
  AgentEntry* a = findAgent(id);
  if (!a) return;
  a->jobs = *jobs;
  bool changed = false;
  for (const auto& status : *jobs) {
    // A status without its spec is of a job at an attempt this store took in full already.
    if (status.specOmitted && !knowsSpec(status.spec)) continue;
    JobEntry& job = jobEntry(status.spec);
    // The supervisor's word over its standby's while both report (the standby only mirrors it).
    const bool standby = status.supervision.state == SupervisionState::kStandby;
    const bool otherSupervises = !job.supervisor.isEmpty() && job.supervisor != id &&
                                 job.supervision.state != SupervisionState::kStandby;
    if (status.supervision.state != SupervisionState::kNone && !(standby && otherSupervises)) {
      changed |= status.supervision != job.supervision;
      job.supervision = status.supervision;
      job.supervisor = id;
    } else if (job.supervisor == id) {  // that agent no longer supervises it (it restarted, say)
      job.supervision = {};
      job.supervisor.clear();
      changed = true;
    }
    // A restart replaces a job's parts: an older attempt's part (a lost node coming back) is history,
    // but its agent may still supervise the job (the restart left its node out) and judge it.
    if (status.spec.attempt < job.spec.attempt) {
      updateJobState(job);
      continue;
    }
    if (status.spec.attempt > job.spec.attempt) {
      job.setSpec(status.spec);
      job.parts.clear();
      changed = true;
    }
    auto& part = job.parts[id];
    changed |= part.state != status.state || part.ranks.size() != status.ranks.size() || part.message != status.message ||
               part.stall != status.stall || part.progress != status.progress;
    part = status;
    updateJobState(job);
  }
  if (changed) Q_EMIT jobsChanged();
}

std::optional<Stall> JobEntry::stall() const {
  if (jobStateEnded(state)) return std::nullopt;
  std::vector<const JobStatus*> all;
  for (const auto& [agent, part] : parts) all.push_back(&part);
  return kpi::jobStall(all);
}

void JobEntry::setSpec(JobSpec s) {
  spec = std::move(s);
  nodes.clear();
  std::set<std::string> seen;
  for (const auto& placement : spec.ranks) {
    if (seen.insert(placement.node).second) nodes.push_back(placement.node);
  }
}

bool JobEntry::unjudged() const {
  bool any = false;
  for (const auto& [agent, part] : parts) {
    for (const auto& p : part.progress) {
      if (p.reportsSteps) return false;
      any = true;
    }
  }
  return any && spec.isCommand() && !jobStateEnded(state);
}

void ClusterStore::onMessages(QString id, MessageBatch messages) {
  QMetaObject::invokeMethod(ingest_.get(), [ingest = ingest_.get(), id, messages] { ingest->onMessages(id, messages); },
                            Qt::QueuedConnection);
}

void ClusterStore::onPublished(QStringList jobIds) {
  for (const auto& jobId : jobIds) Q_EMIT jobDataChanged(jobId);
  Q_EMIT jobsChanged();
}

void ClusterStore::onNodes(NodeFigures nodes) {
  ++nodesSerial_;
  for (const auto& [name, figures] : *nodes) nodes_[name] = {figures, nodesSerial_};
  Q_EMIT gpusChanged();
  // The agents' view (the Network column) at most once a second, and always with the newest.
  if (networkPending_) return;
  const std::int64_t now = unixMicrosNow();
  const std::int64_t wait = std::max<std::int64_t>(0, networkShownUs_ + 1'000'000 - now);
  networkPending_ = true;
  QTimer::singleShot(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::microseconds(wait)), this, [this] {
    networkPending_ = false;
    networkShownUs_ = unixMicrosNow();
    Q_EMIT agentsChanged();
  });
}

const kpi::NodeKpis* ClusterStore::nodeFigures(const QString& agentId) const {
  const AgentEntry* a = agent(agentId);
  if (!a || !a->hello) return nullptr;
  const auto it = nodes_.find(a->hello->nodeName);
  return it == nodes_.end() ? nullptr : &it->second.figures;
}

std::vector<kpi::NetRate> ClusterStore::network(const QString& agentId) const {
  const kpi::NodeKpis* node = nodeFigures(agentId);
  return node ? node->interfaces : std::vector<kpi::NetRate>{};
}

namespace {

std::vector<std::string> nodesOf(const JobSpec& spec) {
  JobEntry job;
  job.setSpec(spec);
  return std::move(job.nodes);
}


}  // namespace

std::vector<std::pair<std::string, kpi::NetRate>> ClusterStore::networkOf(const JobSpec& spec) const {
  return networkOf(nodesOf(spec));
}

std::vector<std::pair<std::string, kpi::NetRate>> ClusterStore::networkOf(const std::vector<std::string>& nodes) const {
  std::vector<std::pair<std::string, kpi::NetRate>> out;
  for (const auto& node : nodes) {
    const AgentEntry* a = agentOfNode(node);
    const auto rates = a ? network(a->id) : std::vector<kpi::NetRate>{};
    if (!rates.empty()) out.emplace_back(node, rates.front());
  }
  // In natural order: node2 before node10.
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return naturalLess(x.first, y.first); });
  return out;
}

std::optional<report::BandwidthReference> ClusterStore::linkOf(const JobSpec& spec) const { return linkOf(nodesOf(spec)); }

std::optional<report::BandwidthReference> ClusterStore::linkOf(const std::vector<std::string>& nodes) const {
  if (nodes.size() < 2) return std::nullopt;
  std::optional<report::BandwidthReference> slowest;
  std::string slowestNode;
  for (const auto& node : nodes) {
    const AgentEntry* a = agentOfNode(node);
    std::uint64_t fastest = 0;
    for (const auto& rate : a ? network(a->id) : std::vector<kpi::NetRate>{}) fastest = std::max(fastest, rate.linkBitsPerSecond.value_or(0));
    if (fastest == 0) return std::nullopt;
    const double bytes = static_cast<double>(fastest) / 8;
    // Of equally slow links, the first node's in natural order.
    const bool tie = slowest && bytes == slowest->bytesPerSecond && naturalLess(node, slowestNode);
    if (!slowest || bytes < slowest->bytesPerSecond || tie) {
      slowestNode = node;
      slowest = report::BandwidthReference{bytes, "the " + kpi::formatBitsPerSecond(static_cast<double>(fastest)) + " link of " + node};
    }
  }
  return slowest;
}

Result<void> ClusterStore::idFree(const JobSpec& spec) const {
  // A restart is a later attempt of a job the store holds; anything else needs a new id.
  if (auto it = jobs_.find(spec.jobId); it != jobs_.end() && spec.attempt <= it->second->spec.attempt) {
    return invalidArgument("job id " + spec.jobId + " is taken: pick another");
  }
  if (spec.attempt > 0 || !history_) return {};
  return history::checkNewJobId(history_->path().toStdString(), spec.jobId, "the History window's Delete…");
}

Result<JobSpec> ClusterStore::place(const JobSpec& spec, const std::vector<std::pair<QString, std::uint32_t>>& ranks) const {
  std::vector<PlacementNode> nodes;
  std::vector<std::uint32_t> counts;
  for (const auto& [id, count] : ranks) {
    if (count == 0) continue;
    const AgentEntry* a = agent(id);
    if (!a || !a->hello || a->state != AgentState::kConnected) {
      return Error{ErrorCode::kUnavailable, "agent " + id.toStdString() + " is not connected"};
    }
    nodes.push_back({a->address, a->publicKey, a->hello->nodeName, freeGpus(*a->hello, a->jobs)});
    counts.push_back(count);
  }
  if (nodes.empty()) return invalidArgument("choose at least one rank on a connected agent");
  LOCKSTEP_TRY(idFree(spec));
  LOCKSTEP_ASSIGN_OR_RETURN(auto placed, placeJob(nodes, counts, spec));
  LOCKSTEP_TRY(validateJobSpec(placed));
  return placed;
}

}  // namespace lockstep::app
