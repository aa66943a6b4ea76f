#include "lockstep/present/present.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>

#include "lockstep/common/natural.h"
#include "lockstep/protocol/names.h"

namespace lockstep::present {
namespace {

std::string toChars(double value, int decimals) {
  std::array<char, 400> buffer{};  // fixed notation of 1e308 needs ~310 characters
  const auto [end, ec] =
      std::to_chars(buffer.data(), buffer.data() + buffer.size(), value, std::chars_format::fixed, decimals);
  if (ec != std::errc()) return "0";
  std::string text(buffer.data(), end);
  // "-0.0" reads as a sign error.
  if (text.front() == '-' && text.find_first_not_of("-0.") == std::string::npos) text.erase(0, 1);
  return text;
}

}  // namespace

std::string number(double value, int decimals) {
  if (!std::isfinite(value)) return std::string(kUnknown);
  std::string text = toChars(value, decimals);
  const std::size_t begin = text.front() == '-' ? 1 : 0;
  std::size_t end = text.find('.');
  if (end == std::string::npos) end = text.size();
  for (std::size_t at = end; at > begin + 3; at -= 3) text.insert(at - 3, 1, ',');
  return text;
}

std::string plainNumber(double value, int decimals) {
  if (!std::isfinite(value)) return "0";
  return toChars(value, decimals);
}

std::string figure(const std::optional<double>& value, int decimals, std::string_view unit) {
  if (!value || !std::isfinite(*value)) return std::string(kUnknown);
  return number(*value, decimals) + std::string(unit);
}

std::string percent(const std::optional<double>& fraction, int decimals) {
  if (!fraction || !std::isfinite(*fraction)) return std::string(kUnknown);
  return number(*fraction * 100, decimals) + "%";
}

std::string duration(double seconds) {
  if (!std::isfinite(seconds)) return std::string(kUnknown);
  if (seconds < 90) return number(seconds, seconds < 10 ? 1 : 0) + " s";
  if (seconds < 5400) return number(seconds / 60, 1) + " min";
  return number(seconds / 3600, 1) + " h";
}

std::string bytes(double count) {
  if (!std::isfinite(count)) return std::string(kUnknown);
  constexpr std::array<const char*, 5> kUnits = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t unit = 0;
  while (std::abs(count) >= 1024 && unit + 1 < kUnits.size()) {
    count /= 1024;
    ++unit;
  }
  return number(count, unit == 0 ? 0 : 1) + " " + kUnits[unit];
}

std::string bandwidth(const std::optional<double>& bytesPerSecond) {
  if (!bytesPerSecond || !std::isfinite(*bytesPerSecond)) return std::string(kUnknown);
  return number(*bytesPerSecond / 1e9, *bytesPerSecond < 1e8 ? 3 : 1) + " GB/s";
}

std::string flopsRate(const std::optional<double>& flopsPerSecond) {
  if (!flopsPerSecond || !std::isfinite(*flopsPerSecond) || *flopsPerSecond < 0) return std::string(kUnknown);
  constexpr std::pair<double, const char*> kPrefixes[] = {{1e18, " E"}, {1e15, " P"}, {1e12, " T"}, {1e9, " G"}, {1e6, " M"}};
  for (const auto& [scale, prefix] : kPrefixes) {
    // At one decimal the prefix below would read 1,000.0 from here on: this one reads 1.0.
    if (*flopsPerSecond >= scale * 0.99995) return number(*flopsPerSecond / scale, 1) + prefix + "FLOP/s";
  }
  return number(*flopsPerSecond, 0) + " FLOP/s";
}

std::string money(double amount, std::string_view currency) {
  int decimals = 2;
  if (amount > 0 && amount < 0.01) decimals = std::min(8, 1 - static_cast<int>(std::floor(std::log10(amount))));
  return number(amount, decimals) + " " + std::string(currency);
}

std::string nodesText(std::vector<std::string> nodes, std::size_t named) {
  std::sort(nodes.begin(), nodes.end(), NaturalLess{});
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  const auto joined = [&](std::size_t n) {
    std::string out;
    for (std::size_t i = 0; i < n && i < nodes.size(); ++i) out += (i == 0 ? "" : ", ") + nodes[i];
    return out;
  };
  if (nodes.size() <= named) return joined(nodes.size());
  return std::to_string(nodes.size()) + " nodes (" + joined(named - 1) + ", …)";
}

double tickStep(double span, int intervals) {
  const double raw = span / std::max(1, intervals);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0}) {
    if (m * power >= raw * (1 - 1e-9)) return m * power;
  }
  return 10 * power;
}

int tickDecimals(double step) { return std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 6); }

kpi::Maybe jobThroughput(const kpi::JobKpis& k, bool ended) {
  if (!ended) return k.samplesPerSecond;
  return k.meanSamplesPerSecond ? k.meanSamplesPerSecond : k.samplesPerSecond;
}

std::string_view jobThroughputMeaning(bool ended) {
  return ended ? "mean over the job, start to end (start-up included)" : "over the last 10 s, summed over ranks";
}

namespace {
std::string linkShare(double use) { return plainNumber(100.0 * use, use < 0.1 ? 1 : 0) + "%"; }
}  // namespace

std::string bitRate(double bytesPerSecond) { return kpi::formatBitsPerSecond(8 * bytesPerSecond); }

std::string networkRate(const kpi::NetRate& r) {
  std::string text = r.interface + " \u2193" + bitRate(r.rxBytesPerSecond) + " \u2191" + bitRate(r.txBytesPerSecond);
  if (!r.linkBitsPerSecond) return text + ", link speed unknown";
  text += " of " + bitRate(static_cast<double>(*r.linkBitsPerSecond) / 8);
  if (r.linkUse) text += " (" + linkShare(*r.linkUse) + ")";
  return text;
}

std::string parallelismText(const JobSpec& spec) {
  if (spec.sync == Sync::kParameterServer) {
    if (spec.serverRanks() > 1) return "parameter server split over " + std::to_string(spec.serverRanks()) + " ranks, synchronous";
    return spec.staleness == 0 ? "parameter server, synchronous"
                               : "parameter server, asynchronous (staleness ≤ " + std::to_string(spec.staleness) + ")";
  }
  if (spec.shard == Shard::kNone) return "all-reduce";
  return "all-reduce, sharded: " + std::string(titleOf(spec.shard));
}

std::string mfuText(const kpi::JobKpis& k) {
  if (!k.modelFlopsPerSecond) return "";
  if (!k.mfu) return std::string(kUnknown) + " (" + flopsRate(k.modelFlopsPerSecond) + "; no peak known)";
  return percent(k.mfu) + " of peak (" + flopsRate(mfuFlopsRate(k)) + " of " + flopsRate(k.peakFlops) + ")";
}

std::optional<double> mfuFlopsRate(const kpi::JobKpis& k) {
  if (!k.mfu || !k.peakFlops) return std::nullopt;
  return *k.mfu * *k.peakFlops;
}

std::string mfuBasisText(const kpi::JobKpis& k) {
  std::string text;
  if (!k.flopsBasis.empty()) text = "FLOPs: " + k.flopsBasis;
  if (!k.peakBasis.empty()) text += (text.empty() ? "" : "; ") + std::string("peak: ") + k.peakBasis;
  return text;
}

std::string modelStateText(const kpi::JobKpis& k) {
  std::string text;
  const std::pair<const char*, kpi::Maybe> held[] = {{"parameters", k.paramBytesPerRank},
                                                      {"gradients", k.gradBytesPerRank},
                                                      {"optimizer state", k.optimizerStateBytesPerRank}};
  for (const auto& [what, figure] : held) {
    if (figure) text += (text.empty() ? "" : ", ") + std::string(what) + " " + bytes(*figure);
  }
  if (!text.empty()) text += " per rank";
  if (k.stalenessMean) {
    text += (text.empty() ? "" : "; ") + std::string("staleness ") + figure(k.stalenessMean, 1) + " (p99 " +
            figure(k.stalenessP99, 0) + ")";
  }
  return text;
}

}  // namespace lockstep::present

namespace lockstep::present {

std::string_view phaseColor(kpi::Phase phase) {
  switch (phase) {
    case kpi::Phase::kData: return "#edc948";
    case kpi::Phase::kCompute: return "#4e79a7";
    case kpi::Phase::kCommunication: return "#e15759";
    case kpi::Phase::kOptimizer: return "#59a14f";
    case kpi::Phase::kStep: return "#9c755f";
    case kpi::Phase::kNamed: return "#b07aa1";
    case kpi::Phase::kCollective: return "#f28e2b";
  }
  return "#9c755f";
}

std::string_view phaseLegend(kpi::Phase phase) {
  switch (phase) {
    case kpi::Phase::kCommunication: return "exposed communication";
    case kpi::Phase::kNamed: return "named phase";
    case kpi::Phase::kCollective: return "collective (filled: exposed)";
    default: return kpi::phaseName(phase);
  }
}

std::string collectiveLabel(CollectiveKind kind, std::uint64_t count) {
  std::string label(titleOf(kind));
  if (count > 0) label += " " + bytes(static_cast<double>(count));
  return label;
}

std::string collectiveSplit(const std::vector<kpi::CollectiveKpis>& kinds, std::size_t shown) {
  std::vector<const kpi::CollectiveKpis*> exposed;
  for (const auto& k : kinds) {
    if (k.exposedShare) exposed.push_back(&k);
  }
  std::stable_sort(exposed.begin(), exposed.end(), [](const auto* a, const auto* b) { return *a->exposedShare > *b->exposedShare; });
  std::string text;
  for (std::size_t i = 0; i < std::min(shown, exposed.size()); ++i) {
    text += (i > 0 ? " \u00b7 " : "") + std::string(titleOf(exposed[i]->kind)) + " " + percent(exposed[i]->exposedShare);
  }
  return text;
}

}  // namespace lockstep::present
