#include "collective_sums.h"

#include <algorithm>
#include <cmath>

#include "lockstep/protocol/collectives.h"
#include "lockstep/protocol/names.h"

namespace lockstep::kpi::detail {
namespace {

// The kind counted most often; ties to the first in kCollectiveKindNames' order.
CollectiveKind commonest(const std::map<CollectiveKind, int>& counts) {
  CollectiveKind best = CollectiveKind::kAllReduce;
  int most = 0;
  for (const auto& [kind, n] : counts) {
    if (n > most) {
      best = kind;
      most = n;
    }
  }
  return best;
}

// Counts `n` more steps in which `kind` came first (or last); a kind counted in none is gone.
void countKind(std::map<CollectiveKind, int>& counts, CollectiveKind kind, int n) {
  const auto it = counts.try_emplace(kind).first;
  it->second += n;
  if (it->second == 0) counts.erase(it);
}

// The mean of the known values; unknown when none is.
class Mean {
 public:
  void add(const Maybe& value) {
    if (!value) return;
    sum_ += *value;
    ++n_;
  }
  Maybe value() const { return n_ > 0 ? Maybe(sum_ / n_) : std::nullopt; }

 private:
  double sum_ = 0;
  int n_ = 0;
};

}  // namespace

void CollectiveSums::add(const StepReport& report, int sign) {
  const auto collectives = collectivesOf(report);
  if (collectives.empty()) return;
  reports_ += sign;
  if (sign > 0) worldSize_ = report.worldSize;
  const double n = sign;
  for (const auto& c : collectives) {
    const auto it = kinds_.try_emplace(c.kind).first;
    Sums& s = it->second;
    s.reports += sign;
    s.count += n * c.count;
    s.timeUs += n * static_cast<double>(c.timeUs);
    s.exposedUs += n * static_cast<double>(c.exposedUs);
    s.bytes += sign * static_cast<ExactSum>(c.bytes);
    if (c.bytes > 0 && c.timeUs > 0) {
      s.timedBytes += sign * static_cast<ExactSum>(c.bytes);
      s.timedUs += n * static_cast<double>(c.timeUs);
    }
    if (s.reports == 0) kinds_.erase(it);
  }
}

std::vector<CollectiveKpis> CollectiveSums::kpis(double steps, double stepUs) const {
  std::vector<CollectiveKpis> out;
  if (steps <= 0) return out;
  for (const auto& named : kCollectiveKindNames) {
    const auto it = kinds_.find(named.value);
    if (it == kinds_.end()) continue;
    const Sums& s = it->second;
    CollectiveKpis k;
    k.kind = named.value;
    k.perStep = s.count / steps;
    if (stepUs > 0) {
      k.timeShare = s.timeUs / stepUs;
      k.exposedShare = s.exposedUs / stepUs;
    }
    // No bytes counted is unknown, not 0, except for a barrier, which moves none.
    if (s.bytes > 0 || named.value == CollectiveKind::kBarrier) k.bytesPerStep = static_cast<double>(s.bytes) / steps;
    if (const Maybe alg = algBandwidth(named.value)) k.busBandwidth = *alg * busFactor(named.value, worldSize_);
    if (k.busBandwidth && *k.busBandwidth <= 0) k.busBandwidth.reset();
    out.push_back(k);
  }
  return out;
}

Maybe CollectiveSums::algBandwidth(CollectiveKind kind) const {
  const auto it = kinds_.find(kind);
  if (it == kinds_.end() || it->second.timedUs <= 0 || worldSize_ <= 1) return std::nullopt;
  return static_cast<double>(it->second.timedBytes) / (it->second.timedUs / 1e6);
}

std::vector<CollectiveKpis> meanOverRanks(const std::vector<RankKpis>& ranks) {
  std::vector<CollectiveKpis> out;
  for (const auto& named : kCollectiveKindNames) {
    double perStep = 0;
    int n = 0;
    Mean time, exposed, bytes, bus;
    for (const auto& r : ranks) {
      for (const auto& c : r.collectives) {
        if (c.kind != named.value) continue;
        perStep += c.perStep;
        ++n;
        time.add(c.timeShare);
        exposed.add(c.exposedShare);
        bytes.add(c.bytesPerStep);
        bus.add(c.busBandwidth);
      }
    }
    if (n == 0) continue;
    out.push_back({named.value, perStep / n, time.value(), exposed.value(), bytes.value(), bus.value()});
  }
  return out;
}

void ExposedEndsSums::add(const StepReport& report, int sign) {
  const auto& spans = report.collectiveSpans;
  if (spans.empty()) return;
  double exposedUs = 0, count = 0;
  for (const auto& c : collectivesOf(report)) {
    exposedUs += static_cast<double>(c.exposedUs);
    count += c.count;
  }
  if (exposedUs <= 0) return;
  const double n = sign;
  const auto byStart = [](const CollectiveSpan& a, const CollectiveSpan& b) { return a.startUnixUs < b.startUnixUs; };
  const CollectiveSpan& first = *std::min_element(spans.begin(), spans.end(), byStart);
  firstUs_ += n * static_cast<double>(first.exposedUs);
  firstOfUs_ += n * exposedUs;
  countKind(firstKinds_, first.kind, sign);
  // The spans are the step's first ones: the last of them is its last only when they are all.
  if (static_cast<double>(spans.size()) < count) return;
  // The latest to start; of two at once, the later in the list.
  const CollectiveSpan* last = &spans.front();
  for (const auto& s : spans) {
    if (s.startUnixUs >= last->startUnixUs) last = &s;
  }
  lastUs_ += n * static_cast<double>(last->exposedUs);
  lastOfUs_ += n * exposedUs;
  countKind(lastKinds_, last->kind, sign);
}

void ExposedEndsSums::merge(const ExposedEndsSums& other) {
  firstUs_ += other.firstUs_;
  firstOfUs_ += other.firstOfUs_;
  lastUs_ += other.lastUs_;
  lastOfUs_ += other.lastOfUs_;
  for (const auto& [kind, n] : other.firstKinds_) countKind(firstKinds_, kind, n);
  for (const auto& [kind, n] : other.lastKinds_) countKind(lastKinds_, kind, n);
}

ExposedEnds ExposedEndsSums::ends() const {
  ExposedEnds e;
  if (firstOfUs_ > 0) {
    e.firstShare = std::min(1.0, firstUs_ / firstOfUs_);
    e.firstKind = commonest(firstKinds_);
  }
  if (lastOfUs_ > 0) {
    e.lastShare = std::min(1.0, lastUs_ / lastOfUs_);
    e.lastKind = commonest(lastKinds_);
  }
  return e;
}

}  // namespace lockstep::kpi::detail
