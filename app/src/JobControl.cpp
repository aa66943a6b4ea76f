#include "JobControl.h"

#include <chrono>
#include <set>

namespace lockstep::app {

JobControl::JobControl(ClusterStore& store, QObject* parent) : QObject(parent), store_(store) {
  connect(&store_, &ClusterStore::jobStarted, this, &JobControl::onJobStarted);
  connect(&store_, &ClusterStore::commandDone, this, &JobControl::onCommandDone);
  connect(&store_, &ClusterStore::jobsChanged, this, &JobControl::follow);
  connect(&store_, &ClusterStore::agentsChanged, this, &JobControl::follow);
  connect(&store_, &ClusterStore::agentChanged, this, &JobControl::follow);
}

void JobControl::launch(const JobSpec& placed) {
  launches_.erase(placed.jobId);
  launches_.emplace(placed.jobId, Launcher(placed));
  pump(placed.jobId);
}

void JobControl::pump(const std::string& jobId) {
  auto it = launches_.find(jobId);
  if (it == launches_.end()) return;
  Launcher& launcher = it->second;
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
  run->second.started(node, StartJobReply{jobId, port, storeSecret.toStdString()});
  pump(jobId);
}

void JobControl::onCommandDone(quint64 tag, bool ok, QString message, int errorCode) {
  if (auto it = startTags_.find(tag); it != startTags_.end()) {
    // A successful start was answered by jobStarted; this is a failure.
    const auto [jobId, node] = it->second;
    startTags_.erase(it);
    auto run = launches_.find(jobId);
    if (ok || run == launches_.end()) return;
    run->second.failed(node, Error{static_cast<ErrorCode>(errorCode), message.toStdString()});
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
  const Launcher launcher = std::move(it->second);
  launches_.erase(it);
  if (launcher.ok()) followed_.insert_or_assign(jobId, Followed{launcher.spec().attempt});
  Q_EMIT launchFinished(QString::fromStdString(jobId), launcher.ok(),
                        launcher.ok() ? QString() : QString::fromStdString(launcher.error()->message));
}

void JobControl::stopJob(const std::string& jobId) {
  const JobEntry* job = store_.job(jobId);
  if (!job) return;
  Stop& pending = stops_[jobId];
  // The parts that run, and the supervising agent while it decides how the job ends, though its
  // own part ended or a restart left its node out.
  std::set<QString> asked;
  for (const auto& [agentId, part] : job->parts) {
    if (!jobStateEnded(part.state)) asked.insert(agentId);
  }
  if (!job->supervisor.isEmpty() && decidesOutcome(job->supervision)) asked.insert(job->supervisor);
  for (const QString& agentId : asked) {
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

void JobControl::follow() {
  failOrphanedStarts();
  // Signals go out after the loop: their slots (and setJobMessage's jobsChanged) re-enter this.
  std::vector<std::pair<QString, QString>> restarted, refused;
  for (auto it = followed_.begin(); it != followed_.end();) {
    const JobEntry* job = store_.job(it->first);
    if (!job) {
      it = followed_.erase(it);
      continue;
    }
    const QString id = QString::fromStdString(it->first);
    const JobSpec& spec = job->spec;
    if (spec.attempt > it->second.attempt) {
      it->second.attempt = spec.attempt;
      restarted.emplace_back(id, tr("%1; restart %2 of %3 with %4 ranks from the last checkpoint")
                                     .arg(QString::fromStdString(spec.restartReason))
                                     .arg(spec.attempt)
                                     .arg(spec.maxRestarts)
                                     .arg(spec.worldSize));
    }
    const Supervision& supervision = job->supervision;
    const bool supervised = supervision.state != SupervisionState::kNone;
    if (!job->over) {
      ++it;
      continue;
    }
    // A job that may restart and was not restarted says why; any other end is the job's own.
    if (supervised && spec.maxRestarts > 0 && supervision.outcome == JobState::kFailed) {
      refused.emplace_back(id, QString::fromStdString(supervision.message));
    }
    it = followed_.erase(it);
  }
  for (const auto& [id, message] : restarted) Q_EMIT jobRestarted(id, message);
  for (const auto& [id, message] : refused) {
    store_.setJobMessage(id.toStdString(), message);
    Q_EMIT restartRefused(id, message);
  }
}

}  // namespace lockstep::app
