#pragma once
// A job on a Slurm cluster from the app (docs/cluster.md), as `lockstepctl start --slurm` runs it,
// through the same client core (lockstep/client/slurm.h): submit (or srun inside an allocation),
// wait for the agents to announce themselves, add them to the cluster view, place the job on them
// once they are connected, and launch it with JobControl. A stopped job's Slurm job is cancelled;
// an ended job's agents leave the cluster view once they exited.
//
// The Slurm tools run on this host, off the GUI thread; what they say comes back as signals.

#include <QObject>
#include <QString>
#include <QTimer>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ClusterStore.h"
#include "JobControl.h"
#include "lockstep/client/slurm.h"

namespace lockstep::app {

struct SlurmRequest {
  slurm::Allocation allocation;
  std::uint32_t ranks = 0;  // CPU ranks in all; with GPUs per node, one rank per GPU instead
  std::uint32_t lingerS = 30;
  std::uint32_t waitS = 600;
};

class SlurmLauncher : public QObject {
  Q_OBJECT

 public:
  // configDir: where lockstepctl's key is, let in beside the app's (empty: the app's only).
  SlurmLauncher(ClusterStore& store, JobControl& control, std::string configDir = {}, QObject* parent = nullptr);
  ~SlurmLauncher() override;

  // `spec`: the job, not placed (the launcher dialog's). Answers with progress, then launched or
  // failed; the job then shows as any job does.
  void launch(const JobSpec& spec, const SlurmRequest& request);

 Q_SIGNALS:
  void progress(QString jobId, QString message);
  void launched(QString jobId, QString slurmJobId);
  void failed(QString jobId, QString message);

 private:
  struct Pending {
    JobSpec spec;
    SlurmRequest request;
    std::string slurmJobId;
    std::vector<QString> agents;  // their ids in the store, once announced
    int waitedMs = 0;
  };
  void onAnnounced(std::shared_ptr<Pending> p, std::vector<slurm::Announced> agents);
  void placeWhenConnected(std::shared_ptr<Pending> p);
  void onJobsChanged();
  void cancelStopped();
  // Runs `work` on a thread of its own (the Slurm tools block); finished ones are joined.
  void inBackground(std::function<void()> work);

  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  ClusterStore& store_;
  JobControl& control_;
  std::string configDir_;
  struct Launched {
    std::vector<QString> agents;  // in the store
    std::uint32_t lingerS = 0;
  };
  std::map<std::string, Launched> launched_;  // jobs this launcher placed on their Slurm agents
  std::set<std::string> ours_;                // every job it placed
  std::set<std::string> stopping_;            // of those, the ones stopped: cancelled once they show as ended
  std::atomic<bool> closing_{false};
  std::vector<Worker> workers_;
};

}  // namespace lockstep::app
