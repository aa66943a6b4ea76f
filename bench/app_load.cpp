// lockstep-bench-app: is the app smooth with 8 agents x 8 GPUs (or 128 x 8) streaming at the
// default rate?
//
// The real main window and dashboard (offscreen unless there is a display) are fed, the way the
// agent workers feed them (job lists to the store, messages to its ingest thread), a synthetic
// stream from a generator thread: one
// data-parallel job with a rank per GPU, each rank reporting every step, every GPU and rank process
// sampled at the agents' default 5 Hz, batches every 100 ms per agent (as the fetch loop delivers
// them). Two phases side by side in one run: idle (agents known, nothing streaming), then
// streaming. Per phase it prints the GUI thread's CPU use, how late a 5 ms probe timer fires
// (the event loop's responsiveness: what a user feels), repaints per second, and sample-to-pixel
// latency ("s2p": from a report's stamp at the generator to the first paint that shows it).
//
//   build/bin/lockstep-bench-app [--agents 8] [--gpus 8] [--steps-per-second 10] [--seconds 20]
//                                [--screenshot FILE.png] [--compressed-hours H] [--timeline]
//                                [--job-lists known|full|off] [--fan-in-nodes N]
//
// With --timeline, a third phase streams the same with the dashboard's Timeline tab shown. While
// streaming, each agent's job list comes every second as its worker polls it (--job-lists: without
// the spec, as the app asks for it; "full" as it was before issue 46; "off").
//
// A job on more nodes than --fan-in-nodes (the app's default, 128) is watched fanned in, as the app
// watches it (docs/fan-in.md): the agents' batches carry their nodes' own records alone (the agent
// leaves the job's out), and the job's supervising agent, here a real KPI tracker on the generator's
// thread folding every record, makes the job's frame every 100 ms as its supervision reads, stamped
// with the read's moment; ten times a second a frame newer than the last goes to the ingest thread
// (ranks 0-255 and the slowest, the nodes' blocks), as the worker asks for it naming the one it holds. s2p still counts from the newest report in the painted
// frame, so it holds the agent's poll and the worker's wait. `--fan-in-nodes 1000000` watches every
// stream, as before.
//
// With --compressed-hours, instead: H hours of the stream as fast as the app takes it, and the
// app's memory every 10 simulated minutes.

#include <QApplication>
#include <QPushButton>
#include <QElapsedTimer>
#include <QEventLoop>
#include <QLoggingCategory>
#include <QTemporaryDir>
#include <QTimer>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ClusterStore.h"
#include "DashboardWidget.h"
#include "TimelineWidget.h"
#include "HeatmapWidget.h"
#include "MainWindow.h"
#include "lockstep/kpi/frame.h"
#include "lockstep/net/keys.h"
#include "lockstep/protocol/job_list.h"
#include "lockstep/protocol/stream.h"
#include "process_figures.h"
#include "synthetic_stream.h"

namespace {

using namespace lockstep;
using lockstep::app::ClusterStore;

struct Options {
  int agents = 8;
  int gpus = 8;
  double stepsPerSecond = 10;
  double seconds = 20;
  int sampleHz = 5;  // the agent's default
  double compressedHours = 0;  // > 0: memory over that many hours of the stream, time-compressed
  QString screenshot;
  bool timeline = false;  // then a third phase: streaming with the Timeline tab shown
  // Each agent's job list every second, as its worker polls it: "known" (the spec left out, as the
  // app asks since issue 46), "full" (the spec in every list, as before), or "off".
  std::string jobLists = "known";
  lockstep::app::FanInRule fanIn;
};

double cpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}


QString agentId(int a) { return QStringLiteral("127.0.0.1:%1").arg(1 + a); }  // nothing listens: workers back off
using bench::nodeName;
using bench::rssMegabytes;
using bench::threadsCpuSeconds;

JobSpec makeJob(const Options& o) { return bench::SyntheticStream(o.agents, o.gpus, o.stepsPerSecond).job(); }

// Agent `a`'s status of the job: the whole spec, its own ranks.
JobStatus statusOf(const Options& o, const JobSpec& spec, int a) {
  JobStatus status;
  status.spec = spec;
  status.state = JobState::kRunning;
  status.startedUnixUs = nowUs();
  for (int g = 0; g < o.gpus; ++g) {
    RankStatus rank;
    rank.rank = static_cast<std::uint32_t>(a * o.gpus + g);
    rank.localRank = rank.gpuIndex.emplace(static_cast<std::uint32_t>(g));
    rank.pid = static_cast<std::uint32_t>(1000 + g);
    status.ranks.push_back(rank);
  }
  return status;
}

void announce(ClusterStore& store, const Options& o, const JobSpec& spec) {
  for (int a = 0; a < o.agents; ++a) {
    auto hello = std::make_shared<NodeHello>();
    hello->nodeName = nodeName(a);
    hello->host = "127.0.0.1";
    hello->cpuCores = 96;
    hello->sampleHz = static_cast<std::uint32_t>(o.sampleHz);
    for (int g = 0; g < o.gpus; ++g) {
      hello->gpus.push_back({static_cast<std::uint32_t>(g), "simulated GPU", "GPU-sim-" + std::to_string(a * o.gpus + g),
                             141ull << 30});
    }
    store.onHello(agentId(a), hello);
    store.onJobs(agentId(a), std::make_shared<const std::vector<JobStatus>>(std::vector<JobStatus>{statusOf(o, spec, a)}));
  }
}

// What the agents' workers hand on each second (--job-lists): one list shared by all agents (their
// own ranks aside, the lists are alike), or null.
app::JobList pollingList(const Options& o, const JobSpec& spec) {
  if (o.jobLists == "off") return nullptr;
  JobStatus status = statusOf(o, spec, 0);
  if (o.jobLists == "known") omitSpec(status);
  return std::make_shared<const std::vector<JobStatus>>(std::vector<JobStatus>{status});
}

// Every 100 ms, one batch per agent with what its ranks and GPUs produced in that time.
class Generator {
 public:
  Generator(ClusterStore& store, const Options& o, app::JobList jobLists = nullptr)
      : store_(store), o_(o), jobLists_(std::move(jobLists)) {
    const JobSpec spec = stream_.job();
    if (o.fanIn.fannedIn(spec)) supervisor_ = std::make_unique<kpi::JobTracker>(spec);
  }
  ~Generator() { stop(); }
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  // Instead of the live stream: `hours` of it as fast as the ingest thread takes it, the stamps an
  // hour apart from the first batch to the last, ending now. Prints the app's memory (RSS) every
  // 10 simulated minutes.
  void startCompressed(double hours) {
    thread_ = std::thread([this, hours] { runCompressed(hours); });
  }
  void stop() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
  }
  bool done() const { return done_.load(); }
  std::uint64_t messages() const { return messages_.load(); }
  std::uint64_t frameBytes() const { return frameBytes_.load(); }
  std::uint64_t framesSent() const { return framesSent_.load(); }
  std::uint64_t folded() const { return folded_.load(); }
  bool fannedIn() const { return supervisor_ != nullptr; }

 private:
  void run() {
    double stepDebt = 0, sampleDebt = 0;
    std::uint64_t ticks = 0;
    const auto tick = std::chrono::milliseconds(100);
    auto next = std::chrono::steady_clock::now();
    while (running_) {
      next += tick;
      std::this_thread::sleep_until(next);
      stepDebt += o_.stepsPerSecond * 0.1;
      sampleDebt += o_.sampleHz * 0.1;
      const int steps = static_cast<int>(stepDebt), samples = static_cast<int>(sampleDebt);
      stepDebt -= steps;
      sampleDebt -= samples;
      sendTick(steps, samples, nowUs());
      if (++ticks % 10 == 0) sendJobLists();
      pollFrame();
      sendFrame();
    }
  }

  // As each agent's worker does every second: its job list to the store (GUI thread) and to the
  // ingest thread, queued.
  void sendJobLists() {
    if (!jobLists_) return;
    for (int a = 0; a < o_.agents; ++a) {
      const QString id = agentId(a);
      // By value: the ingest thread may take them after this generator is gone.
      QMetaObject::invokeMethod(&store_, [store = &store_, id, list = jobLists_] { store->onJobs(id, list); },
                                Qt::QueuedConnection);
      QMetaObject::invokeMethod(&store_.ingest(), [ingest = &store_.ingest(), id, list = jobLists_] { ingest->onJobs(id, list); },
                                Qt::QueuedConnection);
    }
  }

  void runCompressed(double hours) {
    const auto ticks = static_cast<std::int64_t>(hours * 36'000);
    const std::int64_t end = nowUs(), start = end - ticks * 100'000;
    const auto wall = std::chrono::steady_clock::now();
    double stepDebt = 0, sampleDebt = 0;
    for (std::int64_t t = 1; t <= ticks && running_; ++t) {
      stepDebt += o_.stepsPerSecond * 0.1;
      sampleDebt += o_.sampleHz * 0.1;
      const int steps = static_cast<int>(stepDebt), samples = static_cast<int>(sampleDebt);
      stepDebt -= steps;
      sampleDebt -= samples;
      sendTick(steps, samples, start + t * 100'000);
      // Back-pressure: wait until the ingest thread has taken this tick, so that nothing queues.
      QMetaObject::invokeMethod(&store_.ingest(), [] {}, Qt::BlockingQueuedConnection);
      if (t % 6000 == 0) {  // 10 simulated minutes
        std::printf("%8.0f min %10.0f MB RSS %10.1f s wall %12llu messages\n", static_cast<double>(t) / 600, rssMegabytes(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count(),
                    static_cast<unsigned long long>(messages_.load()));
        std::fflush(stdout);
      }
    }
    done_ = true;
  }

  // As the supervising agent makes the job's frame at each read (JobAlerts::takeFrame)...
  void pollFrame() {
    if (!supervisor_) return;
    const std::int64_t now = nowUs();
    kpi::JobKpis k = supervisor_->snapshot(now);
    const auto ranks = std::move(k.ranks);
    const auto gpus = std::move(k.gpus);
    auto frame = std::make_shared<FrameReply>();
    frame->jobId = k.jobId;
    frame->timeUnixUs = now;
    kpi::JobKpis framed = kpi::withRanks(std::move(k), ranks, gpus, 0, 256);
    framed.nodeBlocks = kpi::nodeBlocks(supervisor_->spec().ranks, ranks, gpus);  // the app asks for the heatmap's blocks
    frame->kpis = kpi::encodeFrame(framed);
    std::lock_guard lock(mutex_);
    newestReportOf_[now] = supervisor_->lastReportUnixUs();
    polled_ = std::move(frame);
  }
  // ... and its worker hands a newer one on, asking ten times a second (AgentWorker::askFrames).
  void sendFrame() {
    app::FramePtr frame;
    {
      std::lock_guard lock(mutex_);
      frame = polled_;
    }
    if (!frame || frame == sent_) return;  // the frame held: it comes without its KPIs, and is not handed on
    sent_ = frame;
    ++framesSent_;
    frameBytes_ += frame->kpis.size();
    {
      std::lock_guard lock(mutex_);
      handedAt_.try_emplace(frame->timeUnixUs, nowUs());
    }
    QMetaObject::invokeMethod(&store_.ingest(), [ingest = &store_.ingest(), frame] { ingest->onFrame(agentId(0), frame); },
                              Qt::QueuedConnection);
  }

 public:
  // The stamp of the newest report in what the dashboard shows as of `shownUs`: a frame's moment is
  // its poll's, after its newest report.
  std::int64_t newestReport(std::int64_t shownUs) const {
    std::lock_guard lock(mutex_);
    const auto it = newestReportOf_.find(shownUs);
    return it == newestReportOf_.end() ? shownUs : it->second;
  }
  std::int64_t handedAt(std::int64_t shownUs) const {
    std::lock_guard lock(mutex_);
    const auto it = handedAt_.find(shownUs);
    return it == handedAt_.end() ? 0 : it->second;
  }

 private:

  // One batch per agent with what its ranks and GPUs produced in 100 ms ending at `now`.
  void sendTick(int steps, int samples, std::int64_t now) {
    stream_.startTick(0.1);
    for (int a = 0; a < o_.agents; ++a) {
      std::vector<StreamMessage> batch = stream_.batchOf(a, steps, samples, now);
      if (supervisor_) {  // the supervising agent reads it all; the app gets the nodes' own records
        for (const auto& m : batch) visitRecord(m, *supervisor_);
        folded_ += batch.size();
        std::erase_if(batch, [](const StreamMessage& m) { return !jobOf(m.payload).empty(); });
      }
      if (batch.empty()) continue;
      messages_ += batch.size();
      // As an agent worker does: the store hands it to the ingest thread.
      store_.onMessages(agentId(a), std::make_shared<const std::vector<StreamMessage>>(std::move(batch)));
    }
    stream_.endTick(steps);
  }

  ClusterStore& store_;
  Options o_;
  std::thread thread_;
  std::atomic<bool> running_{true};
  std::atomic<std::uint64_t> messages_{0};
  std::atomic<bool> done_{false};
  bench::SyntheticStream stream_{o_.agents, o_.gpus, o_.stepsPerSecond};
  app::JobList jobLists_;
  std::unique_ptr<kpi::JobTracker> supervisor_;  // the job's supervising agent's, when it is fanned in
  std::atomic<std::uint64_t> frameBytes_{0};
  app::FramePtr sent_;  // the newest frame handed on (the generator's thread)
  std::atomic<std::uint64_t> framesSent_{0};
  std::atomic<std::uint64_t> folded_{0};  // records the supervising agent took
  mutable std::mutex mutex_;  // the frames, which the GUI thread looks up
  app::FramePtr polled_;
  std::map<std::int64_t, std::int64_t> newestReportOf_;  // by frame moment
  std::map<std::int64_t, std::int64_t> handedAt_;        // by frame moment: when it first went to the ingest
};

// Counts the dashboard's repaints (the heatmap is painted on every refresh that brought data) and
// how old the newest report each one shows is: sample-to-pixel latency, from the stamp the
// generator put on it to the paint that first shows it.
class FrameCounter : public QObject {
 public:
  explicit FrameCounter(const lockstep::app::DashboardWidget& dashboard) : dashboard_(dashboard) {}
  int frames = 0;
  std::vector<double> latencyMs;
  // What the dashboard's moment holds: the newest report's stamp (a fanned-in job's frame is of a poll).
  std::function<std::int64_t(std::int64_t)> newestReport = [](std::int64_t shownUs) { return shownUs; };
  // And when that frame reached the app (0: not a frame): from there to the paint is the app's part.
  std::function<std::int64_t(std::int64_t)> handedAt = [](std::int64_t) { return std::int64_t{0}; };
  std::vector<double> appLatencyMs;
  bool eventFilter(QObject* watched, QEvent* event) override {
    if (event->type() == QEvent::Paint) {
      ++frames;
      const std::int64_t moment = dashboard_.shownUpToUnixUs();
      const std::int64_t shown = newestReport(moment);
      if (shown > lastShown_ && lastShown_ > 0) {
        latencyMs.push_back(static_cast<double>(nowUs() - shown) / 1e3);
        if (const std::int64_t handed = handedAt(moment); handed > 0) {
          appLatencyMs.push_back(static_cast<double>(nowUs() - handed) / 1e3);
        }
      }
      lastShown_ = shown;
    }
    return QObject::eventFilter(watched, event);
  }

 private:
  const lockstep::app::DashboardWidget& dashboard_;
  std::int64_t lastShown_ = 0;
};

struct PhaseResult {
  double guiCpuFraction = 0;
  double ingestCpuFraction = 0;  // the ingest thread: folding records in, publishing KPIs
  double processCpuFraction = 0;  // every thread: GUI, ingest, workers, the generator
  double p50LateMs = 0, p99LateMs = 0, maxLateMs = 0;
  double framesPerSecond = 0;
  double messagesPerSecond = 0;
  double p50LatencyMs = 0, p99LatencyMs = 0;  // sample to pixel
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(static_cast<double>(v.size()) * p))];
}

// Runs the event loop for `seconds`, probing its lateness with a 5 ms timer.
PhaseResult runPhase(double seconds, FrameCounter& frames, const Generator* generator) {
  std::vector<double> late;
  QElapsedTimer clock;
  clock.start();
  qint64 expected = 5;
  QTimer probe;
  probe.setTimerType(Qt::PreciseTimer);
  probe.setInterval(5);
  QObject::connect(&probe, &QTimer::timeout, [&] {
    const qint64 t = clock.elapsed();
    late.push_back(static_cast<double>(std::max<qint64>(0, t - expected)));
    expected = t + 5;
  });
  const int frames0 = frames.frames;
  const std::size_t latency0 = frames.latencyMs.size();
  const std::uint64_t messages0 = generator ? generator->messages() : 0;
  const double cpu0 = cpuSeconds(CLOCK_THREAD_CPUTIME_ID), process0 = cpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
  const double ingest0 = threadsCpuSeconds("ingest");
  probe.start();
  // A local loop: QApplication::quit() would close the window (Qt 6), and a closed window paints nothing.
  QEventLoop loop;
  QTimer::singleShot(static_cast<int>(seconds * 1000), &loop, &QEventLoop::quit);
  loop.exec();
  probe.stop();
  PhaseResult r;
  const double wall = static_cast<double>(clock.elapsed()) / 1000.0;
  r.guiCpuFraction = (cpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu0) / wall;
  r.processCpuFraction = (cpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - process0) / wall;
  r.ingestCpuFraction = (threadsCpuSeconds("ingest") - ingest0) / wall;
  r.p50LateMs = percentile(late, 0.5);
  r.p99LateMs = percentile(late, 0.99);
  r.maxLateMs = late.empty() ? 0 : *std::max_element(late.begin(), late.end());
  const std::vector<double> latency(frames.latencyMs.begin() + static_cast<std::ptrdiff_t>(latency0), frames.latencyMs.end());
  r.p50LatencyMs = percentile(latency, 0.5);
  r.p99LatencyMs = percentile(latency, 0.99);
  r.framesPerSecond = (frames.frames - frames0) / wall;
  r.messagesPerSecond = generator ? static_cast<double>(generator->messages() - messages0) / wall : 0;
  return r;
}

void print(const char* name, const PhaseResult& r) {
  std::printf("%-10s %10.0f %12.1f %12.1f %12.1f %12.1f %12.1f %12.1f %10.1f %12.1f %12.1f\n", name, r.messagesPerSecond,
              r.guiCpuFraction * 100, r.ingestCpuFraction * 100, r.processCpuFraction * 100, r.p50LateMs, r.p99LateMs, r.maxLateMs, r.framesPerSecond, r.p50LatencyMs,
              r.p99LatencyMs);
}

// The app's memory over hours of the stream, fed as fast as the ingest thread takes it while the
// window keeps refreshing: flat once the chart series are full (kpi::Settings::seriesCapacity).
int compressed(ClusterStore& store, const Options& o) {
  std::printf("time-compressed: %.1f h of the stream; RSS every 10 simulated minutes\n", o.compressedHours);
  const double before = rssMegabytes();
  std::printf("%8d min %10.0f MB RSS (agents and job known, nothing streamed)\n", 0, before);
  Generator generator(store, o);
  generator.startCompressed(o.compressedHours);
  QEventLoop loop;
  QTimer poll;
  QObject::connect(&poll, &QTimer::timeout, [&] {
    if (generator.done()) loop.quit();
  });
  poll.start(100);
  loop.exec();
  generator.stop();
  std::printf("after %.1f h: %.0f MB RSS, %.0f MB over the start\n", o.compressedHours, rssMegabytes(),
              rssMegabytes() - before);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "lockstep-bench-app: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--agents") o.agents = std::atoi(next());
    else if (a == "--gpus") o.gpus = std::atoi(next());
    else if (a == "--steps-per-second") o.stepsPerSecond = std::atof(next());
    else if (a == "--seconds") o.seconds = std::atof(next());
    else if (a == "--screenshot") o.screenshot = QString::fromLocal8Bit(next());
    else if (a == "--compressed-hours") o.compressedHours = std::atof(next());
    else if (a == "--timeline") o.timeline = true;
    else if (a == "--job-lists") o.jobLists = next();
    else if (a == "--fan-in-nodes") o.fanIn.nodesOver = static_cast<std::size_t>(std::atoll(next()));
    else {
      std::fprintf(stderr,
                   "usage: lockstep-bench-app [--agents 8] [--gpus 8] [--steps-per-second 10] [--seconds 20] "
                   "[--screenshot FILE.png] [--compressed-hours H] [--timeline] [--job-lists known|full|off] "
                   "[--fan-in-nodes N]\n");
      return 2;
    }
  }
  if (o.jobLists != "known" && o.jobLists != "full" && o.jobLists != "off") {
    std::fprintf(stderr, "lockstep-bench-app: --job-lists is known, full or off, not '%s'\n", o.jobLists.c_str());
    return 2;
  }
  if (o.agents < 1 || o.gpus < 1 || o.seconds <= 0 || o.stepsPerSecond <= 0) {
    std::fprintf(stderr, "lockstep-bench-app: --agents, --gpus, --seconds and --steps-per-second must be positive\n");
    return 2;
  }
  if (!std::getenv("DISPLAY") && !std::getenv("WAYLAND_DISPLAY")) setenv("QT_QPA_PLATFORM", "offscreen", 0);

  QApplication application(argc, argv);
  QLoggingCategory::setFilterRules(QStringLiteral("lockstep.agent.info=false"));  // its agents never answer
  QTemporaryDir config;  // no pinned agents: the bench adds its own
  auto keys = generateKeyPair();
  if (!keys) {
    std::fprintf(stderr, "lockstep-bench-app: %s\n", keys.error().message.c_str());
    return 1;
  }
  ClusterStore store(*keys, nullptr, nullptr, o.fanIn);
  lockstep::app::MainWindow window(store, config.path());
  FrameCounter frames(*window.dashboard());
  window.resize(1500, 950);
  window.show();
  auto* heatmap = window.dashboard()->findChild<lockstep::app::HeatmapWidget*>();
  if (!heatmap) {
    std::fprintf(stderr, "lockstep-bench-app: the dashboard has no heatmap\n");
    return 1;
  }
  heatmap->installEventFilter(&frames);
  for (int a = 0; a < o.agents; ++a) store.addAgent({"127.0.0.1", static_cast<std::uint16_t>(1 + a)}, keys->publicKey);
  const JobSpec spec = makeJob(o);
  announce(store, o, spec);

  std::printf("lockstep-bench-app: %d agents x %d GPUs, one rank per GPU at %.0f steps/s, samples at %d Hz, job lists "
              "%s, %s, %s\n",
              o.agents, o.gpus, o.stepsPerSecond, o.sampleHz, o.jobLists.c_str(), qPrintable(QGuiApplication::platformName()),
              o.fanIn.fannedIn(spec) ? "the job fanned in (frames from its supervising agent)" : "every record to the app");
  if (o.compressedHours > 0) return compressed(store, o);
  std::printf("%-10s %10s %12s %12s %12s %12s %12s %12s %10s %12s %12s\n", "phase", "msgs/s", "GUI CPU %", "ingest CPU %", "all CPU %",
              "late p50 ms",
              "late p99 ms", "late max ms", "repaints/s", "s2p p50 ms", "s2p p99 ms");
  const PhaseResult idle = runPhase(o.seconds / 2, frames, nullptr);
  print("idle", idle);
  Generator generator(store, o, pollingList(o, spec));
  QElapsedTimer wallSeconds;
  wallSeconds.start();
  frames.newestReport = [&generator](std::int64_t shownUs) { return generator.newestReport(shownUs); };
  frames.handedAt = [&generator](std::int64_t shownUs) { return generator.handedAt(shownUs); };
  generator.start();
  (void)runPhase(2, frames, &generator);  // warm-up: the charts fill their first points
  const PhaseResult streaming = runPhase(o.seconds, frames, &generator);
  print("streaming", streaming);
  if (o.timeline) {
    // The same stream, side by side, with the timeline in view (following the newest steps).
    auto* timeline = window.dashboard()->timeline();
    timeline->installEventFilter(&frames);
    window.dashboard()->showTimeline();
    (void)runPhase(2, frames, &generator);
    print("timeline", runPhase(o.seconds, frames, &generator));
    // As a user at 1024 ranks would: the slowest rank's lane (rank 13), a click away.
    if (auto* toSlowest = window.dashboard()->findChild<QPushButton*>(QStringLiteral("timelineSlowest"))) toSlowest->click();
  }
  if (!o.screenshot.isEmpty()) {
    window.refreshNow();
    window.grab().save(o.screenshot);
    std::printf("window: %d x %d (given 1500 x 950)\n", window.width(), window.height());
  }

  generator.stop();
  frames.newestReport = [](std::int64_t shownUs) { return shownUs; };
  frames.handedAt = [](std::int64_t) { return std::int64_t{0}; };
  if (generator.fannedIn()) {
    std::printf("\nframe reaching the app -> paint (the app's part of s2p), the whole run: p50 %.1f ms, p99 %.1f ms\n",
                percentile(frames.appLatencyMs, 0.5), percentile(frames.appLatencyMs, 0.99));
    const double seconds = static_cast<double>(wallSeconds.elapsed()) / 1e3;
    std::printf("\nframes to the app: %.1f KB/s (%.1f a second), beside the nodes' own records (msgs/s above); the "
                "generator's thread made and folded (as the supervising agent) %.0f records/s of a nominal %.0f\n",
                static_cast<double>(generator.frameBytes()) / 1e3 / seconds,
                static_cast<double>(generator.framesSent()) / seconds, static_cast<double>(generator.folded()) / seconds,
                o.agents * o.gpus * (o.stepsPerSecond + 2.0 * o.sampleHz));
  }

  std::printf("\nratios (streaming / idle): GUI CPU %.1fx, probe lateness p99 %.1f ms vs %.1f ms\n",
              streaming.guiCpuFraction / std::max(idle.guiCpuFraction, 1e-3), streaming.p99LateMs, idle.p99LateMs);
  std::printf("GUI thread headroom while streaming: %.0f%% idle; a 40 ms frame budget %s at p99\n",
              100 * (1 - streaming.guiCpuFraction), streaming.p99LateMs <= 40 ? "holds" : "is exceeded");
  return 0;
}
