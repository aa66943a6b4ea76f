#include "flops.h"

#include "lockstep/protocol/names.h"

namespace lockstep::kpi::detail {

RankFlops::RankFlops(const HeldReports& held)
    : flops_(held.flops),
      counted_(held.sums.withFlops > 0),
      basis_(held.newestBasis ? held.newestBasis->flopsBasis : std::nullopt),
      newestPeak_(held.newestPeak) {}

void RankFlops::finish(RankKpis& rank, double spanSeconds, FlopsTotals& job) const {
  if (newestPeak_ != nullptr) rank.peakFlops = *newestPeak_->peakFlops;
  if (!counted_ || !(spanSeconds > 0)) return;
  rank.modelFlopsPerSecond = flops_ / spanSeconds;
  job.flopsPerSecond += *rank.modelFlopsPerSecond;
  job.counted = true;
  if (basis_) job.bases.insert(*basis_);
  if (!rank.peakFlops) return;
  rank.mfu = *rank.modelFlopsPerSecond / *rank.peakFlops;
  job.peak += *rank.peakFlops;
  job.withPeak += *rank.modelFlopsPerSecond;
}

void jobFlops(JobKpis& job, const FlopsTotals& totals) {
  if (!totals.counted) return;
  job.modelFlopsPerSecond = totals.flopsPerSecond;
  if (totals.bases.size() == 1) job.flopsBasis = std::string(titleOf(*totals.bases.begin()));
  if (totals.bases.size() > 1) job.flopsBasis = "mixed";
  if (totals.peak <= 0) return;
  job.peakFlops = totals.peak;
  job.mfu = totals.withPeak / totals.peak;
}

}  // namespace lockstep::kpi::detail
