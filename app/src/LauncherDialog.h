#pragma once
// The job launcher: where ranks go (agents and their ranks, CPU or GPU, and for the built-in trainer
// how they share the model: all-reduce, sharded optimizer or a parameter server), then either the built-in
// MLP (model, data, batch, optimizer, duration, target loss, checkpoints) or "Your program"
// (program, arguments, working directory, environment), and prices. Every edit re-checks the job with the
// same rules the agents apply, shows what is wrong under the form and enables Start only when the
// job is valid.

#include <QDialog>
#include <QTableWidgetItem>
#include <optional>

#include "ClusterStore.h"
#include "SlurmLauncher.h"

QT_BEGIN_NAMESPACE
class QCheckBox;
class QComboBox;
class QDialogButtonBox;
class QLabel;
class QLayout;
class QTabWidget;
class QLineEdit;
class QRadioButton;
class QSpinBox;
class QTableWidget;
QT_END_NAMESPACE

namespace lockstep::app {

class LauncherDialog : public QDialog {
  Q_OBJECT
 public:
  LauncherDialog(const ClusterStore& store, QWidget* parent = nullptr);

  // The placed job, when the form is valid; for a Slurm cluster, not placed yet, with what to ask
  // Slurm for in slurmRequest().
  const std::optional<JobSpec>& job() const { return placed_; }
  const std::optional<SlurmRequest>& slurmRequest() const { return slurm_; }
  QString error() const;
  // Sets a field by object name (tests and defaults): a line edit's text, a spin box's value.
  void setField(const QString& name, const QVariant& value);

 private:
  QWidget* placementBox();
  QWidget* slurmBox();
  Result<JobSpec> checkedForSlurm(JobSpec spec);
  QLayout* parallelRow();
  void offerParallelKinds(bool program);
  Result<void> parallelism(JobSpec& s) const;
  std::uint32_t rankCount() const;
  QWidget* trainerPage();
  QWidget* programPage();
  QLayout* pricesRow();
  QTableWidgetItem* freeItem(const NodeHello& hello, const std::vector<JobStatus>& jobs);
  QLayout* fencesRow();
  Result<void> fences(JobSpec& s) const;
  Result<void> alerting(JobSpec& s) const;
  void revalidate();
  Result<JobSpec> build();
  Result<JobSpec> trainerJob() const;
  Result<JobSpec> programJob() const;
  QLineEdit* edit(const QString& name, const QString& text, const QString& placeholder = {});

  const ClusterStore& store_;
  std::optional<JobSpec> placed_;
  std::optional<SlurmRequest> slurm_;
  QComboBox* where_;  // the connected agents, or a Slurm cluster
  QWidget* slurmBox_;
  QSpinBox *slurmNodes_, *slurmGpus_, *slurmRanks_;
  QLineEdit *slurmTime_, *slurmPartition_, *slurmAccount_;
  QTableWidget* agents_;
  QTabWidget* kind_;
  QLineEdit *program_, *arguments_, *workingDir_, *environment_, *programTarget_;
  QSpinBox* programRestarts_;
  QComboBox* backend_;
  QComboBox* parallel_;  // the data-parallel kind (ParallelKind), as lockstepctl's --sync, --shard, --staleness
  QSpinBox* staleness_;
  QSpinBox* psRanks_;
  QLabel* parallelTrade_;
  int autoStaleness_ = 1;  // K as the form last suggested it (ranks - 1): it follows the ranks until edited
  QLineEdit *jobId_, *layers_, *samples_, *dataSeed_, *features_, *labels_, *lr_, *momentum_, *weightDecay_;
  QLineEdit *targetLoss_, *checkpointDir_, *priceGpu_, *priceCore_, *priceKwh_, *currency_, *bucketMb_;
  QLineEdit *alerts_, *notify_, *budget_;  // docs/alerts.md
  QLineEdit* memPerRank_;                  // docs/fences.md
  QSpinBox *cpusPerRank_, *processesPerRank_;
  QCheckBox* balance_;
  QSpinBox* restarts_;
  QComboBox *activation_, *optimizer_, *durationKind_;
  QRadioButton *synthetic_, *npy_;
  QSpinBox *batch_, *accum_, *duration_, *checkpointEvery_, *timeout_;
  QCheckBox *linearScaling_, *useTarget_;
  QLabel* error_;
  QDialogButtonBox* buttons_;
};

}  // namespace lockstep::app
