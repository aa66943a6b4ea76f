#include "jobs/rank_progress.h"

#include <algorithm>

#include "lockstep/common/clock.h"

namespace lockstep::agent {

RankProgress progressOf(std::uint32_t rank, const progress::Snapshot& s, std::int64_t stillMs) {
  RankProgress p;
  p.rank = rank;
  p.recorded = true;
  p.reportsSteps = s.reportsSteps;
  p.step = static_cast<std::uint64_t>(std::max<std::int64_t>(0, s.step));
  p.phase = s.phase;
  p.announced = s.announced;
  p.phaseMs = std::max<std::int64_t>(0, (unixMicrosNow() - s.phaseBeganUs) / 1000);
  p.collectives = s.collectives;
  p.inCollective = s.inCollective;
  p.bucket = s.bucket;
  p.buckets = s.buckets;
  p.collectiveKind = s.collectiveKind;
  p.stillMs = std::max<std::int64_t>(0, stillMs);
  return p;
}

}  // namespace lockstep::agent
