#include "lockstep/kpi/frame.h"

#include <algorithm>
#include <iterator>
#include <set>
#include <unordered_map>

#include "lockstep/common/natural.h"
#include "lockstep/protocol/names.h"
#include "lockstep/protocol/validate.h"
#include "lockstep/v1/lockstep.pb.h"

namespace lockstep::kpi {
namespace {

namespace pb = ::lockstep::v1;

// Each struct's figures that may be unknown, by their index on the wire (KpiFigures): append only,
// so that an older client reads a newer agent's frame.
constexpr Maybe JobKpis::*kJobFigures[] = {
    &JobKpis::samplesPerSecond,     &JobKpis::tokensPerSecond,      &JobKpis::meanSamplesPerSecond,
    &JobKpis::commOverhead,         &JobKpis::algBandwidth,         &JobKpis::busBandwidth,
    &JobKpis::bytesReducedPerStep,  &JobKpis::paramBytesPerRank,    &JobKpis::gradBytesPerRank,
    &JobKpis::optimizerStateBytesPerRank, &JobKpis::stalenessMean,  &JobKpis::stalenessP99,
    &JobKpis::modelFlopsPerSecond,  &JobKpis::peakFlops,            &JobKpis::mfu,
    &JobKpis::samplesPerRankStep,   &JobKpis::meanBusyUs,           &JobKpis::meanExposedUs,
    &JobKpis::meanStepUs,           &JobKpis::stragglerWaitShare,   &JobKpis::arrivalSkewUs,
    &JobKpis::scalingEfficiency,    &JobKpis::gpuUtilizationPct,    &JobKpis::loadImbalance,
    &JobKpis::initialLoadImbalance, &JobKpis::lastGlobalLoss,       &JobKpis::smoothedLoss,
    &JobKpis::timeToConvergenceSeconds, &JobKpis::etaSeconds,       &JobKpis::energyKwh,
    &JobKpis::gpuHours,             &JobKpis::coreHours,            &JobKpis::costSoFar,
    &JobKpis::costProjected,        &JobKpis::waitingShare,         &JobKpis::stragglerShare,
    &JobKpis::waitingCost,          &JobKpis::stragglerCost,        &JobKpis::waitingGpuHours,
    &JobKpis::stragglerGpuHours};
constexpr Maybe RankKpis::*kRankFigures[] = {
    &RankKpis::samplesPerSecond, &RankKpis::tokensPerSecond, &RankKpis::commOverhead,   &RankKpis::meanDataUs,
    &RankKpis::meanComputeUs,    &RankKpis::meanExposedUs,   &RankKpis::meanStepUs,     &RankKpis::samplesPerStep,
    &RankKpis::algBandwidth,     &RankKpis::busBandwidth,    &RankKpis::loss,           &RankKpis::cpuPct,
    &RankKpis::rssBytes,         &RankKpis::paramBytes,      &RankKpis::gradBytes,      &RankKpis::optimizerStateBytes,
    &RankKpis::stalenessMean,    &RankKpis::stalenessP99,    &RankKpis::modelFlopsPerSecond, &RankKpis::peakFlops,
    &RankKpis::mfu};
constexpr Maybe GpuKpis::*kGpuFigures[] = {&GpuKpis::utilizationPct, &GpuKpis::meanUtilizationPct,
                                           &GpuKpis::memoryUsedBytes, &GpuKpis::powerWatts,
                                           &GpuKpis::temperatureC,    &GpuKpis::energyKwh};
constexpr Maybe CollectiveKpis::*kCollectiveFigures[] = {&CollectiveKpis::timeShare, &CollectiveKpis::exposedShare,
                                                         &CollectiveKpis::bytesPerStep, &CollectiveKpis::busBandwidth};
constexpr Maybe ExposedEnds::*kExposedEndsFigures[] = {&ExposedEnds::firstShare, &ExposedEnds::lastShare};

// A name, a basis or a reason: longer than this is not something the engine wrote.
constexpr std::size_t kMaxText = 4096;
constexpr std::size_t kMaxMissing = 64;
// The rows asked for, and the slowest ranks' wherever they are (withRanks); 8 GPUs a rank's node.
constexpr std::size_t kMaxRows = kMaxFrameRanks + kSlowestRanks;
constexpr std::size_t kMaxGpus = 8 * kMaxRows;

Error bad(const std::string& message) { return invalidArgument("KPI frame: " + message); }

template <class T, std::size_t N>
void putFigures(const T& from, Maybe T::* const (&table)[N], pb::KpiFigures* m) {
  for (std::size_t i = 0; i < N; ++i) {
    if (const Maybe& v = from.*table[i]) {
      m->add_known(static_cast<std::uint32_t>(i));
      m->add_values(*v);
    }
  }
}

// Indexes past the table are a newer agent's figures: left out, as protobuf leaves unknown fields.
template <class T, std::size_t N>
Result<void> takeFigures(const pb::KpiFigures& m, Maybe T::* const (&table)[N], T& into) {
  if (m.known_size() != m.values_size()) return bad("figures: as many values as known figures are needed");
  for (int i = 0; i < m.known_size(); ++i) {
    if (i > 0 && m.known(i) <= m.known(i - 1)) return bad("figures: their indexes are not ascending");
    if (m.known(i) < N) into.*table[m.known(i)] = m.values(i);
  }
  return {};
}

Result<std::string> text(const std::string& s, const char* what) {
  if (s.size() > kMaxText) return bad(std::string(what) + " is longer than " + std::to_string(kMaxText) + " bytes");
  return s;
}

template <class E>
Result<E> enumOf(std::uint32_t v, std::uint32_t first, std::uint32_t last, const char* what) {
  if (v < first || v > last) return bad(std::string(what) + " is unknown (" + std::to_string(v) + ")");
  return static_cast<E>(v);
}

Result<CollectiveKind> kindOf(std::uint32_t v) {
  return enumOf<CollectiveKind>(v, 1, static_cast<std::uint32_t>(std::size(kCollectiveKindNames)), "collective kind");
}
Result<SlowCause> causeOf(std::uint32_t v) {
  return enumOf<SlowCause>(v, 0, static_cast<std::uint32_t>(SlowCause::kCommunication), "slow cause");
}

void putCollectives(const std::vector<CollectiveKpis>& from,
                    google::protobuf::RepeatedPtrField<pb::CollectiveFrame>* m) {
  for (const auto& c : from) {
    auto* f = m->Add();
    f->set_kind(static_cast<std::uint32_t>(c.kind));
    f->set_per_step(c.perStep);
    putFigures(c, kCollectiveFigures, f->mutable_figures());
  }
}

Result<std::vector<CollectiveKpis>> takeCollectives(const google::protobuf::RepeatedPtrField<pb::CollectiveFrame>& m) {
  if (static_cast<std::size_t>(m.size()) > std::size(kCollectiveKindNames)) return bad("more collectives than kinds");
  std::vector<CollectiveKpis> out;
  for (const auto& f : m) {
    CollectiveKpis c;
    LOCKSTEP_ASSIGN_OR_RETURN(c.kind, kindOf(f.kind()));
    for (const auto& seen : out) {
      if (seen.kind == c.kind) return bad("a kind of collective listed twice");
    }
    c.perStep = f.per_step();
    LOCKSTEP_TRY(takeFigures(f.figures(), kCollectiveFigures, c));
    out.push_back(std::move(c));
  }
  return out;
}

void putRank(const RankKpis& r, pb::RankFrame* m) {
  m->set_rank(r.rank);
  m->set_node(r.node);
  m->set_attempt(r.attempt);
  m->set_step(r.step);
  m->set_epoch(r.epoch);
  m->set_loss_is_nan(r.lossIsNan);
  putFigures(r, kRankFigures, m->mutable_figures());
  putCollectives(r.collectives, m->mutable_collectives());
}

Result<RankKpis> takeRank(const pb::RankFrame& m) {
  RankKpis r;
  r.rank = m.rank();
  LOCKSTEP_ASSIGN_OR_RETURN(r.node, text(m.node(), "a rank's node"));
  r.attempt = m.attempt();
  r.step = m.step();
  r.epoch = m.epoch();
  r.lossIsNan = m.loss_is_nan();
  LOCKSTEP_TRY(takeFigures(m.figures(), kRankFigures, r));
  LOCKSTEP_ASSIGN_OR_RETURN(r.collectives, takeCollectives(m.collectives()));
  return r;
}

void putJob(const JobKpis& k, pb::KpiFrame& m) {
  m.set_job_id(k.jobId);
  m.set_world_size(k.worldSize);
  m.set_attempts(k.attempts);
  m.set_step(k.step);
  m.set_total_steps(k.totalSteps);
  m.set_elapsed_seconds(k.elapsedSeconds);
  m.set_total_samples(k.totalSamples);
  if (k.totalTokens) m.set_total_tokens(*k.totalTokens);
  m.set_flops_basis(k.flopsBasis);
  m.set_peak_basis(k.peakBasis);
  m.set_scaling_basis(static_cast<std::uint32_t>(k.scalingBasis));
  if (k.slowestRank) m.set_slowest_rank(*k.slowestRank);
  m.set_slowest_cause(static_cast<std::uint32_t>(k.slowestCause));
  m.set_cost_complete(k.costComplete);
  for (const auto& s : k.missing) m.add_missing(s);
  m.set_no_steps_reason(k.noStepsReason);
  m.set_no_timings_reason(k.noTimingsReason);
  m.set_exposed_first_kind(static_cast<std::uint32_t>(k.exposedEnds.firstKind));
  m.set_exposed_last_kind(static_cast<std::uint32_t>(k.exposedEnds.lastKind));
  putFigures(k.exposedEnds, kExposedEndsFigures, m.mutable_exposed_ends());
  putFigures(k, kJobFigures, m.mutable_figures());
}

Result<void> takeJob(const pb::KpiFrame& m, JobKpis& k) {
  LOCKSTEP_TRY(validateJobId(m.job_id()));
  k.jobId = m.job_id();
  k.worldSize = m.world_size();
  k.attempts = m.attempts();
  k.step = m.step();
  k.totalSteps = m.total_steps();
  k.elapsedSeconds = m.elapsed_seconds();
  k.totalSamples = m.total_samples();
  if (m.has_total_tokens()) k.totalTokens = m.total_tokens();
  LOCKSTEP_ASSIGN_OR_RETURN(k.flopsBasis, text(m.flops_basis(), "the FLOPs basis"));
  LOCKSTEP_ASSIGN_OR_RETURN(k.peakBasis, text(m.peak_basis(), "the peak basis"));
  LOCKSTEP_ASSIGN_OR_RETURN(k.scalingBasis, (enumOf<ScalingBasis>(m.scaling_basis(), 0, 2, "scaling basis")));
  if (m.has_slowest_rank()) k.slowestRank = m.slowest_rank();
  LOCKSTEP_ASSIGN_OR_RETURN(k.slowestCause, causeOf(m.slowest_cause()));
  k.costComplete = m.cost_complete();
  if (static_cast<std::size_t>(m.missing_size()) > kMaxMissing) return bad("more than 64 figures said missing");
  for (const auto& s : m.missing()) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto said, text(s, "what is missing"));
    k.missing.push_back(std::move(said));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(k.noStepsReason, text(m.no_steps_reason(), "why there are no steps"));
  LOCKSTEP_ASSIGN_OR_RETURN(k.noTimingsReason, text(m.no_timings_reason(), "why there are no timings"));
  if (m.exposed_first_kind() != 0 || m.exposed_last_kind() != 0) {
    LOCKSTEP_ASSIGN_OR_RETURN(k.exposedEnds.firstKind, kindOf(m.exposed_first_kind()));
    LOCKSTEP_ASSIGN_OR_RETURN(k.exposedEnds.lastKind, kindOf(m.exposed_last_kind()));
  }
  LOCKSTEP_TRY(takeFigures(m.exposed_ends(), kExposedEndsFigures, k.exposedEnds));
  return takeFigures(m.figures(), kJobFigures, k);
}

void putBlocks(const std::vector<NodeBlock>& blocks, pb::KpiFrame& m) {
  for (const auto& b : blocks) {
    auto* f = m.add_node_blocks();
    f->set_first_node(b.firstNode);
    f->set_nodes(b.nodes);
    f->set_devices(b.devices);
    if (b.meanPct) f->set_mean_pct(static_cast<float>(*b.meanPct));
    if (b.leastPct) f->set_least_pct(static_cast<float>(*b.leastPct));
  }
}

Result<void> takeBlocks(const pb::KpiFrame& m, JobKpis& k) {
  if (static_cast<std::size_t>(m.node_blocks_size()) > kMaxNodeBlocks) {
    return bad("more than " + std::to_string(kMaxNodeBlocks) + " blocks of nodes");
  }
  for (const auto& f : m.node_blocks()) {
    NodeBlock b;
    LOCKSTEP_ASSIGN_OR_RETURN(b.firstNode, text(f.first_node(), "a block's first node"));
    if (f.nodes() == 0) return bad("a block of no nodes");
    b.nodes = f.nodes();
    b.devices = f.devices();
    if (f.has_mean_pct()) b.meanPct = f.mean_pct();
    if (f.has_least_pct()) b.leastPct = f.least_pct();
    k.nodeBlocks.push_back(std::move(b));
  }
  return {};
}

Result<void> takeRows(const pb::KpiFrame& m, JobKpis& k) {
  if (m.slowest_ranks_size() > static_cast<int>(kSlowestRanks)) return bad("more slowest ranks than are kept");
  for (const auto& s : m.slowest_ranks()) {
    SlowRank slow{s.rank(), {}, s.excess(), SlowCause::kUnknown};
    LOCKSTEP_ASSIGN_OR_RETURN(slow.node, text(s.node(), "a slow rank's node"));
    LOCKSTEP_ASSIGN_OR_RETURN(slow.cause, causeOf(s.cause()));
    k.slowestRanks.push_back(std::move(slow));
  }
  LOCKSTEP_ASSIGN_OR_RETURN(k.collectives, takeCollectives(m.collectives()));
  if (static_cast<std::size_t>(m.ranks_size()) > kMaxRows) return bad("more rows of ranks than a frame holds");
  for (const auto& r : m.ranks()) {
    LOCKSTEP_ASSIGN_OR_RETURN(auto rank, takeRank(r));
    k.ranks.push_back(std::move(rank));
  }
  if (static_cast<std::size_t>(m.gpus_size()) > kMaxGpus) return bad("more GPUs than a frame's ranks have");
  for (const auto& g : m.gpus()) {
    GpuKpis gpu;
    LOCKSTEP_ASSIGN_OR_RETURN(gpu.node, text(g.node(), "a GPU's node"));
    gpu.index = g.index();
    LOCKSTEP_TRY(takeFigures(g.figures(), kGpuFigures, gpu));
    k.gpus.push_back(std::move(gpu));
  }
  return takeBlocks(m, k);
}

}  // namespace

JobKpis withRanks(JobKpis head, std::span<const RankKpis> ranks, std::span<const GpuKpis> gpus, std::uint32_t from,
                  std::uint32_t count) {
  const std::uint64_t end = std::uint64_t{from} + count;
  const auto at = [&](std::uint64_t rank) {
    return std::partition_point(ranks.begin(), ranks.end(), [&](const RankKpis& r) { return r.rank < rank; });
  };
  head.ranks.assign(at(from), at(end));
  // And the rows of the slowest ranks that are slower than the median, wherever they are: who holds
  // the job up is always in view.
  for (const auto& slow : head.slowestRanks) {
    if (slow.excess <= 0 || (slow.rank >= from && slow.rank < end)) continue;
    if (const auto it = at(slow.rank); it != ranks.end() && it->rank == slow.rank) head.ranks.push_back(*it);
  }
  std::sort(head.ranks.begin(), head.ranks.end(), [](const RankKpis& a, const RankKpis& b) { return a.rank < b.rank; });
  std::set<std::string_view> nodes;
  for (const auto& r : head.ranks) nodes.insert(r.node);
  head.gpus.clear();
  for (const auto& g : gpus) {
    if (nodes.count(g.node)) head.gpus.push_back(g);
  }
  return head;
}

void withoutReadings(const std::set<std::string, std::less<>>& unread, std::span<RankKpis> ranks,
                     std::span<GpuKpis> gpus) {
  if (unread.empty()) return;
  for (auto& g : gpus) {
    if (!unread.count(g.node)) continue;
    g.utilizationPct.reset();
    g.memoryUsedBytes.reset();
    g.powerWatts.reset();
    g.temperatureC.reset();
  }
  for (auto& r : ranks) {
    if (!unread.count(r.node)) continue;
    r.cpuPct.reset();
    r.rssBytes.reset();
  }
}

std::vector<NodeBlock> nodeBlocks(std::span<const RankPlacement> placement, std::span<const RankKpis> ranks,
                                  std::span<const GpuKpis> gpus) {
  // A GPU job's heatmap is of its GPUs, also while every GPU with a reading is on a silent node
  // (withoutReadings keeps their job-long mean): never its ranks' CPU % instead.
  const bool onGpus = std::any_of(gpus.begin(), gpus.end(), [](const GpuKpis& g) {
    return g.utilizationPct.has_value() || g.meanUtilizationPct.has_value();
  });
  // Each node's readings. The nodes are the placement's: the rows also name nodes an elastic
  // restart left (the engine keeps every row it saw). Without a placement, those the rows name.
  std::unordered_map<std::string_view, std::vector<double>> readings;
  for (const auto& p : placement) readings[p.node];
  const auto nodeOf = [&](std::string_view node) -> std::vector<double>* {
    if (node.empty()) return nullptr;  // a rank with no step read yet
    if (!placement.empty()) {
      const auto it = readings.find(node);
      return it == readings.end() ? nullptr : &it->second;
    }
    return &readings[node];
  };
  for (const auto& g : gpus) {
    if (auto* node = nodeOf(g.node); node && onGpus && g.utilizationPct) node->push_back(*g.utilizationPct);
  }
  for (const auto& r : ranks) {
    if (auto* node = nodeOf(r.node); node && !onGpus && r.cpuPct) node->push_back(*r.cpuPct);
  }
  std::vector<std::string_view> nodes;
  for (const auto& [node, values] : readings) nodes.push_back(node);
  std::sort(nodes.begin(), nodes.end(), NaturalLess{});
  const std::size_t perBlock = std::max<std::size_t>(1, (nodes.size() + kMaxNodeBlocks - 1) / kMaxNodeBlocks);
  std::vector<NodeBlock> blocks;
  for (std::size_t first = 0; first < nodes.size(); first += perBlock) {
    NodeBlock b{std::string(nodes[first]), 0, 0, {}, {}};
    double sum = 0;
    for (std::size_t i = first; i < std::min(nodes.size(), first + perBlock); ++i, ++b.nodes) {
      for (const double v : readings[nodes[i]]) {
        sum += v;
        b.leastPct = std::min(b.leastPct.value_or(v), v);
        ++b.devices;
      }
    }
    if (b.devices > 0) b.meanPct = sum / b.devices;
    blocks.push_back(std::move(b));
  }
  return blocks;
}

std::string encodeFrame(const JobKpis& k) {
  pb::KpiFrame m;
  putJob(k, m);
  for (const auto& s : k.slowestRanks) {
    auto* f = m.add_slowest_ranks();
    f->set_rank(s.rank);
    f->set_node(s.node);
    f->set_excess(s.excess);
    f->set_cause(static_cast<std::uint32_t>(s.cause));
  }
  putCollectives(k.collectives, m.mutable_collectives());
  for (const auto& r : k.ranks) putRank(r, m.add_ranks());
  for (const auto& g : k.gpus) {
    auto* f = m.add_gpus();
    f->set_node(g.node);
    f->set_index(g.index);
    putFigures(g, kGpuFigures, f->mutable_figures());
  }
  putBlocks(k.nodeBlocks, m);
  return m.SerializeAsString();
}

Result<JobKpis> decodeFrame(std::string_view bytes) {
  pb::KpiFrame m;
  if (!m.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return bad("not a KpiFrame");
  JobKpis k;
  LOCKSTEP_TRY(takeJob(m, k));
  LOCKSTEP_TRY(takeRows(m, k));
  return k;
}

}  // namespace lockstep::kpi
