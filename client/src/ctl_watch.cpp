// lockstepctl watch: a job's ranks, live.

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <deque>
#include <optional>

#include "ctl.h"
#include "ctl_flags.h"

namespace lockstep::ctl {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct RankView {
  std::string node;
  std::uint64_t step = 0;
  std::uint32_t epoch = 0;
  double loss = NAN;
  std::deque<StepReport> window;  // the last few seconds of reports
  std::optional<float> cpuPct;
  std::optional<std::uint64_t> rssBytes;
  std::optional<float> gpuUtil;
  std::optional<std::uint32_t> gpuIndex;
};

struct WatchState {
  std::map<std::uint32_t, RankView> ranks;
  std::map<std::string, std::map<std::uint32_t, float>> gpuUtilByNode;  // node -> gpu -> util
  std::vector<std::string> events;
};

constexpr std::int64_t kWindowUs = 5'000'000;

void absorb(WatchState& w, const std::string& jobId, const StreamMessage& m) {
  std::visit(
      [&](const auto& p) {
        using T = std::decay_t<decltype(p)>;
        if constexpr (std::is_same_v<T, StepReport>) {
          if (p.jobId != jobId) return;
          RankView& v = w.ranks[p.rank];
          v.node = m.node;
          v.step = std::max(v.step, p.step);
          v.epoch = p.epoch;
          if (p.globalLoss) v.loss = *p.globalLoss;
          v.window.push_back(p);
          while (!v.window.empty() && v.window.back().timeUnixUs - v.window.front().timeUnixUs > kWindowUs) {
            v.window.pop_front();
          }
        } else if constexpr (std::is_same_v<T, ProcessSample>) {
          if (p.jobId != jobId) return;
          RankView& v = w.ranks[p.rank];
          v.cpuPct = p.cpuPct;
          v.rssBytes = p.rssBytes;
        } else if constexpr (std::is_same_v<T, GpuSample>) {
          if (p.utilizationPct && p.jobId == jobId) w.gpuUtilByNode[p.node][p.gpuIndex] = *p.utilizationPct;
        } else {
          if (p.jobId != jobId) return;
          w.events.push_back(timeText(p.timeUnixUs) + " " + m.node + ": " + p.message);
        }
      },
      m.payload);
}

Json renderWatch(const WatchState& w, const std::string& jobId, JobState state, bool json, bool tty) {
  Json ranks = Json::array();
  double totalRate = 0;
  std::string table;
  char line[320];
  std::snprintf(line, sizeof line, "%-5s %-14s %8s %6s %10s %11s %8s %6s %9s %6s\n", "RANK", "NODE", "STEP", "EPOCH",
                "LOSS", "SAMPLES/S", "COMM %", "CPU %", "RSS", "GPU %");
  table += line;
  for (const auto& [rank, v] : w.ranks) {
    double rate = NAN, comm = NAN;
    if (v.window.size() >= 2) {
      const double seconds = static_cast<double>(v.window.back().timeUnixUs - v.window.front().timeUnixUs) / 1e6;
      std::uint64_t samples = 0;
      std::int64_t stepUs = 0, exposedUs = 0;
      for (std::size_t i = 1; i < v.window.size(); ++i) samples += v.window[i].samples;
      for (const auto& r : v.window) {
        if (!r.exposedCommTimeUs) continue;  // not measured: the share is over the steps that were
        stepUs += r.stepTimeUs;
        exposedUs += *r.exposedCommTimeUs;
      }
      if (seconds > 0) rate = static_cast<double>(samples) / seconds;
      if (stepUs > 0) comm = 100.0 * static_cast<double>(exposedUs) / static_cast<double>(stepUs);
    }
    if (std::isfinite(rate)) totalRate += rate;
    std::optional<float> gpu;
    if (auto it = w.gpuUtilByNode.find(v.node); it != w.gpuUtilByNode.end() && !it->second.empty()) {
      float sum = 0;
      for (const auto& [i, u] : it->second) sum += u;
      gpu = sum / static_cast<float>(it->second.size());
    }
    Json r = {{"rank", rank}, {"node", v.node}, {"step", v.step}, {"epoch", v.epoch}};
    r["loss"] = std::isfinite(v.loss) ? Json(v.loss) : Json(nullptr);
    r["samples_per_s"] = std::isfinite(rate) ? Json(rate) : Json(nullptr);
    r["comm_overhead_pct"] = std::isfinite(comm) ? Json(comm) : Json(nullptr);
    r["cpu_pct"] = v.cpuPct ? Json(*v.cpuPct) : Json(nullptr);
    r["rss_bytes"] = v.rssBytes ? Json(*v.rssBytes) : Json(nullptr);
    r["gpu_util_pct"] = gpu ? Json(*gpu) : Json(nullptr);
    ranks.push_back(r);
    auto num = [](double x, const char* fmt) {
      char t[32];
      if (!std::isfinite(x)) return std::string("-");
      std::snprintf(t, sizeof t, fmt, x);
      return std::string(t);
    };
    std::snprintf(line, sizeof line, "%-5u %-14s %8llu %6u %10s %11s %8s %6s %9s %6s\n", rank, v.node.c_str(),
                  static_cast<unsigned long long>(v.step), v.epoch, num(v.loss, "%.4f").c_str(),
                  num(rate, "%.0f").c_str(), num(comm, "%.1f").c_str(), num(v.cpuPct ? *v.cpuPct : NAN, "%.0f").c_str(),
                  v.rssBytes ? num(static_cast<double>(*v.rssBytes) / (1 << 20), "%.0f MiB").c_str() : "-",
                  num(gpu ? *gpu : NAN, "%.0f").c_str());
    table += line;
  }
  const std::string stateName(jobStateName(state));
  Json snapshot = {{"job_id", jobId}, {"state", stateName}, {"samples_per_s", totalRate}, {"ranks", ranks}};
  if (json) {
    std::printf("%s\n", snapshot.dump().c_str());
  } else {
    if (tty) std::printf("\033[H\033[J");
    std::printf("job %s: %s, %.0f samples/s in total\n%s", jobId.c_str(), stateName.c_str(), totalRate, table.c_str());
    const std::size_t shown = std::min<std::size_t>(w.events.size(), 5);
    for (std::size_t i = w.events.size() - shown; i < w.events.size(); ++i) std::printf("  %s\n", w.events[i].c_str());
    if (!tty) std::printf("\n");
  }
  std::fflush(stdout);
  return snapshot;
}

// After a job ended: what the agents sent since the last fetch (its last reports and events).
}  // namespace

int cmdWatch(const Globals& g, const std::vector<std::string>& argv) {
  std::vector<std::string> args;
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl watch JOB").arguments(&args, 1).parse(argv));
  const std::string jobId = args[0];
  auto agents = connectAgents(g);
  if (!agents) return fail(agents.error());
  auto parts = findJob(*agents, jobId, g.timeout);
  if (!parts) return fail(parts.error());
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  WatchState w;
  Recorder recorder(g);
  // Recording: everything the agents still hold of the job. Else their last few thousand
  // messages, so that a running job shows its recent past at once.
  std::map<AgentClient*, std::uint64_t> lastSeq;
  for (const auto& p : *parts) {
    recorder.part(p.agent->hello(), p.status);
    const std::uint64_t last = p.agent->hello().lastSeq;
    lastSeq[p.agent] = !g.historyPath.empty() || last < 20000 ? 0 : last - 20000;
  }
  auto nextRender = Clock::now();
  while (g_interrupted.load() == 0) {
    for (auto& [agent, seq] : lastSeq) {
      auto batch = agent->fetch(seq, 5000, 200, g.timeout);
      if (!batch) return fail(batch.error());
      for (const auto& m : batch->messages) absorb(w, jobId, m);
      recorder.messages(batch->messages);
      if (!batch->messages.empty()) seq = batch->messages.back().seq;
    }
    if (Clock::now() < nextRender) continue;
    nextRender = Clock::now() + std::chrono::seconds(1);
    auto now = findJob(*agents, jobId, g.timeout);
    if (!now) return fail(now.error());
    for (const auto& p : *now) recorder.part(p.agent->hello(), p.status);
    const JobState state = overall(*now);
    renderWatch(w, jobId, state, g.json, tty);
    const bool ended = std::all_of(now->begin(), now->end(), [](const Part& p) { return partEnded(p.status); });
    if (ended) {
      drain(lastSeq, recorder, g.timeout);
      recorder.finish();
      if (!g.json) printJob(g, jobId, *now);
      return exitForState(state);
    }
  }
  return kOk;
}

}  // namespace lockstep::ctl
