#include "LauncherDialog.h"

#include <algorithm>
#include <utility>

#include <QCheckBox>
#include <QComboBox>
#include <QDateTime>
#include <QDir>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QGroupBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QProcess>
#include <QPushButton>
#include <QRadioButton>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QTabWidget>
#include <QTableWidget>
#include <QVBoxLayout>

#include "lockstep/client/launch.h"
#include "lockstep/alerts/rules.h"
#include "lockstep/alerts/urls.h"
#include "lockstep/jobflags/options.h"
#include "lockstep/present/present.h"
#include "lockstep/protocol/names.h"
#include "lockstep/protocol/validate.h"

namespace lockstep::app {
namespace {

Result<double> real(const QLineEdit* edit, const QString& what) {
  bool ok = false;
  const double v = edit->text().trimmed().toDouble(&ok);
  if (!ok) return invalidArgument((what + ": '" + edit->text() + "' is not a number").toStdString());
  return v;
}

Result<std::uint64_t> whole(const QLineEdit* edit, const QString& what) {
  bool ok = false;
  const qulonglong v = edit->text().trimmed().toULongLong(&ok);
  if (!ok) return invalidArgument((what + ": '" + edit->text() + "' is not a whole number").toStdString());
  return v;
}

// The data-parallel kinds the launcher offers, in the order of its choice.
enum ParallelKind { kAllReduce, kShardedOptimizer, kShardedGradients, kShardedParameters, kServerSync, kServerAsync };

// A kind's --shard and --sync (its other settings, K and the server's parts, come from the form).
void applyKind(int kind, JobSpec& s) {
  if (kind == kShardedOptimizer) s.shard = Shard::kOptimizer;
  if (kind == kShardedGradients) s.shard = Shard::kGradients;
  if (kind == kShardedParameters) s.shard = Shard::kParameters;
  if (kind == kServerSync || kind == kServerAsync) s.sync = Sync::kParameterServer;
}

}  // namespace

QLineEdit* LauncherDialog::edit(const QString& name, const QString& text, const QString& placeholder) {
  auto* e = new QLineEdit(text, this);
  e->setObjectName(name);
  e->setPlaceholderText(placeholder);
  connect(e, &QLineEdit::textChanged, this, &LauncherDialog::revalidate);
  return e;
}

// What a node has free (docs/fences.md): cores and memory no running job holds; the fences that
// are off there in its tooltip.
QTableWidgetItem* LauncherDialog::freeItem(const NodeHello& hello, const std::vector<JobStatus>& jobs) {
  const FreeShare free = freeShare(hello, jobs);
  auto* item = new QTableWidgetItem(tr("%1 cores, %2").arg(free.cores).arg(QString::fromStdString(present::bytes(static_cast<double>(free.memoryBytes)))));
  item->setData(Qt::UserRole, free.cores);
  QStringList off;
  for (const auto& fence : hello.fencesOff) off << tr("fence off, %1").arg(QString::fromStdString(fence));
  item->setToolTip(off.isEmpty() ? tr("memory, processes, cores and GPUs are fenced per job") : off.join(QLatin1Char('\n')));
  return item;
}

QWidget* LauncherDialog::placementBox() {
  auto* where = new QGroupBox(tr("Ranks"), this);
  auto* whereLayout = new QVBoxLayout(where);
  backend_ = new QComboBox(this);
  backend_->setObjectName(QStringLiteral("backend"));
  backend_->addItem(tr("CPU ranks (OpenBLAS + Gloo)"), static_cast<int>(Backend::kCpu));
  backend_->addItem(tr("GPU ranks (CUDA + NCCL)"), static_cast<int>(Backend::kCuda));
  connect(backend_, &QComboBox::currentIndexChanged, this, &LauncherDialog::revalidate);
  whereLayout->addWidget(backend_);
  whereLayout->addLayout(parallelRow());
  whereLayout->addWidget(parallelTrade_);
  where_ = new QComboBox(this);
  where_->setObjectName(QStringLiteral("where"));
  where_->addItem(tr("On the connected agents"));
  for (const auto& c : store_.slurmClusters()) where_->addItem(tr("On Slurm, submitted on %1").arg(c.login));
  where_->setVisible(where_->count() > 1);
  connect(where_, &QComboBox::currentIndexChanged, this, &LauncherDialog::revalidate);
  whereLayout->addWidget(where_);
  whereLayout->addWidget(slurmBox());
  agents_ = new QTableWidget(0, 6, this);
  agents_->setObjectName(QStringLiteral("agents"));
  agents_->setHorizontalHeaderLabels({tr("Agent"), tr("Node"), tr("Cores"), tr("Free GPUs"), tr("Free"), tr("Ranks")});
  agents_->horizontalHeader()->setStretchLastSection(true);
  agents_->verticalHeader()->hide();
  agents_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  int row = 0;
  for (const auto& a : store_.agents()) {
    if (a->state != AgentState::kConnected || !a->hello) continue;
    agents_->insertRow(row);
    agents_->setItem(row, 0, new QTableWidgetItem(a->id));
    agents_->setItem(row, 1, new QTableWidgetItem(QString::fromStdString(a->hello->nodeName)));
    agents_->setItem(row, 2, new QTableWidgetItem(QString::number(a->hello->cpuCores)));
    agents_->setItem(row, 3, new QTableWidgetItem(QString::number(freeGpus(*a->hello, a->jobs).size())));
    agents_->setItem(row, 4, freeItem(*a->hello, a->jobs));
    auto* ranks = new QSpinBox(this);
    ranks->setObjectName(QStringLiteral("ranks:") + a->id);
    ranks->setRange(0, 4096);
    ranks->setValue(row == 0 ? 2 : 0);
    connect(ranks, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
    agents_->setCellWidget(row, 5, ranks);
    ++row;
  }
  agents_->resizeColumnsToContents();
  agents_->setMinimumHeight(90);
  agents_->setMaximumHeight(agents_->horizontalHeader()->height() + 6 + agents_->verticalHeader()->defaultSectionSize() * std::clamp(row, 2, 8));
  whereLayout->addWidget(agents_);
  return where;

}

// How the built-in trainer's ranks share the model, each kind with a line on what it trades; the
// line is the item's data.
QLayout* LauncherDialog::parallelRow() {
  parallel_ = new QComboBox(this);
  parallel_->setObjectName(QStringLiteral("dataParallel"));
  const auto kind = [&](const QString& name, const QString& trade) { parallel_->addItem(name, trade); };
  kind(tr("All-reduce (synchronous, every rank holds the whole model)"),
       tr("Each rank holds all parameters, gradients and optimizer state; gradients are all-reduced while backward "
          "runs. The slowest rank sets every step's pace."));
  kind(tr("Sharded optimizer (ZeRO 1)"),
       tr("Each rank keeps 1/N of the optimizer state (AdamW: 2 floats per parameter); gradients are reduce-scattered "
          "and the parameters all-gathered after each step: less memory, a little more communication."));
  kind(tr("Sharded gradients (ZeRO 2)"),
       tr("Each rank also keeps 1/N of the gradients, reduce-scattering each bucket while backward goes on: less "
          "memory again, for about the sharded optimizer's communication."));
  kind(tr("Sharded parameters (ZeRO 3, FSDP)"),
       tr("Each rank keeps 1/N of everything and all-gathers each layer's parameters just before forward or backward "
          "reaches it: the least memory, at about 1.5x all-reduce's traffic."));
  kind(tr("Parameter server, synchronous"),
       tr("Rank 0's process holds the master model and the optimizer; every rank pushes its gradient and pulls the "
          "weights. Same training as all-reduce; the server's link carries every rank's bytes."));
  kind(tr("Parameter server, asynchronous"),
       tr("Each rank's gradient updates the master as it arrives, on weights at most K updates old: a slow rank no "
          "longer holds the others up, at the price of stale gradients."));
  staleness_ = new QSpinBox(this);
  staleness_->setObjectName(QStringLiteral("staleness"));
  staleness_->setRange(1, 1000);  // the spec field's bound (spec_fields.h)
  staleness_->setPrefix(tr("K = "));
  staleness_->setToolTip(tr("How many updates old the weights a rank computes on may be. Each update is one rank's "
                            "gradient, so K must be at least ranks - 1 (the default)"));
  psRanks_ = new QSpinBox(this);
  psRanks_->setObjectName(QStringLiteral("psRanks"));
  psRanks_->setRange(1, 4096);  // the spec field's bound; the ranks bound it below that (revalidate)
  psRanks_->setPrefix(tr("split over "));
  psRanks_->setSuffix(tr(" rank(s)"));
  psRanks_->setToolTip(tr("Split the server by parameter ranges over the processes of ranks 0..N-1, so that no one "
                          "rank's link carries every rank's whole model each step (lockstepctl's --ps-ranks)"));
  parallelTrade_ = new QLabel(this);
  parallelTrade_->setObjectName(QStringLiteral("dataParallelTrade"));
  parallelTrade_->setWordWrap(true);
  parallelTrade_->setForegroundRole(QPalette::PlaceholderText);
  connect(parallel_, &QComboBox::currentIndexChanged, this, &LauncherDialog::revalidate);
  connect(staleness_, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  connect(psRanks_, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  auto* row = new QHBoxLayout;
  row->addWidget(new QLabel(tr("Data parallel"), this));
  row->addWidget(parallel_, 1);
  row->addWidget(staleness_);
  row->addWidget(psRanks_);
  return row;
}

// Command jobs do their own data parallelism: the choice is the built-in trainer's, whose CPU and
// GPU backends both run every kind.
void LauncherDialog::offerParallelKinds(bool program) {
  parallel_->setEnabled(!program);
  parallel_->setToolTip(program ? tr("Your program does its own data parallelism (DDP, FSDP, …): this choice is the "
                                     "built-in trainer's")
                                : tr("How the ranks share the model (lockstepctl's --sync, --shard and --staleness)"));
  const int suggested = std::max(1, static_cast<int>(rankCount()) - 1);
  if (staleness_->value() == std::exchange(autoStaleness_, suggested)) {
    const QSignalBlocker block(staleness_);
    staleness_->setValue(suggested);
  }
  staleness_->setVisible(!program && parallel_->currentIndex() == kServerAsync);
  psRanks_->setVisible(!program && parallel_->currentIndex() == kServerSync);
  parallelTrade_->setText(program ? tr("Your program does its own data parallelism; this choice is the built-in MLP's.")
                                  : parallel_->currentData().toString());
  balance_->setEnabled(parallel_->currentIndex() < kServerSync);  // a server lets a slow rank lag instead
}

// The chosen kind into the job; an asynchronous server's K and a split server's parts checked
// against the ranks the form asks for, by the rules the agents and the trainer apply.
Result<void> LauncherDialog::parallelism(JobSpec& s) const {
  const int kind = parallel_->currentIndex();
  applyKind(kind, s);
  if (kind == kServerSync && psRanks_->value() > 1) s.psRanks = static_cast<std::uint32_t>(psRanks_->value());
  if (kind == kServerAsync) s.staleness = static_cast<std::uint32_t>(staleness_->value());
  JobSpec asked = s;
  asked.worldSize = rankCount();
  LOCKSTEP_TRY(validatePsRanks(asked));
  return validateStaleness(asked);
}

// The ranks the form asks for: the agents' counts, or what Slurm is asked for.
std::uint32_t LauncherDialog::rankCount() const {
  if (where_->currentIndex() > 0) {
    return static_cast<std::uint32_t>(slurmGpus_->value() > 0 ? slurmNodes_->value() * slurmGpus_->value()
                                                              : slurmRanks_->value());
  }
  std::uint32_t ranks = 0;
  for (int row = 0; row < agents_->rowCount(); ++row) {
    ranks += static_cast<std::uint32_t>(qobject_cast<QSpinBox*>(agents_->cellWidget(row, 5))->value());
  }
  return ranks;
}

// What to ask Slurm for (lockstepctl start --slurm's flags): nodes, GPUs per node (none: CPU
// ranks, as many as Ranks says), time limit, partition, account.
QWidget* LauncherDialog::slurmBox() {
  slurmBox_ = new QWidget(this);
  auto* form = new QFormLayout(slurmBox_);
  form->setContentsMargins(0, 0, 0, 0);
  const auto spin = [&](const QString& name, int lo, int hi, int value) {
    auto* s = new QSpinBox(this);
    s->setObjectName(name);
    s->setRange(lo, hi);
    s->setValue(value);
    connect(s, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
    return s;
  };
  slurmNodes_ = spin(QStringLiteral("slurmNodes"), 1, 4096, 1);
  slurmGpus_ = spin(QStringLiteral("slurmGpusPerNode"), 0, 64, 0);
  slurmGpus_->setSpecialValueText(tr("none (CPU ranks)"));
  slurmRanks_ = spin(QStringLiteral("slurmRanks"), 1, 1 << 20, 2);
  slurmTime_ = edit(QStringLiteral("slurmTime"), {}, tr("the partition's limit (e.g. 2:00:00)"));
  // The first cluster's defaults (set at creation: a change re-checks the whole form).
  const auto& clusters = store_.slurmClusters();
  slurmPartition_ = edit(QStringLiteral("slurmPartition"), clusters.empty() ? QString() : clusters.front().partition,
                         tr("the cluster's default"));
  slurmAccount_ = edit(QStringLiteral("slurmAccount"), clusters.empty() ? QString() : clusters.front().account,
                       tr("your default"));
  form->addRow(tr("Nodes"), slurmNodes_);
  form->addRow(tr("GPUs per node"), slurmGpus_);
  form->addRow(tr("CPU ranks in all"), slurmRanks_);
  form->addRow(tr("Time limit"), slurmTime_);
  form->addRow(tr("Partition"), slurmPartition_);
  form->addRow(tr("Account"), slurmAccount_);
  return slurmBox_;
}

// The built-in MLP of lockstep-trainer: model, data, batch, optimizer, length, checkpoints.
QWidget* LauncherDialog::trainerPage() {
  auto* page = new QWidget(this);
  auto* form = new QFormLayout(page);
  layers_ = edit(QStringLiteral("layers"), QStringLiteral("784,1024,1024,10"), tr("input features, hidden sizes, classes"));
  activation_ = new QComboBox(this);
  activation_->setObjectName(QStringLiteral("activation"));
  for (const auto& n : kActivationNames) activation_->addItem(QString::fromUtf8(n.name), static_cast<int>(n.value));
  auto* model = new QHBoxLayout;
  model->addWidget(layers_, 1);
  model->addWidget(activation_);
  form->addRow(tr("MLP layers"), model);

  synthetic_ = new QRadioButton(tr("Synthetic"), this);
  synthetic_->setObjectName(QStringLiteral("synthetic"));
  npy_ = new QRadioButton(tr(".npy files on the nodes"), this);
  npy_->setObjectName(QStringLiteral("npy"));
  synthetic_->setChecked(true);
  connect(synthetic_, &QRadioButton::toggled, this, &LauncherDialog::revalidate);
  samples_ = edit(QStringLiteral("samples"), QStringLiteral("65536"));
  dataSeed_ = edit(QStringLiteral("dataSeed"), QStringLiteral("1"));
  features_ = edit(QStringLiteral("features"), {}, tr("/data/features.npy (float32 [N, D])"));
  labels_ = edit(QStringLiteral("labels"), {}, tr("/data/labels.npy (integers [N])"));
  auto* dataRow = new QGridLayout;
  dataRow->addWidget(synthetic_, 0, 0);
  dataRow->addWidget(new QLabel(tr("samples"), this), 0, 1);
  dataRow->addWidget(samples_, 0, 2);
  dataRow->addWidget(new QLabel(tr("seed"), this), 0, 3);
  dataRow->addWidget(dataSeed_, 0, 4);
  dataRow->addWidget(npy_, 1, 0);
  dataRow->addWidget(features_, 1, 1, 1, 2);
  dataRow->addWidget(labels_, 1, 3, 1, 2);
  form->addRow(tr("Data"), dataRow);

  batch_ = new QSpinBox(this);
  batch_->setObjectName(QStringLiteral("batchPerRank"));
  batch_->setRange(1, 1 << 20);
  batch_->setValue(64);
  accum_ = new QSpinBox(this);
  accum_->setObjectName(QStringLiteral("accumSteps"));
  accum_->setRange(1, 4096);
  for (QSpinBox* s : {batch_, accum_}) connect(s, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  auto* batch = new QHBoxLayout;
  batch->addWidget(batch_);
  batch->addWidget(new QLabel(tr("per rank, accumulated over"), this));
  batch->addWidget(accum_);
  batch->addWidget(new QLabel(tr("micro-steps"), this));
  batch->addStretch(1);
  form->addRow(tr("Batch"), batch);

  optimizer_ = new QComboBox(this);
  optimizer_->setObjectName(QStringLiteral("optimizer"));
  for (const auto& n : kOptimizerNames) optimizer_->addItem(QString::fromUtf8(n.name), static_cast<int>(n.value));
  connect(optimizer_, &QComboBox::currentIndexChanged, this, &LauncherDialog::revalidate);
  lr_ = edit(QStringLiteral("lr"), QStringLiteral("0.05"));
  momentum_ = edit(QStringLiteral("momentum"), QStringLiteral("0.9"));
  weightDecay_ = edit(QStringLiteral("weightDecay"), QStringLiteral("0"));
  linearScaling_ = new QCheckBox(tr("linear scaling (lr × global batch / batch per rank)"), this);
  linearScaling_->setObjectName(QStringLiteral("linearScaling"));
  connect(linearScaling_, &QCheckBox::toggled, this, &LauncherDialog::revalidate);
  auto* opt = new QGridLayout;
  opt->addWidget(optimizer_, 0, 0);
  opt->addWidget(new QLabel(tr("lr"), this), 0, 1);
  opt->addWidget(lr_, 0, 2);
  opt->addWidget(new QLabel(tr("momentum"), this), 0, 3);
  opt->addWidget(momentum_, 0, 4);
  opt->addWidget(new QLabel(tr("weight decay"), this), 0, 5);
  opt->addWidget(weightDecay_, 0, 6);
  opt->addWidget(linearScaling_, 1, 0, 1, 7);
  form->addRow(tr("Optimizer"), opt);

  durationKind_ = new QComboBox(this);
  durationKind_->setObjectName(QStringLiteral("durationKind"));
  durationKind_->addItems({tr("steps"), tr("epochs")});
  connect(durationKind_, &QComboBox::currentIndexChanged, this, &LauncherDialog::revalidate);
  duration_ = new QSpinBox(this);
  duration_->setObjectName(QStringLiteral("duration"));
  duration_->setRange(0, 1'000'000'000);
  duration_->setValue(300);
  connect(duration_, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  useTarget_ = new QCheckBox(tr("stop at smoothed loss"), this);
  useTarget_->setObjectName(QStringLiteral("useTargetLoss"));
  connect(useTarget_, &QCheckBox::toggled, this, &LauncherDialog::revalidate);
  targetLoss_ = edit(QStringLiteral("targetLoss"), QStringLiteral("0.1"));
  auto* duration = new QHBoxLayout;
  duration->addWidget(duration_);
  duration->addWidget(durationKind_);
  duration->addSpacing(16);
  duration->addWidget(useTarget_);
  duration->addWidget(targetLoss_);
  duration->addStretch(1);
  form->addRow(tr("Train for"), duration);

  checkpointDir_ = edit(QStringLiteral("checkpointDir"), {}, tr("directory on the node of rank 0 (optional)"));
  checkpointEvery_ = new QSpinBox(this);
  checkpointEvery_->setObjectName(QStringLiteral("checkpointEvery"));
  checkpointEvery_->setRange(0, 1 << 30);
  checkpointEvery_->setSpecialValueText(tr("never"));
  connect(checkpointEvery_, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  auto* ckpt = new QHBoxLayout;
  ckpt->addWidget(checkpointDir_, 1);
  ckpt->addWidget(new QLabel(tr("every"), this));
  ckpt->addWidget(checkpointEvery_);
  ckpt->addWidget(new QLabel(tr("steps"), this));
  restarts_ = new QSpinBox(this);
  restarts_->setObjectName(QStringLiteral("maxRestarts"));
  restarts_->setRange(0, 100);
  restarts_->setSpecialValueText(tr("no restarts"));
  restarts_->setSuffix(tr(" restarts"));
  restarts_->setToolTip(tr("When ranks or a node are lost, restart from the last checkpoint with the ranks left, up "
                           "to this many times (rank 0's agent does it, with this app open or not; the checkpoint "
                           "directory must be one every node sees)"));
  connect(restarts_, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  ckpt->addWidget(restarts_);
  form->addRow(tr("Checkpoints"), ckpt);

  bucketMb_ = edit(QStringLiteral("bucketMb"), QStringLiteral("auto"));
  bucketMb_->setToolTip(tr("auto: the trainer measures its all-reduce and backward at start-up and chooses the buckets "
                           "that hide the most communication (the plan is in the job's events); or a size in MB"));
  timeout_ = new QSpinBox(this);
  timeout_->setObjectName(QStringLiteral("timeoutS"));
  timeout_->setRange(1, 86400);
  timeout_->setValue(60);
  connect(timeout_, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  auto* comm = new QHBoxLayout;
  comm->addWidget(new QLabel(tr("bucket MB"), this));
  comm->addWidget(bucketMb_);
  comm->addWidget(new QLabel(tr("timeout s"), this));
  comm->addWidget(timeout_);
  balance_ = new QCheckBox(tr("balance ranks by speed"), this);
  balance_->setObjectName(QStringLiteral("balanceDynamic"));
  balance_->setToolTip(tr("Every 10 steps, re-split the global batch by each rank's measured compute rate, so that "
                          "slower ranks get fewer samples and all finish together (CPU ranks; not with a parameter "
                          "server, where asynchronous training lets a slow rank lag instead)"));
  connect(balance_, &QCheckBox::toggled, this, &LauncherDialog::revalidate);
  comm->addWidget(balance_);
  comm->addStretch(1);
  form->addRow(tr("Communication"), comm);
  return page;
}

// The user's own program, run once per rank with torchrun's environment (docs/own-program.md).
QWidget* LauncherDialog::programPage() {
  auto* page = new QWidget(this);
  auto* form = new QFormLayout(page);
  program_ = edit(QStringLiteral("program"), QStringLiteral("/usr/bin/python3"), tr("a path, or a name in the node's PATH"));
  form->addRow(tr("Program"), program_);
  arguments_ = edit(QStringLiteral("arguments"), {}, tr("train.py --epochs 3 (quote words with spaces)"));
  form->addRow(tr("Arguments"), arguments_);
  workingDir_ = edit(QStringLiteral("workingDir"), QDir::homePath(), tr("absolute, on every node"));
  form->addRow(tr("Working directory"), workingDir_);
  environment_ = edit(QStringLiteral("environment"), {}, tr("NAME=VALUE NAME=VALUE (optional)"));
  form->addRow(tr("Environment"), environment_);
  programTarget_ = edit(QStringLiteral("programTargetLoss"), {}, tr("optional: time to convergence is measured to it"));
  programRestarts_ = new QSpinBox(this);
  programRestarts_->setObjectName(QStringLiteral("programRestarts"));
  programRestarts_->setRange(0, 100);
  programRestarts_->setSpecialValueText(tr("no restarts"));
  programRestarts_->setSuffix(tr(" restarts"));
  programRestarts_->setToolTip(tr("When ranks or a node are lost, run the program again with the ranks left (it "
                                  "resumes from its own checkpoints and gets TORCHELASTIC_RESTART_COUNT)"));
  connect(programRestarts_, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  auto* end = new QHBoxLayout;
  end->addWidget(programTarget_, 1);
  end->addWidget(programRestarts_);
  form->addRow(tr("Target loss"), end);
  auto* hint = new QLabel(tr("Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT as under "
                             "torchrun. Add <code>lockstep.watch(model)</code> and <code>lockstep.step(samples=…, "
                             "loss=…)</code> for every KPI."),
                          this);
  hint->setWordWrap(true);
  hint->setForegroundRole(QPalette::PlaceholderText);
  form->addRow(hint);
  return page;
}

QLayout* LauncherDialog::pricesRow() {
  priceGpu_ = edit(QStringLiteral("priceGpuHour"), QStringLiteral("0"));
  priceCore_ = edit(QStringLiteral("priceCoreHour"), QStringLiteral("0"));
  priceKwh_ = edit(QStringLiteral("priceKwh"), QStringLiteral("0"));
  currency_ = edit(QStringLiteral("currency"), QStringLiteral("USD"));
  auto* prices = new QHBoxLayout;
  prices->addWidget(new QLabel(tr("per GPU-hour"), this));
  prices->addWidget(priceGpu_);
  prices->addWidget(new QLabel(tr("per core-hour"), this));
  prices->addWidget(priceCore_);
  prices->addWidget(new QLabel(tr("per kWh"), this));
  prices->addWidget(priceKwh_);
  prices->addWidget(currency_);
  return prices;

}

// What each rank may take of its node (docs/fences.md), as lockstepctl's --mem-per-rank,
// --cpus-per-rank and --max-processes-per-rank.
QLayout* LauncherDialog::fencesRow() {
  memPerRank_ = edit(QStringLiteral("memPerRank"), {}, tr("the node's default"));
  memPerRank_->setToolTip(tr("memory each rank may use: 512M, 4G; a rank over it is killed"));
  cpusPerRank_ = new QSpinBox(this);
  cpusPerRank_->setObjectName(QStringLiteral("cpusPerRank"));
  cpusPerRank_->setRange(1, 4096);
  processesPerRank_ = new QSpinBox(this);
  processesPerRank_->setObjectName(QStringLiteral("processesPerRank"));
  processesPerRank_->setRange(1, 1 << 22);
  processesPerRank_->setValue(static_cast<int>(JobSpec::kDefaultProcessesPerRank));
  for (auto* spin : {cpusPerRank_, processesPerRank_}) connect(spin, &QSpinBox::valueChanged, this, &LauncherDialog::revalidate);
  auto* row = new QHBoxLayout;
  row->addWidget(new QLabel(tr("memory"), this));
  row->addWidget(memPerRank_);
  row->addWidget(new QLabel(tr("cores"), this));
  row->addWidget(cpusPerRank_);
  row->addWidget(new QLabel(tr("processes"), this));
  row->addWidget(processesPerRank_);
  return row;
}

Result<void> LauncherDialog::fences(JobSpec& s) const {
  if (const QString memory = memPerRank_->text().trimmed(); !memory.isEmpty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.memPerRank, jobflags::parseSize("memory per rank", memory.toStdString()));
  }
  s.cpusPerRank = static_cast<std::uint32_t>(cpusPerRank_->value());
  s.maxProcessesPerRank = static_cast<std::uint32_t>(processesPerRank_->value());
  return {};
}

LauncherDialog::LauncherDialog(const ClusterStore& store, QWidget* parent) : QDialog(parent), store_(store) {
  setWindowTitle(tr("New Job"));
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(placementBox());
  auto* top = new QFormLayout;
  jobId_ = edit(QStringLiteral("jobId"), QStringLiteral("job-") + QDateTime::currentDateTime().toString(QStringLiteral("yyyyMMdd-hhmmss")));
  top->addRow(tr("Job id"), jobId_);
  layout->addLayout(top);
  kind_ = new QTabWidget(this);
  kind_->setObjectName(QStringLiteral("kind"));
  kind_->addTab(trainerPage(), tr("Built-in MLP"));
  kind_->addTab(programPage(), tr("Your program"));
  connect(kind_, &QTabWidget::currentChanged, this, &LauncherDialog::revalidate);
  layout->addWidget(kind_);
  auto* bottom = new QFormLayout;
  bottom->addRow(tr("Prices"), pricesRow());
  alerts_ = edit(QStringLiteral("alerts"), {}, tr("e.g. exposed_comm > 40% for 2m -> notify; loss is nan -> notify,stop"));
  alerts_->setToolTip(tr("Alert rules, separated by ';': KPI OP VALUE [for DURATION] [-> ACTIONS] (docs/alerts.md)"));
  bottom->addRow(tr("Alerts"), alerts_);
  notify_ = edit(QStringLiteral("notify"), {}, tr("webhook URLs, separated by blanks (alone: the default rules)"));
  bottom->addRow(tr("Notify"), notify_);
  budget_ = edit(QStringLiteral("budget"), {}, tr("stop with a checkpoint once the job's cost reaches this"));
  bottom->addRow(tr("Budget"), budget_);
  bottom->addRow(tr("Each rank"), fencesRow());
  layout->addLayout(bottom);

  error_ = new QLabel(this);
  error_->setObjectName(QStringLiteral("error"));
  error_->setWordWrap(true);
  QPalette errorPalette = error_->palette();
  errorPalette.setColor(QPalette::WindowText, palette().color(QPalette::Window).lightness() < 128 ? QColor(255, 120, 110)
                                                                                                  : QColor(190, 30, 30));
  error_->setPalette(errorPalette);
  layout->addWidget(error_);
  buttons_ = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
  buttons_->button(QDialogButtonBox::Ok)->setText(tr("Start"));
  buttons_->button(QDialogButtonBox::Ok)->setObjectName(QStringLiteral("start"));
  connect(buttons_, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons_, &QDialogButtonBox::rejected, this, &QDialog::reject);
  layout->addWidget(buttons_);
  revalidate();
}

void LauncherDialog::setField(const QString& name, const QVariant& value) {
  if (auto* e = findChild<QLineEdit*>(name)) e->setText(value.toString());
  if (auto* s = findChild<QSpinBox*>(name)) s->setValue(value.toInt());
  if (auto* c = findChild<QComboBox*>(name)) c->setCurrentIndex(value.toInt());
  if (auto* b = findChild<QCheckBox*>(name)) b->setChecked(value.toBool());
  if (auto* r = findChild<QRadioButton*>(name)) r->setChecked(value.toBool());
  if (auto* t = findChild<QTabWidget*>(name)) t->setCurrentIndex(value.toInt());
}

QString LauncherDialog::error() const { return placed_ ? QString() : error_->text(); }

Result<JobSpec> LauncherDialog::build() {
  JobSpec s;
  if (kind_->currentIndex() == 1) {
    LOCKSTEP_ASSIGN_OR_RETURN(s, programJob());
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(s, trainerJob());
  }
  s.jobId = jobId_->text().trimmed().toStdString();
  s.backend = static_cast<Backend>(backend_->currentData().toInt());
  LOCKSTEP_ASSIGN_OR_RETURN(s.prices.gpuHour, real(priceGpu_, tr("price per GPU-hour")));
  LOCKSTEP_ASSIGN_OR_RETURN(s.prices.coreHour, real(priceCore_, tr("price per core-hour")));
  LOCKSTEP_ASSIGN_OR_RETURN(s.prices.kwh, real(priceKwh_, tr("price per kWh")));
  s.prices.currency = currency_->text().trimmed().toStdString();
  LOCKSTEP_TRY(alerting(s));
  LOCKSTEP_TRY(fences(s));
  if (where_->currentIndex() > 0) {
    LOCKSTEP_TRY(store_.idFree(s));  // now, not once the allocation came
    return checkedForSlurm(std::move(s));
  }
  std::vector<std::pair<QString, std::uint32_t>> ranks;
  for (int row = 0; row < agents_->rowCount(); ++row) {
    const auto* spin = qobject_cast<QSpinBox*>(agents_->cellWidget(row, 5));
    ranks.emplace_back(agents_->item(row, 0)->text(), static_cast<std::uint32_t>(spin->value()));
  }
  if (agents_->rowCount() == 0) return invalidArgument("no agent is connected: add one with Cluster ▸ Add Agent");
  return store_.place(s, ranks);
}

// A Slurm job is placed once its agents are up (SlurmLauncher); until then it is checked with the
// agents' rules on stand-in nodes, so that what the form says is wrong is what they would say.
Result<JobSpec> LauncherDialog::checkedForSlurm(JobSpec spec) {
  SlurmRequest r;
  r.allocation.nodes = static_cast<std::uint32_t>(slurmNodes_->value());
  r.allocation.gpusPerNode = static_cast<std::uint32_t>(slurmGpus_->value());
  r.allocation.time = slurmTime_->text().trimmed().toStdString();
  r.allocation.partition = slurmPartition_->text().trimmed().toStdString();
  r.allocation.account = slurmAccount_->text().trimmed().toStdString();
  r.ranks = static_cast<std::uint32_t>(slurmRanks_->value());
  const bool gpus = r.allocation.gpusPerNode > 0;
  if (gpus != (spec.backend == Backend::kCuda)) {
    return invalidArgument(gpus ? "GPUs per node gives each rank a GPU: choose GPU ranks"
                                : "GPU ranks on Slurm: say how many GPUs per node to ask for");
  }
  JobSpec check = spec;
  check.worldSize = gpus ? r.allocation.nodes * r.allocation.gpusPerNode : r.ranks;
  for (std::uint32_t rank = 0; rank < check.worldSize; ++rank) {
    const std::uint32_t node = gpus ? rank / r.allocation.gpusPerNode : rank % r.allocation.nodes;
    const std::uint32_t local = gpus ? rank % r.allocation.gpusPerNode : rank / r.allocation.nodes;
    check.ranks.push_back({rank, "slurm-node-" + std::to_string(node), local, gpus ? std::optional(local) : std::nullopt});
  }
  LOCKSTEP_TRY(validateJobSpec(check));
  spec.worldSize = check.worldSize;
  slurm_ = r;
  return spec;
}

// The job's alert rules, webhooks and budget, checked as lockstepctl checks --alert and --notify.
Result<void> LauncherDialog::alerting(JobSpec& s) const {
  for (const QString& rule : alerts_->text().split(QLatin1Char(';'), Qt::SkipEmptyParts)) {
    if (!rule.trimmed().isEmpty()) s.alertRules.push_back(rule.trimmed().toStdString());
  }
  LOCKSTEP_TRY(alerts::parseRules(s.alertRules));
  for (const QString& url : notify_->text().split(QLatin1Char(' '), Qt::SkipEmptyParts)) {
    s.notify.push_back(url.toStdString());
    if (auto ok = alerts::checkWebhookUrl(s.notify.back()); !ok) return ok.error().withContext("Notify");
  }
  if (!budget_->text().trimmed().isEmpty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.budget, real(budget_, tr("budget")));
  }
  return {};
}

Result<JobSpec> LauncherDialog::programJob() const {
  JobSpec s;
  CommandSpec c;
  c.argv.push_back(program_->text().trimmed().toStdString());
  for (const QString& word : QProcess::splitCommand(arguments_->text())) c.argv.push_back(word.toStdString());
  c.workingDir = workingDir_->text().trimmed().toStdString();
  for (const QString& item : QProcess::splitCommand(environment_->text())) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto assignment, jobflags::parseEnvAssignment(item.toStdString()));
    c.env.push_back(std::move(assignment));
  }
  s.command = std::move(c);
  if (!programTarget_->text().trimmed().isEmpty()) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.targetLoss, real(programTarget_, tr("target loss")));
  }
  s.maxRestarts = static_cast<std::uint32_t>(programRestarts_->value());
  return s;
}

Result<JobSpec> LauncherDialog::trainerJob() const {
  JobSpec s;
  s.backend = static_cast<Backend>(backend_->currentData().toInt());
  s.precision = s.backend == Backend::kCuda ? Precision::kBf16 : Precision::kFp32;
  for (const QString& part : layers_->text().split(QLatin1Char(','))) {
    bool ok = false;
    const uint v = part.trimmed().toUInt(&ok);
    if (!ok) return invalidArgument(("MLP layers: '" + part.trimmed() + "' is not a whole number (write sizes like 784,1024,10)").toStdString());
    s.layers.push_back(v);
  }
  s.activation = static_cast<Activation>(activation_->currentData().toInt());
  if (synthetic_->isChecked()) {
    LOCKSTEP_ASSIGN_OR_RETURN(const auto samples, whole(samples_, tr("samples")));
    LOCKSTEP_ASSIGN_OR_RETURN(const auto seed, whole(dataSeed_, tr("seed")));
    s.dataset = SyntheticDataset{samples, s.layers.empty() ? 0 : s.layers.front(), s.layers.empty() ? 0 : s.layers.back(), seed};
  } else {
    s.dataset = NpyDataset{features_->text().trimmed().toStdString(), labels_->text().trimmed().toStdString()};
  }
  s.batchPerRank = static_cast<std::uint32_t>(batch_->value());
  s.accumSteps = static_cast<std::uint32_t>(accum_->value());
  s.optimizer.kind = static_cast<OptimizerKind>(optimizer_->currentData().toInt());
  LOCKSTEP_ASSIGN_OR_RETURN(s.optimizer.lr, real(lr_, tr("learning rate")));
  if (s.optimizer.kind == OptimizerKind::kSgd) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.optimizer.momentum, real(momentum_, tr("momentum")));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(s.optimizer.weightDecay, real(weightDecay_, tr("weight decay")));
  s.optimizer.lrScaling = linearScaling_->isChecked() ? LrScaling::kLinear : LrScaling::kNone;
  if (durationKind_->currentIndex() == 0) {
    s.steps = static_cast<std::uint64_t>(duration_->value());
  } else {
    s.epochs = static_cast<std::uint32_t>(duration_->value());
  }
  if (useTarget_->isChecked()) {
    LOCKSTEP_ASSIGN_OR_RETURN(s.targetLoss, real(targetLoss_, tr("target loss")));
  }
  s.checkpointDir = checkpointDir_->text().trimmed().toStdString();
  s.checkpointEvery = static_cast<std::uint32_t>(checkpointEvery_->value());
  if (bucketMb_->text().trimmed().compare(QStringLiteral("auto"), Qt::CaseInsensitive) == 0) {
    s.bucketMb = 0;
  } else {
    LOCKSTEP_ASSIGN_OR_RETURN(s.bucketMb, real(bucketMb_, tr("bucket MB (or auto)")));
  }
  s.rebalanceEvery = balance_->isEnabled() && balance_->isChecked() ? 10 : 0;
  LOCKSTEP_TRY(parallelism(s));
  s.maxRestarts = static_cast<std::uint32_t>(restarts_->value());
  s.timeoutS = static_cast<std::uint32_t>(timeout_->value());
  return s;
}

void LauncherDialog::revalidate() {
  const bool sgd = static_cast<OptimizerKind>(optimizer_->currentData().toInt()) == OptimizerKind::kSgd;
  momentum_->setEnabled(sgd);
  for (QWidget* w : {static_cast<QWidget*>(samples_), static_cast<QWidget*>(dataSeed_)}) w->setEnabled(synthetic_->isChecked());
  for (QWidget* w : {static_cast<QWidget*>(features_), static_cast<QWidget*>(labels_)}) w->setEnabled(npy_->isChecked());
  targetLoss_->setEnabled(useTarget_->isChecked());
  const bool program = kind_->currentIndex() == 1;
  backend_->setItemText(0, program ? tr("CPU ranks") : tr("CPU ranks (OpenBLAS + Gloo)"));
  backend_->setItemText(1, program ? tr("GPU ranks (one GPU each)") : tr("GPU ranks (CUDA + NCCL)"));
  const bool onSlurm = where_->currentIndex() > 0;
  slurmBox_->setVisible(onSlurm);
  agents_->setVisible(!onSlurm);
  slurmRanks_->setEnabled(slurmGpus_->value() == 0);
  offerParallelKinds(program);
  slurm_.reset();
  auto built = build();
  if (built) {
    placed_ = *built;
    error_->setText((program ? tr("%1 rank(s) of %2.").arg(built->worldSize).arg(QString::fromStdString(built->command->argv.front()))
                             : tr("%1 rank(s), global batch %2.").arg(built->worldSize).arg(built->globalBatch())) +
                    (slurm_ ? tr(" Slurm places them on %1 node(s) once its agents are up.").arg(slurm_->allocation.nodes)
                            : QString()));
    error_->setForegroundRole(QPalette::PlaceholderText);
  } else {
    placed_.reset();
    error_->setText(QString::fromStdString(built.error().message));
    error_->setForegroundRole(QPalette::WindowText);
  }
  buttons_->button(QDialogButtonBox::Ok)->setEnabled(placed_.has_value());
}

}  // namespace lockstep::app
