#include "lockstep/protocol/collectives.h"

namespace lockstep {

std::vector<CollectiveTimes> collectivesOf(const StepReport& report) {
  if (!report.collectives.empty() || !report.allreduceTimeUs) return report.collectives;
  CollectiveTimes allReduce;
  allReduce.kind = CollectiveKind::kAllReduce;
  allReduce.count = report.bytesReduced.value_or(0) > 0 || *report.allreduceTimeUs > 0 ? 1 : 0;
  allReduce.timeUs = *report.allreduceTimeUs;
  allReduce.exposedUs = report.exposedCommTimeUs.value_or(0);
  allReduce.bytes = report.bytesReduced.value_or(0);
  return {allReduce};
}

}  // namespace lockstep
