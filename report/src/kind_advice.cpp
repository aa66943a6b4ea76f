#include "kind_advice.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "text.h"

namespace lockstep::report::detail {
namespace {

struct Run {
  const history::JobRecord* job;
  std::string kind;
  const kpi::JobKpis& k() const { return *job->finalKpis; }
};

// How fast a run got there: its time to the target loss when every run of the workload reached it,
// else its throughput (samples/s over the job). Lower is better for the first, higher for the second.
struct Pace {
  bool toTarget = false;
  double value(const Run& r) const {
    return toTarget ? *r.k().timeToConvergenceSeconds : present::jobThroughput(r.k(), true).value_or(0.0);
  }
  bool better(const Run& a, const Run& b) const { return toTarget ? value(a) < value(b) : value(a) > value(b); }
  // "reached the target loss 14% sooner than", "trained 12% faster (samples/s) than"
  std::string gain(const Run& a, const Run& b) const {
    if (toTarget) return "reached the target loss " + percent(1.0 - value(a) / value(b), 0) + " sooner than";
    return "trained " + percent(value(a) / value(b) - 1.0, 0) + " faster (samples/s) than";
  }
};

std::string named(const Run& r) { return r.kind + " (" + r.job->spec.jobId + ")"; }

// "with rank 3 20% slower, ": the baseline's straggler, where it had one.
std::string stragglerContext(const Run& base) {
  const auto& imbalance = base.k().loadImbalance;
  if (!imbalance || *imbalance < 1.1 || !base.k().slowestRank) return "";
  return "with rank " + std::to_string(*base.k().slowestRank) + " " + percent(*imbalance - 1.0, 0) + " slower, ";
}

// What a sharded run saves per rank against the baseline, and at what cost in step time.
std::string memoryTrade(const Run& r, const Run& base) {
  const auto& mine = r.k().optimizerStateBytesPerRank;
  const auto& theirs = base.k().optimizerStateBytesPerRank;
  if (!mine || !theirs || *mine >= *theirs) return "";
  std::string text = named(r) + " keeps " + bytes(*theirs - *mine) + " less optimizer state per rank (" + bytes(*theirs) +
                     " \u2192 " + bytes(*mine) + ")";
  const auto& step = r.k().meanStepUs;
  const auto& baseStep = base.k().meanStepUs;
  if (step && baseStep && *baseStep > 0) {
    const double more = *step / *baseStep - 1.0;
    text += more >= 0 ? " at " + percent(more, 0) + " more step time" : " and its steps were " + percent(-more, 0) + " shorter";
  }
  return text;
}

// An asynchronous run's price: staler gradients, and a loss that may end higher.
std::string stalenessTrade(const Run& r, const Run& base) {
  if (!r.k().stalenessMean) return "";
  std::string text = named(r) + "'s gradients were " + figure(r.k().stalenessMean, 1) + " updates old on average (p99 " +
                     figure(r.k().stalenessP99, 0) + ")";
  const auto& loss = r.k().smoothedLoss;
  const auto& baseLoss = base.k().smoothedLoss;
  if (loss && baseLoss && *loss > *baseLoss * 1.01) {
    text += "; its final loss was " + figure(loss, 4) + " against " + figure(baseLoss, 4);
  }
  return text;
}

// The workload run under the most kinds, its runs in the order given.
std::vector<Run> largestGroup(std::span<const history::JobRecord> jobs) {
  std::map<std::string, std::vector<Run>> byWorkload;
  for (const auto& job : jobs) {
    if (job.spec.isCommand() || !job.finalKpis) continue;
    byWorkload[kpi::workloadKey(job.spec) + " ranks " + std::to_string(job.spec.worldSize)].push_back(
        Run{&job, present::parallelismText(job.spec)});
  }
  std::vector<Run> best;
  std::size_t bestKinds = 1;
  for (auto& [key, runs] : byWorkload) {
    std::vector<std::string> kinds;
    for (const auto& r : runs) kinds.push_back(r.kind);
    std::sort(kinds.begin(), kinds.end());
    const auto distinct = static_cast<std::size_t>(std::unique(kinds.begin(), kinds.end()) - kinds.begin());
    if (distinct > bestKinds) {
      bestKinds = distinct;
      best = runs;
    }
  }
  return best;
}

}  // namespace

std::vector<std::string> kindAdvice(std::span<const history::JobRecord> jobs) {
  const std::vector<Run> runs = largestGroup(jobs);
  if (runs.empty()) return {};
  Pace pace;
  pace.toTarget = std::all_of(runs.begin(), runs.end(), [](const Run& r) { return r.k().timeToConvergenceSeconds.has_value(); });
  // The baseline: plain all-reduce where one ran, else the first.
  const auto plain = std::find_if(runs.begin(), runs.end(), [](const Run& r) { return r.kind == "all-reduce"; });
  const Run& base = plain != runs.end() ? *plain : runs.front();
  const Run* fastest = &runs.front();
  for (const auto& r : runs) {
    if (pace.better(r, *fastest)) fastest = &r;
  }
  std::vector<std::string> lines;
  if (fastest->job == base.job) {
    lines.push_back("Recommended: " + named(base) + ": no other kind " +
                    (pace.toTarget ? "reached the target loss sooner" : "trained faster") + " on this workload.");
  } else {
    lines.push_back("Recommended: " + named(*fastest) + ": " + stragglerContext(base) + "it " + pace.gain(*fastest, base) +
                    " " + named(base) + ".");
  }
  for (const auto& r : runs) {
    if (r.job == base.job) continue;
    for (const std::string& trade : {memoryTrade(r, base), stalenessTrade(r, base)}) {
      if (!trade.empty()) lines.push_back(trade + ".");
    }
    if (r.job != fastest->job && pace.better(base, r)) lines.push_back(named(r) + ": " + named(base) + " " + pace.gain(base, r) + " it.");
  }
  return lines;
}

}  // namespace lockstep::report::detail
