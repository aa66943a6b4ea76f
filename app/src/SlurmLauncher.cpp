#include "SlurmLauncher.h"

#include <chrono>

#include "lockstep/common/files.h"

namespace lockstep::app {
namespace {

using namespace std::chrono_literals;
constexpr int kConnectMs = 30000;  // announced agents that do not answer by then are given up on

}  // namespace

SlurmLauncher::SlurmLauncher(ClusterStore& store, JobControl& control, QObject* parent)
    : QObject(parent), store_(store), control_(control) {
  connect(&control_, &JobControl::stopFinished, this,
          [this](const QString& jobId, bool ok, const QString&) { onStopped(jobId, ok); });
}

SlurmLauncher::~SlurmLauncher() {
  closing_.store(true);  // a wait for agents gives up within one poll
  for (auto& t : threads_) t.join();
}

void SlurmLauncher::inBackground(std::function<void()> work) { threads_.emplace_back(std::move(work)); }

void SlurmLauncher::launch(const JobSpec& spec, const SlurmRequest& request) {
  auto p = std::make_shared<Pending>(Pending{spec, request, {}, {}, 0});
  const QString jobId = QString::fromStdString(spec.jobId);
  const std::string key = store_.keys().publicKey;
  inBackground([this, p, jobId, key] {
    const auto say = [&](const QString& what) {
      QMetaObject::invokeMethod(this, [this, jobId, what] { Q_EMIT progress(jobId, what); }, Qt::QueuedConnection);
    };
    const auto fail = [&](const Error& e) {
      const QString what = QString::fromStdString(e.message);
      QMetaObject::invokeMethod(this, [this, jobId, what] { Q_EMIT failed(jobId, what); }, Qt::QueuedConnection);
    };
    const slurm::AgentsLaunch launch{p->request.allocation, p->spec.jobId, besideThisProgram("lockstep-agent"), key,
                                     p->request.lingerS};
    auto started = slurm::startAgents(launch, 30s);
    if (!started) return fail(started.error());
    p->slurmJobId = started->slurmJobId;
    say(tr("Slurm job %1: waiting for its agents").arg(QString::fromStdString(p->slurmJobId)));
    std::string said;
    auto agents = slurm::waitForAgents(p->spec.jobId, p->slurmJobId, p->request.allocation.nodes,
                                       std::chrono::seconds(p->request.waitS), [&](const slurm::JobInfo& info) {
                                         if (info.describe() != said) say(QString::fromStdString(said = info.describe()));
                                         p->spec.allocatedGpus = info.gpus;
                                         return !closing_.load();
                                       });
    if (!agents) {
      if (started->submitted) (void)slurm::cancel(p->slurmJobId, 10s);  // nothing left holding nodes
      return fail(agents.error());
    }
    QMetaObject::invokeMethod(this, [this, p, a = *agents] { onAnnounced(p, a); }, Qt::QueuedConnection);
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
  for (std::uint32_t i = 0; i < n; ++i) {
    ranks.emplace_back(p->agents[i], a.gpusPerNode > 0 ? a.gpusPerNode : p->request.ranks / n + (i < p->request.ranks % n));
  }
  JobSpec spec = p->spec;
  spec.slurmJobId = p->slurmJobId;
  if (spec.allocatedGpus == 0) spec.allocatedGpus = a.nodes * a.gpusPerNode;
  auto placed = store_.place(spec, ranks);
  if (!placed) {
    inBackground([jobId] { (void)slurm::cancelSubmitted(jobId.toStdString(), 10s); });  // no allocation left idle
    Q_EMIT failed(jobId, QString::fromStdString(placed.error().message));
    return;
  }
  control_.launch(*placed);
  Q_EMIT launched(jobId, QString::fromStdString(p->slurmJobId));
}

void SlurmLauncher::onStopped(const QString& jobId, bool ok) {
  if (!ok) return;
  inBackground([jobId] { (void)slurm::cancelSubmitted(jobId.toStdString(), 10s); });
}

}  // namespace lockstep::app
