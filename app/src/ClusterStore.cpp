#include "ClusterStore.h"

#include <QLoggingCategory>
#include <algorithm>
#include <set>

#include "AgentWorker.h"
#include "HistoryRecorder.h"
#include "lockstep/client/elastic.h"
#include "lockstep/client/launch.h"
#include "lockstep/history/history.h"
#include "lockstep/protocol/validate.h"

Q_LOGGING_CATEGORY(lcStore, "lockstep.store")

namespace lockstep::app {

ClusterStore::ClusterStore(CurveKeyPair keys, HistoryRecorder* history, QObject* parent)
    : QObject(parent), keys_(std::move(keys)), history_(history) {
  registerMetaTypes();
  superviseTimer_.setInterval(1000);
  connect(&superviseTimer_, &QTimer::timeout, this, qOverload<>(&ClusterStore::supervise));
  superviseTimer_.start();
}

ClusterStore::~ClusterStore() {
  for (const auto& a : agents_) {
    QMetaObject::invokeMethod(a->worker, &AgentWorker::stop, Qt::BlockingQueuedConnection);
    a->thread->quit();
    a->thread->wait();
    delete a->worker;
    delete a->thread;
  }
}

void ClusterStore::addAgent(const AgentAddress& address, const std::string& publicKey) {
  const QString id = QString::fromStdString(address.text());
  if (findAgent(id)) return;
  auto entry = std::make_unique<AgentEntry>();
  entry->id = id;
  entry->address = address;
  entry->publicKey = publicKey;
  entry->thread = new QThread;
  entry->thread->setObjectName(QStringLiteral("agent ") + id);
  entry->worker = new AgentWorker(id, address, keys_, publicKey);
  entry->worker->moveToThread(entry->thread);
  connect(entry->worker, &AgentWorker::stateChanged, this, &ClusterStore::onState);
  connect(entry->worker, &AgentWorker::helloReceived, this, &ClusterStore::onHello);
  connect(entry->worker, &AgentWorker::jobsReceived, this, &ClusterStore::onJobs);
  connect(entry->worker, &AgentWorker::messagesReceived, this, &ClusterStore::onMessages);
  connect(entry->worker, &AgentWorker::jobStarted, this, &ClusterStore::onJobStarted);
  connect(entry->worker, &AgentWorker::commandDone, this, &ClusterStore::onCommandDone);
  if (history_) {
    // Straight from the worker's thread to the recorder's: recording never waits for the GUI.
    connect(entry->worker, &AgentWorker::helloReceived, history_, &HistoryRecorder::onHello);
    connect(entry->worker, &AgentWorker::jobsReceived, history_, &HistoryRecorder::onJobs);
    connect(entry->worker, &AgentWorker::messagesReceived, history_, &HistoryRecorder::onMessages);
  }
  entry->thread->start();
  QMetaObject::invokeMethod(entry->worker, &AgentWorker::start, Qt::QueuedConnection);
  agents_.push_back(std::move(entry));
  Q_EMIT agentsChanged();
}

void ClusterStore::removeAgent(const QString& id) {
  auto it = std::find_if(agents_.begin(), agents_.end(), [&](const auto& a) { return a->id == id; });
  if (it == agents_.end()) return;
  QMetaObject::invokeMethod((*it)->worker, &AgentWorker::stop, Qt::BlockingQueuedConnection);
  (*it)->thread->quit();
  (*it)->thread->wait();
  delete (*it)->worker;
  delete (*it)->thread;
  agents_.erase(it);
  Q_EMIT agentsChanged();
  Q_EMIT gpusChanged();
}

AgentEntry* ClusterStore::findAgent(const QString& id) {
  for (auto& a : agents_) {
    if (a->id == id) return a.get();
  }
  return nullptr;
}

const AgentEntry* ClusterStore::agent(const QString& id) const {
  return const_cast<ClusterStore*>(this)->findAgent(id);
}

AgentEntry* ClusterStore::agentOfNode(const std::string& node) {
  for (auto& a : agents_) {
    if (a->hello && a->hello->nodeName == node) return a.get();
  }
  return nullptr;
}

std::vector<GpuEntry> ClusterStore::gpus() const {
  std::vector<GpuEntry> out;
  for (const auto& a : agents_) {
    if (!a->hello) continue;
    for (const auto& g : a->hello->gpus) {
      GpuEntry e{a->id, a->hello->nodeName, g, std::nullopt};
      if (auto it = gpuSamples_.find({a->id, g.index}); it != gpuSamples_.end()) e.latest = it->second;
      out.push_back(std::move(e));
    }
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

kpi::Settings ClusterStore::trackerSettings(const JobSpec& spec) const {
  return history::liveTrackerSettings(history_ ? history_->path().toStdString() : std::string(), spec);
}

JobEntry& ClusterStore::jobEntry(const JobSpec& spec) {
  auto& slot = jobs_[spec.jobId];
  if (!slot) {
    slot = std::make_unique<JobEntry>();
    slot->id = spec.jobId;
    slot->spec = spec;
    slot->tracker = std::make_unique<kpi::JobTracker>(spec, trackerSettings(spec));
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
  job.state = combinedState(states);  // the same rule as the history's
  job.message = message;
}

void ClusterStore::onState(QString id, AgentState state, QString message) {
  AgentEntry* a = findAgent(id);
  if (!a) return;
  a->state = state;
  a->message = message;
  Q_EMIT agentsChanged();
}

void ClusterStore::onHello(QString id, HelloPtr hello) {
  AgentEntry* a = findAgent(id);
  if (!a) return;
  a->hello = *hello;
  Q_EMIT agentsChanged();
  Q_EMIT gpusChanged();
}

void ClusterStore::onJobs(QString id, JobList jobs) {
  AgentEntry* a = findAgent(id);
  if (!a) return;
  a->jobs = *jobs;
  bool changed = false;
  for (const auto& status : *jobs) {
    JobEntry& job = jobEntry(status.spec);
    // A restart replaces a job's parts: an older attempt's part (a lost node coming back) is history.
    if (status.spec.attempt < job.spec.attempt) continue;
    if (status.spec.attempt > job.spec.attempt) {
      job.spec = status.spec;
      job.parts.clear();
      changed = true;
    }
    auto& part = job.parts[id];
    changed |= part.state != status.state || part.ranks.size() != status.ranks.size() || part.message != status.message;
    part = status;
    updateJobState(job);
  }
  if (changed) Q_EMIT jobsChanged();
  supervise();
}

void ClusterStore::onMessages(QString id, MessageBatch messages) {
  std::set<std::string> touched;
  bool gpusTouched = false;
  for (const auto& m : *messages) {
    std::visit(
        [&](const auto& p) {
          using T = std::decay_t<decltype(p)>;
          if constexpr (std::is_same_v<T, GpuSample>) {
            gpuSamples_[{id, p.gpuIndex}] = p;
            gpusTouched = true;
          }
          const std::string& jobId = p.jobId;
          if (jobId.empty()) return;
          auto it = jobs_.find(jobId);
          if (it == jobs_.end()) return;  // a job this app does not know (its list comes first)
          it->second->tracker->add(m);
          touched.insert(jobId);
        },
        m.payload);
  }
  if (gpusTouched) Q_EMIT gpusChanged();
  for (const auto& jobId : touched) Q_EMIT jobDataChanged(QString::fromStdString(jobId));
  if (!touched.empty()) Q_EMIT jobsChanged();
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
    nodes.push_back({a->address.host, a->hello->nodeName, freeGpus(*a->hello, a->jobs)});
    counts.push_back(count);
  }
  if (nodes.empty()) return invalidArgument("choose at least one rank on a connected agent");
  // A restart is a later attempt of a job the store holds; anything else needs a new id.
  if (auto it = jobs_.find(spec.jobId); it != jobs_.end() && spec.attempt <= it->second->spec.attempt) {
    return invalidArgument("job id " + spec.jobId + " is taken: pick another");
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto placed, placeJob(nodes, counts, spec));
  LOCKSTEP_TRY(validateJobSpec(placed));
  return placed;
}

void ClusterStore::supervise() {
  for (const auto& id : std::vector<std::string>(supervised_.begin(), supervised_.end())) {
    if (auto it = jobs_.find(id); it != jobs_.end()) supervise(*it->second);
  }
}

void ClusterStore::supervise(JobEntry& job) {
  if (!supervised_.count(job.id) || restarting_.count(job.id)) return;
  // Agents of the job's nodes that are gone, and whether its parts all ended.
  std::vector<EndedPart> ends;
  std::set<QString> lostAgents;
  for (const auto& placement : job.spec.ranks) {
    AgentEntry* a = agentOfNode(placement.node);
    if (a && a->state != AgentState::kConnected && lostAgents.insert(a->id).second) {
      ends.push_back({placement.node, a->id.toStdString(), {}, true});
    }
  }
  bool allEnded = true;
  for (const auto& [agentId, part] : job.parts) {
    if (lostAgents.count(agentId)) continue;
    allEnded &= part.state != JobState::kRunning && part.state != JobState::kStarting;
    const AgentEntry* a = agent(agentId);
    ends.push_back({a && a->hello ? a->hello->nodeName : agentId.toStdString(), agentId.toStdString(), part.ranks});
  }
  // Only a failure starts it: an agent that reconnects after a network blip leaves a healthy job
  // alone (a lost node's peers fail at once, which is the failure that counts).
  if (job.state != JobState::kFailed) {
    failingSince_.erase(job.id);
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  auto since = failingSince_.try_emplace(job.id, now).first->second;
  if (!allEnded) {
    // The ranks left end by themselves on a lost peer (exit 3); after 10 s, stop the rest.
    if (now - since > std::chrono::seconds(10)) stopJob(job.id);
    return;
  }
  failingSince_.erase(job.id);
  const RestartPlan plan = planRestart(job.spec, ends);
  std::vector<std::pair<QString, std::uint32_t>> counts;
  for (const auto& [node, ranks] : plan.ranksPerNode) {
    if (AgentEntry* a = agentOfNode(node)) counts.emplace_back(a->id, ranks);
  }
  Result<JobSpec> placed = plan.refusal.empty() ? place(plan.next, counts) : Result<JobSpec>(invalidArgument(plan.refusal));
  if (!placed) {
    supervised_.erase(job.id);
    const QString message = QString::fromStdString(plan.lost + "; not restarted: " + placed.error().message);
    job.message = message;
    Q_EMIT restartRefused(QString::fromStdString(job.id), message);
    Q_EMIT jobsChanged();
    return;
  }
  restarting_.insert(job.id);
  job.spec = *placed;
  job.parts.clear();
  launch(*placed);
  Q_EMIT jobRestarted(QString::fromStdString(job.id),
                      tr("%1; restart %2 of %3 with %4 ranks from the last checkpoint")
                          .arg(QString::fromStdString(plan.lost))
                          .arg(placed->attempt)
                          .arg(placed->maxRestarts)
                          .arg(placed->worldSize));
}

void ClusterStore::launch(const JobSpec& placed) {
  if (placed.maxRestarts > 0) supervised_.insert(placed.jobId);
  std::vector<QString> order;  // rank 0's agent first
  for (const auto& p : placed.ranks) {
    AgentEntry* a = agentOfNode(p.node);
    if (a && std::find(order.begin(), order.end(), a->id) == order.end()) order.push_back(a->id);
  }
  if (order.empty()) {
    Q_EMIT launchFinished(QString::fromStdString(placed.jobId), false, QStringLiteral("no connected agent runs its ranks"));
    return;
  }
  Launch launch;
  launch.spec = placed;
  launch.pending.assign(order.begin() + 1, order.end());
  launch.outstanding = 1;
  const quint64 tag = nextTag_++;
  launchOfTag_[tag] = placed.jobId;
  launches_[placed.jobId] = std::move(launch);
  QMetaObject::invokeMethod(findAgent(order.front())->worker, "startJob", Qt::QueuedConnection, Q_ARG(quint64, tag),
                            Q_ARG(lockstep::JobSpec, placed), Q_ARG(QString, QString()));
}

void ClusterStore::onJobStarted(quint64 tag, QString id, quint32 port, QString storeSecret) {
  auto it = launchOfTag_.find(tag);
  if (it == launchOfTag_.end()) return;
  auto l = launches_.find(it->second);
  if (l == launches_.end()) return;
  Launch& launch = l->second;
  launch.started.push_back(id);
  if (launch.started.size() == 1 && !launch.pending.empty()) {
    // Rank 0's agent hosts the store: the other parts start with its port.
    launch.spec.rendezvousPort = port;
    if (launch.spec.rendezvousHost.empty()) launch.spec.rendezvousHost = findAgent(id)->address.host;
    for (const auto& other : launch.pending) {
      const quint64 next = nextTag_++;
      launchOfTag_[next] = launch.spec.jobId;
      ++launch.outstanding;
      QMetaObject::invokeMethod(findAgent(other)->worker, "startJob", Qt::QueuedConnection, Q_ARG(quint64, next),
                                Q_ARG(lockstep::JobSpec, launch.spec), Q_ARG(QString, storeSecret));
    }
    launch.pending.clear();
  }
}

void ClusterStore::onCommandDone(quint64 tag, bool ok, QString message) {
  if (auto it = launchOfTag_.find(tag); it != launchOfTag_.end()) {
    const std::string jobId = it->second;
    launchOfTag_.erase(it);
    auto l = launches_.find(jobId);
    if (l == launches_.end()) return;
    Launch& launch = l->second;
    --launch.outstanding;
    if (!ok && !launch.failed) {
      launch.failed = true;
      restarting_.erase(jobId);
      for (const auto& id : launch.started) {
        QMetaObject::invokeMethod(findAgent(id)->worker, "stopJob", Qt::QueuedConnection, Q_ARG(quint64, 0),
                                  Q_ARG(QString, QString::fromStdString(jobId)));
      }
      Q_EMIT launchFinished(QString::fromStdString(jobId), false, message);
    }
    if (launch.outstanding == 0) {
      restarting_.erase(jobId);
      if (!launch.failed) Q_EMIT launchFinished(QString::fromStdString(jobId), true, {});
      launches_.erase(l);
    }
    return;
  }
  if (auto it = stopOfTag_.find(tag); it != stopOfTag_.end()) {
    const std::string jobId = it->second;
    stopOfTag_.erase(it);
    auto s = stops_.find(jobId);
    if (s == stops_.end()) return;
    if (!ok && s->second.error.isEmpty()) s->second.error = message;
    if (--s->second.outstanding == 0) {
      Q_EMIT stopFinished(QString::fromStdString(jobId), s->second.error.isEmpty(), s->second.error);
      stops_.erase(s);
    }
  }
}

void ClusterStore::stopJob(const std::string& jobId) {
  const JobEntry* job = this->job(jobId);
  if (!job) return;
  Stop& stop = stops_[jobId];
  stop.jobId = jobId;
  for (const auto& [agentId, part] : job->parts) {
    if (part.state != JobState::kRunning && part.state != JobState::kStarting) continue;
    AgentEntry* a = findAgent(agentId);
    if (!a) continue;
    const quint64 tag = nextTag_++;
    stopOfTag_[tag] = jobId;
    ++stop.outstanding;
    QMetaObject::invokeMethod(a->worker, "stopJob", Qt::QueuedConnection, Q_ARG(quint64, tag),
                              Q_ARG(QString, QString::fromStdString(jobId)));
  }
  if (stop.outstanding == 0) {
    stops_.erase(jobId);
    Q_EMIT stopFinished(QString::fromStdString(jobId), true, {});
  }
}

}  // namespace lockstep::app
