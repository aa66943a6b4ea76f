#include "lockstep/kpi/stall.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "lockstep/protocol/names.h"

namespace lockstep::kpi {
namespace {

std::string seconds(std::int64_t ms) {
  char text[32];
  const double s = static_cast<double>(ms) / 1000.0;
  if (s < 90) {
    std::snprintf(text, sizeof text, "%.0f s", std::floor(s));
  } else {
    std::snprintf(text, sizeof text, "%.1f min", s / 60);
  }
  return text;
}

std::string ranksWord(const std::vector<std::uint32_t>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rankRanges(ranks);
}

// "all-gather #12 (bucket 2 of 4)": the collective numbered `number` among those the rank entered,
// named by the kind its record said (none said: the trainer's and DDP's all-reduce).
std::string collectiveName(std::uint64_t number, std::uint32_t kind, std::uint32_t bucket, std::uint32_t buckets) {
  const std::string_view title = kind == 0 ? "all-reduce" : titleOf(static_cast<CollectiveKind>(kind));
  std::string out = std::string(title == "unknown" ? "collective" : title) + " #" + std::to_string(number);
  if (bucket > 0 && buckets > 0) {
    out += " (bucket " + std::to_string(bucket) + " of " + std::to_string(buckets) + ")";
  } else if (bucket > 0) {
    out += " (bucket " + std::to_string(bucket) + ")";
  }
  return out;
}

// "rank 1 in data of step 15 for 43 s" for each rank, one per line, the stillest first; at most
// `limit` lines, then how many more.
std::string eachRank(std::vector<const RankProgress*> ranks, std::size_t limit) {
  std::stable_sort(ranks.begin(), ranks.end(), [](const auto* a, const auto* b) { return a->stillMs > b->stillMs; });
  std::string out;
  for (std::size_t i = 0; i < ranks.size() && i < limit; ++i) {
    const RankProgress& r = *ranks[i];
    out += "\n  rank " + std::to_string(r.rank) + ": " + whereIs(r);
    if (r.recorded) out += " for " + seconds(r.inCollective ? r.stillMs : r.phaseMs);
    if (!r.processState.empty()) out += "; process " + r.processState;
  }
  if (ranks.size() > limit) out += "\n  and " + std::to_string(ranks.size() - limit) + " more";
  return out;
}

}  // namespace

std::int64_t stallAllowanceMs(const StallBasis& basis) {
  std::int64_t base = basis.stallAfterS > 0 ? std::int64_t{basis.stallAfterS} * 1000 : kMinStallMs;
  if (basis.stallAfterS == 0 && basis.stepP99Ms) {
    base = std::max(base, static_cast<std::int64_t>(std::ceil(kStallTimesP99 * static_cast<double>(*basis.stepP99Ms))));
  }
  const auto startup = std::max(kMinStartupMs, static_cast<std::int64_t>(kStartupTimesBase * static_cast<double>(base)));
  if (!basis.stepP99Ms && basis.stallAfterS == 0) return startup;
  if (!basis.stepP99Ms) return std::max(startup, base);
  if (basis.announced) {
    if (!basis.phaseMaxMs) return startup;
    return std::max(base, static_cast<std::int64_t>(std::ceil(kStallTimesP99 * static_cast<double>(*basis.phaseMaxMs))));
  }
  return base;
}

std::string rankRanges(std::vector<std::uint32_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string whereIs(const RankProgress& r) {
  if (!r.recorded) return "no progress record (it does not use the lockstep package or library)";
  if (r.inCollective) return collectiveName(r.collectives, r.collectiveKind, r.bucket, r.buckets) + " of step " + std::to_string(r.step + 1);
  const std::string phase = r.phase.empty() ? "step" : r.phase;
  if (!r.reportsSteps && r.step == 0) return phase + " (no step reported yet)";
  return phase + " of step " + std::to_string(r.step + 1);
}

StallDiagnosis diagnoseStall(const std::vector<RankProgress>& ranks) {
  StallDiagnosis d;
  std::uint64_t front = 0;
  for (const auto& r : ranks) {
    if (r.recorded && r.inCollective) front = std::max(front, r.collectives);
  }
  std::vector<const RankProgress*> behind, waiting, stopped, all;
  const RankProgress* waiter = nullptr;
  std::uint32_t frontKind = 0;  // the newest collective's kind, as a rank that entered it said
  for (const auto& r : ranks) {
    all.push_back(&r);
    if (r.recorded && r.collectives == front && front > 0) frontKind = r.collectiveKind;
    const bool halted = r.processState.rfind("stopped by a signal", 0) == 0;  // not "traced": our own gdb does that
    if (front > 0 && r.recorded && r.inCollective && r.collectives == front && !halted) {
      d.waiting.push_back(r.rank);
      waiting.push_back(&r);
      if (!waiter || r.stillMs > waiter->stillMs) waiter = &r;
    } else if (front > 0 && (!r.recorded || r.collectives < front || halted)) {
      d.behind.push_back(r.rank);
      behind.push_back(&r);
    } else if (halted) {
      d.behind.push_back(r.rank);
      stopped.push_back(&r);
    }
  }
  constexpr std::size_t kLines = 8;
  if (!behind.empty() && waiter) {
    d.message = ranksWord(d.behind) + " did not reach " + collectiveName(front, frontKind, waiter->bucket, waiter->buckets) +
                ", which " + ranksWord(d.waiting) + (d.waiting.size() == 1 ? " waits" : " wait") + " in for " +
                seconds(waiter->stillMs) + ":" + eachRank(behind, kLines) + "\nwaiting:" + eachRank(waiting, 2);
  } else if (!behind.empty()) {
    // Every rank in the newest collective is stopped: they are the culprits; the others are behind them.
    std::vector<std::uint32_t> halted, others;
    for (const auto* r : behind) (r->processState.rfind("stopped by a signal", 0) == 0 ? halted : others).push_back(r->rank);
    d.message = ranksWord(halted) + (halted.size() == 1 ? " is" : " are") + " stopped by a signal (SIGSTOP)" +
                (others.empty() ? std::string(":")
                                : "; " + ranksWord(others) + " did not reach " + collectiveName(front, frontKind, 0, 0) + ":") +
                eachRank(behind, kLines);
  } else if (!stopped.empty()) {
    d.message = ranksWord(d.behind) + (d.behind.size() == 1 ? " is" : " are") +
                " stopped by a signal (SIGSTOP):" + eachRank(all, kLines);
  } else if (!waiting.empty()) {
    d.message = "every rank here waits in " + collectiveName(front, frontKind, waiter->bucket, waiter->buckets) + " for " +
                seconds(waiter->stillMs) +
                ": the ranks that did not reach it are on other nodes, or the collective itself hangs (the network)" +
                eachRank(waiting, kLines);
  } else {
    d.message = "no rank's progress moved, and none is in a collective:" + eachRank(all, kLines);
  }
  return d;
}

std::optional<Stall> jobStall(const std::vector<const JobStatus*>& parts) {
  std::optional<Stall> stall;
  for (const auto* p : parts) {
    if (p->stall && (!stall || p->stall->sinceUnixUs < stall->sinceUnixUs)) stall = p->stall;
  }
  if (!stall || parts.size() == 1) return stall;
  std::vector<RankProgress> ranks;
  for (const auto* p : parts) ranks.insert(ranks.end(), p->progress.begin(), p->progress.end());
  const auto diagnosis = diagnoseStall(ranks);
  stall->message = diagnosis.message;
  stall->ranks = diagnosis.behind;
  return stall;
}

std::string evidenceText(const RankEvidence& e) {
  std::string out = "rank " + std::to_string(e.rank) + " (pid " + std::to_string(e.pid) + " on " + e.node + "): " +
                    whereIs(e.progress);
  if (e.progress.recorded) out += ", still for " + seconds(e.progress.stillMs);
  out += "\nprocess: " + (e.processState.empty() ? std::string("gone") : e.processState);
  if (e.cpuMoving) out += *e.cpuMoving ? "; its CPU time moves" : "; its CPU time does not move";
  out += "\n";
  const auto section = [&](const char* title, const std::string& text) {
    if (text.empty()) return;
    out += std::string("\n") + title + ":\n" + text;
    if (text.back() != '\n') out += "\n";
  };
  section("Python stacks", e.pythonStacks);
  section("threads (id, name, state, wait channel)", e.threads);
  section("native backtrace (gdb)", e.nativeBacktrace);
  section("end of its log", e.logTail);
  if (!e.note.empty()) out += "\nnote: " + e.note + "\n";
  return out;
}

}  // namespace lockstep::kpi
