#pragma once
// A job's KPIs as its supervising agent sends them to a client (docs/fan-in.md): the job's figures,
// its slowest ranks and collectives whole, and the rows of the ranks asked for and of the GPUs of
// those ranks' nodes. The bytes travel as FrameReply::kpis (protocol/types.h); what a frame holds
// is exactly what the supervising agent's KPI engine computed, so a client shows the same figures
// as one that reads every agent's stream (tests/fan_in_test.cpp holds them against each other).

#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/kpi/kpi.h"

namespace lockstep::kpi {

// `head` (a job's KPIs without their rows) with the rows of ranks [from, from + count) and of its
// slowest ranks that are slower than the median out of `ranks` (in rank order, as JobTracker::snapshot gives them), and of the
// GPUs on those ranks' nodes.
// Costs the rows it copies and a look at each GPU's node, whatever the job's size.
JobKpis withRanks(JobKpis head, std::span<const RankKpis> ranks, std::span<const GpuKpis> gpus, std::uint32_t from,
                  std::uint32_t count);

// A frame's heatmap holds at most so many blocks of nodes: a node a block up to 2,048 nodes (16,384
// GPUs), two from there to 4,096, and so on.
inline constexpr std::size_t kMaxNodeBlocks = 2048;
// The job's nodes (those its current attempt is placed on; without a placement, those `ranks` and
// `gpus` name) in natural order, in at most kMaxNodeBlocks blocks of as many nodes each (the last
// may hold fewer), with their devices' utilization: the GPUs of `gpus` (the job's), or the ranks'
// CPU % where no GPU has a reading. A node without a reading is in its block all the same (one that
// withoutReadings() blanked among them). Costs a look at every row.
std::vector<NodeBlock> nodeBlocks(std::span<const RankPlacement> placement, std::span<const RankKpis> ranks,
                                  std::span<const GpuKpis> gpus);

// The rows of `unread` nodes, whose agents did not answer the last read, lose their latest
// readings, which are not current: a GPU's utilization, memory, power and temperature, a rank's CPU
// and memory (so a lost node's rows and heatmap block go blank, as a streamed heatmap's row does
// when its samples stop). What covers the job so far (a GPU's mean utilization and energy, a
// rank's steps and their figures) stays.
void withoutReadings(const std::set<std::string, std::less<>>& unread, std::span<RankKpis> ranks,
                     std::span<GpuKpis> gpus);

std::string encodeFrame(const JobKpis& k);
// Bounded as anything from the network is: at most kMaxFrameRanks rows of ranks (types.h).
Result<JobKpis> decodeFrame(std::string_view bytes);

}  // namespace lockstep::kpi
