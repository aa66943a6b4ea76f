#include "model_state.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace lockstep::kpi::detail {
namespace {

Maybe asFigure(const std::optional<std::uint64_t>& bytes) {
  return bytes ? Maybe(static_cast<double>(*bytes)) : std::nullopt;
}

// The mean and the 99th percentile (nearest rank) of the values, if any.
std::pair<Maybe, Maybe> meanAndP99(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const double mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  const auto rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(values.size())));
  return {mean, values[std::max<std::size_t>(rank, 1) - 1]};
}

// The largest of the ranks' figures that are known.
Maybe most(const std::vector<RankKpis>& ranks, Maybe RankKpis::*figure) {
  Maybe out;
  for (const auto& r : ranks) {
    if (r.*figure) out = std::max(out.value_or(0.0), *(r.*figure));
  }
  return out;
}

}  // namespace

void ModelState::finish(RankKpis& rank, std::vector<double>& jobStaleness) {
  if (newest_ != nullptr) {
    rank.paramBytes = asFigure(newest_->paramBytes);
    rank.gradBytes = asFigure(newest_->gradBytes);
    rank.optimizerStateBytes = asFigure(newest_->optimizerStateBytes);
  }
  jobStaleness.insert(jobStaleness.end(), staleness_.begin(), staleness_.end());
  std::tie(rank.stalenessMean, rank.stalenessP99) = meanAndP99(std::move(staleness_));
}

void jobModelState(JobKpis& job, std::vector<double> staleness) {
  job.paramBytesPerRank = most(job.ranks, &RankKpis::paramBytes);
  job.gradBytesPerRank = most(job.ranks, &RankKpis::gradBytes);
  job.optimizerStateBytesPerRank = most(job.ranks, &RankKpis::optimizerStateBytes);
  std::tie(job.stalenessMean, job.stalenessP99) = meanAndP99(std::move(staleness));
}

}  // namespace lockstep::kpi::detail
