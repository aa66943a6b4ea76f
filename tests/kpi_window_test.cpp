// The KPI engine's window sums (kpi/src/rank_window.h): a tracker that has run a long time, its
// reports summed in and taken out again as they aged, reads the same figures as a tracker fed only
// the reports its window holds, which sums them from nothing. Random streams with what makes the
// bookkeeping hard: reports of every shape (timed or not, collectives and spans of several kinds
// coming and going, whole and fractional FLOPs, peaks, model state, staleness), a clock that goes
// back, reports newer than the moment read, restarts, world sizes that change, bytes and tokens
// past 2^53.

#include <gtest/gtest.h>

#include <cmath>
#include <deque>
#include <map>
#include <random>

#include "lockstep/kpi/kpi.h"

namespace lockstep::kpi {
namespace {

constexpr std::int64_t kWindowUs = 2'000'000;
constexpr std::uint32_t kRanks = 3;

// Asynchronous ranks (staleness) and fractional FLOPs make a rank's window walked instead of
// read from its sums: only some seeds have them, so that both ways are held to the fresh tracker.
class Reports {
 public:
  explicit Reports(unsigned seed) : rng_(seed), stale_(seed % 2 == 0), fractional_(seed % 3 == 0) {}

  StepReport next(std::uint32_t rank, std::uint32_t attempt, std::uint64_t step, std::int64_t timeUs) {
    StepReport r;
    r.jobId = "window";
    r.rank = rank;
    r.worldSize = chance(0.2) ? kRanks + 1 : kRanks;  // the newest report's sets the bus bandwidth's
    r.attempt = attempt;
    r.step = step;
    r.samples = static_cast<std::uint32_t>(between(1, 512));
    r.stepTimeUs = between(1'000, 300'000);
    r.timeUnixUs = timeUs;
    if (chance(0.8)) {
      r.dataTimeUs = between(0, 5'000);
      r.computeTimeUs = between(1'000, 200'000);
      r.exposedCommTimeUs = between(0, 50'000);
    }
    if (chance(0.5)) r.tokens = huge(between(1, 1 << 20));
    if (chance(0.5)) r.bytesReduced = huge(between(0, 1 << 30));
    if (chance(0.3)) r.allreduceTimeUs = between(0, 40'000);
    for (const auto kind : {CollectiveKind::kAllReduce, CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                            CollectiveKind::kBarrier}) {
      if (!chance(0.4)) continue;
      r.collectives.push_back({kind, static_cast<std::uint32_t>(between(0, 4)), between(0, 30'000), between(0, 10'000),
                               kind == CollectiveKind::kBarrier ? 0u : huge(between(0, 1 << 28))});
    }
    const auto spans = between(0, 3);
    for (std::int64_t i = 0; i < spans && !r.collectives.empty(); ++i) {
      r.collectiveSpans.push_back({r.collectives[static_cast<std::size_t>(i) % r.collectives.size()].kind,
                                   timeUs - between(0, 100'000), between(1, 10'000), between(0, 5'000), 1024});
    }
    if (chance(0.6)) {
      r.flops = fractional_ && chance(0.1) ? static_cast<double>(between(1, 1'000'000)) + 0.5
                            : static_cast<double>(between(1, 1'000'000)) * 1e9;  // past 2^53 over a window
      if (chance(0.7)) r.flopsBasis = chance(0.5) ? FlopsBasis::kDeclared : FlopsBasis::kTokens;
    }
    if (chance(0.5)) r.peakFlops = static_cast<double>(between(1, 1000)) * 1e12;
    if (chance(0.3)) r.paramBytes = static_cast<std::uint64_t>(between(1, 1 << 30));
    if (chance(0.2)) r.gradBytes = static_cast<std::uint64_t>(between(1, 1 << 30));
    if (chance(0.2)) r.optimizerStateBytes = static_cast<std::uint64_t>(between(1, 1 << 30));
    if (stale_ && chance(0.1)) r.staleness = static_cast<std::uint32_t>(between(0, 8));
    return r;
  }

  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  // Now and then past 2^53, where a sum in doubles would lose what it took in.
  std::uint64_t huge(std::int64_t value) {
    return static_cast<std::uint64_t>(value) + (chance(0.05) ? std::uint64_t{1} << 60 : 0);
  }
  std::int64_t between(std::int64_t lo, std::int64_t hi) { return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng_); }

 private:
  std::mt19937_64 rng_;
  bool stale_, fractional_;
};

// What a rank's window holds, by the tracker's rule: reports in arrival order, the oldest dropped
// while they are a window older than the newest to arrive, all of them at a restart.
struct WindowModel {
  std::map<std::uint32_t, std::deque<StepReport>> ranks;

  void add(const StepReport& r) {
    auto& window = ranks[r.rank];
    if (!window.empty() && window.back().attempt < r.attempt) window.clear();
    window.push_back(r);
    while (!window.empty() && window.front().timeUnixUs <= r.timeUnixUs - kWindowUs) window.pop_front();
  }
  // A tracker fed only what the windows hold at `nowUs`: it sums them from nothing.
  JobTracker heldAt(const JobSpec& spec, const Settings& settings, std::int64_t nowUs) const {
    JobTracker fresh(spec, settings);
    for (const auto& [rank, window] : ranks) {
      for (const auto& r : window) {
        if (r.timeUnixUs > nowUs - kWindowUs && r.timeUnixUs <= nowUs) fresh.add(r, "node-" + std::to_string(rank));
      }
    }
    return fresh;
  }
};

void expectSame(const Maybe& a, const Maybe& b, const char* what, std::uint32_t rank) {
  ASSERT_EQ(a.has_value(), b.has_value()) << what << " of rank " << rank;
  if (a) {
    EXPECT_EQ(*a, *b) << what << " of rank " << rank;
  }
}

// Figures that do not depend on when a rank's first step began (which the fresh tracker does not
// know): those per step, per byte, the newest report's, and the rates' ratios.
void expectSameRank(const RankKpis& a, const RankKpis& b) {
  const auto r = a.rank;
  expectSame(a.meanStepUs, b.meanStepUs, "mean step", r);
  expectSame(a.samplesPerStep, b.samplesPerStep, "samples per step", r);
  expectSame(a.meanDataUs, b.meanDataUs, "data", r);
  expectSame(a.meanComputeUs, b.meanComputeUs, "compute", r);
  expectSame(a.meanExposedUs, b.meanExposedUs, "exposed", r);
  expectSame(a.commOverhead, b.commOverhead, "comm overhead", r);
  expectSame(a.algBandwidth, b.algBandwidth, "algorithm bandwidth", r);
  expectSame(a.busBandwidth, b.busBandwidth, "bus bandwidth", r);
  expectSame(a.paramBytes, b.paramBytes, "param bytes", r);
  expectSame(a.gradBytes, b.gradBytes, "gradient bytes", r);
  expectSame(a.optimizerStateBytes, b.optimizerStateBytes, "optimizer state bytes", r);
  expectSame(a.stalenessMean, b.stalenessMean, "staleness mean", r);
  expectSame(a.stalenessP99, b.stalenessP99, "staleness p99", r);
  expectSame(a.peakFlops, b.peakFlops, "peak", r);
  ASSERT_EQ(a.collectives.size(), b.collectives.size()) << "collective kinds of rank " << r;
  for (std::size_t i = 0; i < a.collectives.size(); ++i) {
    EXPECT_EQ(a.collectives[i].kind, b.collectives[i].kind);
    EXPECT_EQ(a.collectives[i].perStep, b.collectives[i].perStep);
    expectSame(a.collectives[i].timeShare, b.collectives[i].timeShare, "collective time share", r);
    expectSame(a.collectives[i].exposedShare, b.collectives[i].exposedShare, "collective exposed share", r);
    expectSame(a.collectives[i].bytesPerStep, b.collectives[i].bytesPerStep, "collective bytes", r);
    expectSame(a.collectives[i].busBandwidth, b.collectives[i].busBandwidth, "collective bus bandwidth", r);
  }
  const auto perSample = [](const Maybe& rate, const Maybe& samples) -> Maybe {
    return rate && samples && *samples > 0 ? Maybe(*rate / *samples) : std::nullopt;
  };
  for (const auto& [rate, what] : {std::pair{&RankKpis::tokensPerSecond, "tokens"}, {&RankKpis::modelFlopsPerSecond, "FLOPs"}}) {
    const Maybe x = perSample(a.*rate, a.samplesPerSecond), y = perSample(b.*rate, b.samplesPerSecond);
    ASSERT_EQ(x.has_value(), y.has_value()) << what << " of rank " << r;
    if (x) {
      EXPECT_NEAR(*x, *y, 1e-12 * std::fabs(*y)) << what << " per sample of rank " << r;
    }
  }
}

// `a` the long-running tracker's, `b` the fresh one's. A rank whose window holds nothing is only in
// `a`, without figures; one whose held reports are all of an attempt before the newest is left out
// of both, unless the newest attempt's reports are all after the moment read, which only `a` saw.
void expectSameKpis(const JobKpis& a, const JobKpis& b) {
  std::map<std::uint32_t, const RankKpis*> fresh;
  for (const auto& r : b.ranks) fresh[r.rank] = &r;
  bool sameRanks = a.ranks.size() == b.ranks.size();
  for (const auto& r : a.ranks) {
    const auto it = fresh.find(r.rank);
    if (it == fresh.end()) {
      EXPECT_FALSE(r.meanStepUs) << "rank " << r.rank << " has figures from a window that holds nothing";
      sameRanks = false;
      continue;
    }
    expectSameRank(r, *it->second);
  }
  if (!sameRanks) return;
  expectSame(a.bytesReducedPerStep, b.bytesReducedPerStep, "bytes reduced per step", 0);
  expectSame(a.exposedEnds.firstShare, b.exposedEnds.firstShare, "first collective's share", 0);
  expectSame(a.exposedEnds.lastShare, b.exposedEnds.lastShare, "last collective's share", 0);
  if (a.exposedEnds.firstShare) {
    EXPECT_EQ(a.exposedEnds.firstKind, b.exposedEnds.firstKind);
  }
  if (a.exposedEnds.lastShare) {
    EXPECT_EQ(a.exposedEnds.lastKind, b.exposedEnds.lastKind);
  }
}

class WindowSums : public ::testing::TestWithParam<unsigned> {};

TEST_P(WindowSums, ALongRunningTrackerReadsWhatItsWindowHoldsSummedAfresh) {
  Reports gen(GetParam());
  JobSpec spec;
  spec.jobId = "window";
  spec.worldSize = kRanks;
  Settings settings;
  settings.windowSeconds = static_cast<double>(kWindowUs) / 1e6;
  JobTracker tracker(spec, settings);
  WindowModel model;
  std::map<std::uint32_t, std::int64_t> clock;
  std::map<std::uint32_t, std::uint64_t> steps;
  std::uint32_t attempt = 0;
  std::int64_t newest = 1'700'000'000'000'000;
  int compared = 0;
  for (int i = 0; i < 3000; ++i) {
    if (gen.chance(0.002)) {  // the job restarts: every rank's steps count from 1 again
      ++attempt;
      steps.clear();
    }
    const auto rank = static_cast<std::uint32_t>(gen.between(0, kRanks - 1));
    std::int64_t& at = clock.try_emplace(rank, newest).first->second;
    // Now and then a rank's clock goes back.
    at += gen.chance(0.02) ? -gen.between(1, 500'000) : gen.between(10'000, 150'000);
    newest = std::max(newest, at);
    const StepReport r = gen.next(rank, attempt, ++steps[rank], at);
    tracker.add(r, "node-" + std::to_string(rank));
    model.add(r);
    if (!gen.chance(0.1)) continue;
    // Read at a moment around the newest report: before it too (a node's clock ahead of the reader's).
    const std::int64_t now = newest + gen.between(-300'000, 600'000);
    SCOPED_TRACE("report " + std::to_string(i) + ", read at newest " + std::to_string(now - newest) + " us");
    expectSameKpis(tracker.snapshot(now), model.heldAt(spec, settings, now).snapshot(now));
    if (HasFatalFailure()) return;
    ++compared;
  }
  EXPECT_GT(compared, 200);
}

INSTANTIATE_TEST_SUITE_P(Seeds, WindowSums, ::testing::Values(1u, 2u, 3u, 4u, 5u, 6u, 7u));

}  // namespace
}  // namespace lockstep::kpi
