#include "JobControl.h"

#include <chrono>
#include <set>

namespace lockstep::app {

JobControl::JobControl(ClusterStore& store, QObject* parent) : QObject(parent), store_(store) {
  connect(&store_, &ClusterStore::jobStarted, this, &JobControl::onJobStarted);
  connect(&store_, &ClusterStore::commandDone, this, &JobControl::onCommandDone);
  // Checked on every job list and agent change, and once a second (a grace period runs out).
  connect(&store_, &ClusterStore::jobsChanged, this, &JobControl::supervise);
  connect(&store_, &ClusterStore::agentsChanged, this, &JobControl::supervise);
  superviseTimer_.setInterval(1000);
  connect(&superviseTimer_, &QTimer::timeout, this, &JobControl::supervise);
  superviseTimer_.start();
}

void JobControl::launch(const JobSpec& placed) {
  launches_.erase(placed.jobId);
  launches_.emplace(placed.jobId, Run{Launcher(placed), false, {}});
  pump(placed.jobId);
}

void JobControl::pump(const std::string& jobId) {
  auto it = launches_.find(jobId);
  if (it == launches_.end()) return;
  Launcher& launcher = it->second.launcher;
  // Starts that cannot be sent fail here, after the loop: nothing below re-enters this launch.
  std::vector<std::string> unsent;
  for (const auto& start : launcher.next()) {
    const AgentEntry* agent = store_.agentOfNode(start.node);
    const quint64 tag = nextTag_++;
    if (agent && store_.startOn(agent->id, tag, start.spec, QString::fromStdString(start.storeSecret))) {
      startTags_[tag] = {jobId, start.node};
    } else {
      unsent.push_back(start.node);
    }
  }
  for (const auto& node : unsent) launcher.failed(node, Error{ErrorCode::kUnavailable, "no agent of node " + node + " is connected"});
  for (const auto& node : launcher.toStop()) {
    if (const AgentEntry* agent = store_.agentOfNode(node)) store_.stopOn(agent->id, 0, jobId);
  }
  if (launcher.finished()) launchEnded(jobId);
}

void JobControl::failOrphanedStarts() {
  // A start queued to an agent removed meanwhile gets no answer: it failed.
  std::vector<quint64> orphaned;
  for (const auto& [tag, jobAndNode] : startTags_) {
    if (!store_.agentOfNode(jobAndNode.second)) orphaned.push_back(tag);
  }
  for (quint64 tag : orphaned) {
    onCommandDone(tag, false, QStringLiteral("the agent was removed"), static_cast<int>(ErrorCode::kUnavailable));
  }
}

void JobControl::onJobStarted(quint64 tag, QString, quint32 port, QString storeSecret) {
  auto it = startTags_.find(tag);
  if (it == startTags_.end()) return;
  const auto [jobId, node] = it->second;
  startTags_.erase(it);
  auto run = launches_.find(jobId);
  if (run == launches_.end()) return;
  run->second.launcher.started(node, StartJobReply{jobId, port, storeSecret.toStdString()});
  pump(jobId);
}

void JobControl::onCommandDone(quint64 tag, bool ok, QString message, int errorCode) {
  if (auto it = startTags_.find(tag); it != startTags_.end()) {
    // A successful start was answered by jobStarted; this is a failure.
    const auto [jobId, node] = it->second;
    startTags_.erase(it);
    auto run = launches_.find(jobId);
    if (ok || run == launches_.end()) return;
    run->second.launcher.failed(node, Error{static_cast<ErrorCode>(errorCode), message.toStdString()});
    pump(jobId);
    return;
  }
  auto it = stopTags_.find(tag);
  if (it == stopTags_.end()) return;
  const std::string jobId = it->second;
  stopTags_.erase(it);
  auto s = stops_.find(jobId);
  if (s == stops_.end()) return;
  if (!ok && s->second.error.isEmpty()) s->second.error = message;
  if (--s->second.outstanding == 0) {
    Q_EMIT stopFinished(QString::fromStdString(jobId), s->second.error.isEmpty(), s->second.error);
    stops_.erase(s);
  }
}

void JobControl::launchEnded(const std::string& jobId) {
  auto it = launches_.find(jobId);
  if (it == launches_.end()) return;
  Run run = std::move(it->second);
  launches_.erase(it);
  const QString id = QString::fromStdString(jobId);
  const Launcher& launcher = run.launcher;
  const QString error = launcher.ok() ? QString() : QString::fromStdString(launcher.error()->message);
  if (run.restart) {
    auto s = supervisors_.find(jobId);
    if (s == supervisors_.end()) return;
    if (launcher.ok()) {
      s->second.restarted(launcher.spec());
      Q_EMIT jobRestarted(id, run.restartMessage);
    } else {
      act(jobId, s->second.restartFailed(error.toStdString()));
    }
    return;
  }
  if (launcher.ok()) supervisors_.insert_or_assign(jobId, Supervisor(launcher.spec()));
  Q_EMIT launchFinished(id, launcher.ok(), error);
}

void JobControl::stopJob(const std::string& jobId) { stop(jobId, true); }

void JobControl::stop(const std::string& jobId, bool answer) {
  const JobEntry* job = store_.job(jobId);
  if (!job) return;
  if (!answer) {
    // The supervisor's own stop: nobody waits for an answer (a lost agent's part may refuse it).
    for (const auto& [agentId, part] : job->parts) {
      if (!jobStateEnded(part.state)) store_.stopOn(agentId, 0, jobId);
    }
    return;
  }
  Stop& pending = stops_[jobId];
  for (const auto& [agentId, part] : job->parts) {
    if (jobStateEnded(part.state)) continue;
    const quint64 tag = nextTag_++;
    if (!store_.stopOn(agentId, tag, jobId)) continue;
    stopTags_[tag] = jobId;
    ++pending.outstanding;
  }
  if (pending.outstanding == 0) {
    stops_.erase(jobId);
    Q_EMIT stopFinished(QString::fromStdString(jobId), true, {});
  }
}

std::vector<EndedPart> JobControl::partsOf(const JobEntry& job) const {
  // Agents of the job's nodes that are gone are lost parts; the others are as they reported.
  std::vector<EndedPart> parts;
  std::set<QString> lost;
  for (const auto& placement : job.spec.ranks) {
    const AgentEntry* a = store_.agentOfNode(placement.node);
    if (a && a->state != AgentState::kConnected && lost.insert(a->id).second) {
      parts.push_back({placement.node, a->id.toStdString(), {}, true});
    }
  }
  for (const auto& [agentId, part] : job.parts) {
    if (lost.count(agentId)) continue;
    const AgentEntry* a = store_.agent(agentId);
    parts.push_back({a && a->hello ? a->hello->nodeName : agentId.toStdString(), agentId.toStdString(), part.ranks, false,
                     part.state, part.spec.attempt});
  }
  return parts;
}

void JobControl::supervise() {
  failOrphanedStarts();
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::string> ids;
  for (const auto& [id, supervisor] : supervisors_) ids.push_back(id);
  for (const auto& id : ids) {
    const JobEntry* job = store_.job(id);
    auto s = supervisors_.find(id);
    if (!job || s == supervisors_.end() || job->spec.attempt != s->second.spec().attempt) continue;
    act(id, s->second.observe(partsOf(*job), now));
  }
}

void JobControl::act(const std::string& jobId, Supervisor::Action action) {
  using Kind = Supervisor::Action::Kind;
  const QString id = QString::fromStdString(jobId);
  switch (action.kind) {
    case Kind::kWait: return;
    case Kind::kStop: stop(jobId, false); return;
    case Kind::kRestart: {
      std::vector<std::pair<QString, std::uint32_t>> counts;
      for (const auto& [node, ranks] : action.plan.ranksPerNode) {
        if (const AgentEntry* a = store_.agentOfNode(node)) counts.emplace_back(a->id, ranks);
      }
      auto placed = store_.place(action.plan.next, counts);
      if (!placed) {
        act(jobId, supervisors_.at(jobId).restartFailed(placed.error().message));
        return;
      }
      store_.beginAttempt(*placed);
      const QString message = tr("%1; restart %2 of %3 with %4 ranks from the last checkpoint")
                                  .arg(QString::fromStdString(action.message))
                                  .arg(placed->attempt)
                                  .arg(placed->maxRestarts)
                                  .arg(placed->worldSize);
      launches_.erase(jobId);
      launches_.emplace(jobId, Run{Launcher(*placed), true, message});
      pump(jobId);
      return;
    }
    case Kind::kEnd: {
      const Supervisor supervisor = supervisors_.at(jobId);
      supervisors_.erase(jobId);
      // A job that may restart and is not restarted says why; any other end is the job's own.
      if (supervisor.spec().maxRestarts > 0 && action.state == JobState::kFailed) {
        store_.setJobMessage(jobId, QString::fromStdString(action.message));
        Q_EMIT restartRefused(id, QString::fromStdString(action.message));
      }
      return;
    }
  }
}

}  // namespace lockstep::app
