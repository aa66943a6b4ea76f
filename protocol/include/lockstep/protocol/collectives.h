#pragma once
// What a step report's collectives mean (lockstep.proto's CollectiveTimes): the bus bandwidth of
// each kind, as nccl-tests defines it, and a report's collectives by kind, the trainer's all-reduce
// included. Every figure of collectives (the KPIs, the reports, the dashboard) goes through here.

#include <cstdint>
#include <optional>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep {

// busBw = algBw × factor, algBw = bytes / time (nccl-tests' PERFORMANCE.md): 2(n−1)/n for
// all-reduce, (n−1)/n for all-gather, reduce-scatter, all-to-all, gather and scatter, 1 for
// broadcast, reduce, send/recv and a parameter server's push and pull; 0 for a barrier, which moves no data.
// Alone (one rank) nothing crosses a bus: 0.
constexpr double busFactor(CollectiveKind kind, std::uint32_t ranks) {
  if (ranks <= 1) return 0.0;
  const double n = static_cast<double>(ranks);
  switch (kind) {
    case CollectiveKind::kAllReduce: return 2.0 * (n - 1.0) / n;
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather:
    case CollectiveKind::kAllToAll:
    case CollectiveKind::kGather:
    case CollectiveKind::kScatter: return (n - 1.0) / n;
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReduce:
    case CollectiveKind::kSendRecv:
    case CollectiveKind::kPush:
    case CollectiveKind::kPull: return 1.0;
    case CollectiveKind::kBarrier: return 0.0;
  }
  return 0.0;
}

// Bytes per second on the bus for `bytes` moved in `timeUs` among `ranks`; unknown for no time, no
// bytes or a barrier.
inline std::optional<double> busBandwidth(CollectiveKind kind, std::uint64_t bytes, std::int64_t timeUs, std::uint32_t ranks) {
  const double factor = busFactor(kind, ranks);
  if (timeUs <= 0 || bytes == 0 || factor <= 0.0) return std::nullopt;
  return static_cast<double>(bytes) / (static_cast<double>(timeUs) * 1e-6) * factor;
}

// The report's collectives; a report that carries none but times an all-reduce (lockstep-trainer,
// a DDP program on CPUs: one exposed interval, not per bucket) has that one, as all-reduce.
std::vector<CollectiveTimes> collectivesOf(const StepReport& report);

}  // namespace lockstep
