#include "SlurmLauncher.h"

#include <algorithm>
#include <chrono>

#include "lockstep/client/launch.h"
#include "lockstep/common/files.h"

namespace lockstep::app {
namespace {

using namespace std::chrono_literals;
constexpr int kConnectMs = 30000;  // announced agents that do not answer by then are given up on
constexpr auto kAgentExitMargin = 5s;  // after its linger, an agent is gone within this

}  // namespace

SlurmLauncher::SlurmLauncher(ClusterStore& store, JobControl& control, std::string configDir, QObject* parent)
    : QObject(parent), store_(store), control_(control), configDir_(std::move(configDir)) {
  connect(&control_, &JobControl::stopFinished, this, [this](const QString& jobId, bool ok, const QString&) {
    if (!ok || !ours_.count(jobId.toStdString())) return;
    stopping_.insert(jobId.toStdString());
    cancelStopped();
  });
  connect(&store_, &ClusterStore::jobsChanged, this, [this] { onJobsChanged(); });
}

SlurmLauncher::~SlurmLauncher() {
  closing_.store(true);  // a wait for agents gives up at its next look at Slurm
  for (auto& w : workers_) w.thread.join();
}

void SlurmLauncher::inBackground(std::function<void()> work) {
  std::erase_if(workers_, [](Worker& w) {
    if (!w.done->load()) return false;
    w.thread.join();
    return true;
  });
  auto done = std::make_shared<std::atomic<bool>>(false);
  workers_.push_back({std::thread([work = std::move(work), done] {
                        work();
                        done->store(true);
                      }),
                      done});
}

void SlurmLauncher::launch(const JobSpec& spec, const SlurmRequest& request) {
  auto p = std::make_shared<Pending>(Pending{spec, request, {}, {}, 0});
  const QString jobId = QString::fromStdString(spec.jobId);
  // The app's key and, when this user has one, lockstepctl's: either can watch and stop the job.
  std::vector<std::string> keys = slurm::clientKeys(configDir_);
  if (std::find(keys.begin(), keys.end(), store_.keys().publicKey) == keys.end()) keys.push_back(store_.keys().publicKey);
  inBackground([this, p, jobId, keys] {
    const auto say = [&](const std::string& what) {
      const QString text = QString::fromStdString(what);
      QMetaObject::invokeMethod(this, [this, jobId, text] { Q_EMIT progress(jobId, text); }, Qt::QueuedConnection);
      return !closing_.load();
    };
    const slurm::AgentsLaunch launch{p->request.allocation, p->spec.jobId, besideThisProgram("lockstep-agent"), keys,
                                     p->request.lingerS, {}};
    auto agents = slurm::launchAgents(launch, 30s, std::chrono::seconds(p->request.waitS), say);
    if (!agents) {
      const QString what = QString::fromStdString(agents.error().message);
      QMetaObject::invokeMethod(this, [this, jobId, what] { Q_EMIT failed(jobId, what); }, Qt::QueuedConnection);
      return;
    }
    p->slurmJobId = agents->started.slurmJobId;
    p->spec.allocatedGpus = agents->allocatedGpus;
    QMetaObject::invokeMethod(this, [this, p, a = agents->announced] { onAnnounced(p, a); }, Qt::QueuedConnection);
  });
}

void SlurmLauncher::onAnnounced(std::shared_ptr<Pending> p, std::vector<slurm::Announced> agents) {
  for (const auto& a : agents) {
    auto address = parseAgentAddress(a.address);
    if (!address) {
      Q_EMIT failed(QString::fromStdString(p->spec.jobId), QString::fromStdString(address.error().message));
      return;
    }
    store_.addAgent(*address, a.publicKey);  // not pinned: it lives as long as the Slurm job
    p->agents.push_back(QString::fromStdString(address->text()));
  }
  placeWhenConnected(std::move(p));
}

void SlurmLauncher::placeWhenConnected(std::shared_ptr<Pending> p) {
  const QString jobId = QString::fromStdString(p->spec.jobId);
  bool ready = true;
  for (const auto& id : p->agents) {
    const AgentEntry* a = store_.agent(id);
    ready = ready && a && a->state == AgentState::kConnected && a->hello;
  }
  if (!ready) {
    if ((p->waitedMs += 200) > kConnectMs) {
      Q_EMIT failed(jobId, tr("the agents of Slurm job %1 announced themselves but did not answer within %2 s")
                               .arg(QString::fromStdString(p->slurmJobId))
                               .arg(kConnectMs / 1000));
      return;
    }
    QTimer::singleShot(200, this, [this, p] { placeWhenConnected(p); });
    return;
  }
  const slurm::Allocation& a = p->request.allocation;
  std::vector<std::pair<QString, std::uint32_t>> ranks;
  const auto n = static_cast<std::uint32_t>(p->agents.size());
  const auto spread = spreadRanks(p->request.ranks, n);
  for (std::uint32_t i = 0; i < n; ++i) ranks.emplace_back(p->agents[i], a.gpusPerNode > 0 ? a.gpusPerNode : spread[i]);
  JobSpec spec = p->spec;
  spec.slurmJobId = p->slurmJobId;
  auto placed = store_.place(spec, ranks);
  if (!placed) {
    inBackground([jobId] { (void)slurm::cancelSubmitted(jobId.toStdString(), 10s); });  // no allocation left idle
    Q_EMIT failed(jobId, QString::fromStdString(placed.error().message));
    return;
  }
  control_.launch(*placed);
  launched_[p->spec.jobId] = {p->agents, p->request.lingerS};
  ours_.insert(p->spec.jobId);
  Q_EMIT launched(jobId, QString::fromStdString(p->slurmJobId));
}

// A job's agents leave the cluster view once it is over (its verdict is in: not while it is to
// restart) and they will have exited, after their linger.
void SlurmLauncher::onJobsChanged() {
  cancelStopped();
  for (auto it = launched_.begin(); it != launched_.end();) {
    const JobEntry* job = store_.job(it->first);
    if (job && !job->over) {
      ++it;
      continue;
    }
    QTimer::singleShot(std::chrono::seconds(it->second.lingerS) + kAgentExitMargin, this, [this, agents = it->second.agents] {
      for (const auto& id : agents) store_.removeAgent(id);
    });
    it = launched_.erase(it);
  }
}

// A stopped job's Slurm job is cancelled once the job is over (its last events and its verdict are
// in): sooner would take the agents away before they sent them.
void SlurmLauncher::cancelStopped() {
  for (auto it = stopping_.begin(); it != stopping_.end();) {
    const JobEntry* job = store_.job(*it);
    if (job && !job->over) {
      ++it;
      continue;
    }
    inBackground([jobId = *it] { (void)slurm::cancelSubmitted(jobId, 10s); });
    it = stopping_.erase(it);
  }
}

}  // namespace lockstep::app
