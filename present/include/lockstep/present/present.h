#pragma once
// How Lockstep shows a figure, in one place for the dashboard, the History window, lockstepctl and
// the reports: numbers, units, durations, what an unknown value looks like, and which throughput a
// job's "Samples/s" means. No Qt (the app converts the text); locale-independent (std::to_chars):
// Qt applications set the C library's locale from the environment, and a decimal comma would break
// SVG coordinates, CSV and JSON.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/kpi/kpi.h"
#include "lockstep/kpi/network.h"
#include "lockstep/kpi/timeline.h"

namespace lockstep::present {

// Shown for a figure that is not known: never 0, which would be a claim.
inline constexpr std::string_view kUnknown = "–";

// Fixed decimals with thousands separators: number(12400.26, 1) == "12,400.3"; NaN/inf: kUnknown.
std::string number(double value, int decimals);
// Fixed decimals without separators, for coordinates and files: plainNumber(3.14159, 1) == "3.1";
// NaN/inf: "0".
std::string plainNumber(double value, int decimals);
// The same, kUnknown when there is no value, with a unit after it: figure(12400, 0, " samples/s").
std::string figure(const std::optional<double>& value, int decimals, std::string_view unit = "");
std::string percent(const std::optional<double>& fraction, int decimals = 1);  // 0.412 -> 41.2%
std::string duration(double seconds);                                          // 42 s, 3.5 min, 2.1 h
std::string bytes(double count);                                               // 1.5 GiB
std::string bandwidth(const std::optional<double>& bytesPerSecond);            // 12.3 GB/s (decimal, as nccl-tests)
std::string flopsRate(const std::optional<double>& flopsPerSecond);            // 989.5 TFLOP/s
// Cents, except below a cent, which gets two significant digits (a short job's cost is small, not
// nothing): "2.50 USD", "0.0031 USD".
std::string money(double amount, std::string_view currency);

// A job's nodes in a title or a cell, once each in natural order (node2 before node10): all of
// them when few, else their count and the first few: "gpu-a, gpu-b" or "40 nodes (gpu-0, gpu-1,
// gpu-2, …)". The text never grows with the cluster.
std::string nodesText(std::vector<std::string> nodes, std::size_t named = 4);

// An interface's throughput against its link, as links are sold (bits): "eth0 ↓1.20 Gb/s ↑800 Mb/s
// of 25 Gb/s (4.8%)", or ", link speed unknown" where the driver gives none.
std::string networkRate(const kpi::NetRate& rate);
// Bytes per second as links are sold, in bits: bitRate(125e6) == "1.00 Gb/s".
std::string bitRate(double bytesPerSecond);

// Chart axes: the round tick step (1, 2 or 5 times a power of ten) that covers `span` in at most
// `intervals` steps, and the decimals its labels need (0.02 steps read 0.02, 0.04, not 0.0, 0.0).
double tickStep(double span, int intervals);
int tickDecimals(double step);

// A step's phase as the timeline (app), its figure (report) and its legend colour it: "#rrggbb".
std::string_view phaseColor(kpi::Phase phase);
// And as their legends name it: "exposed communication", "named phase", "collective (filled:
// exposed)", else kpi::phaseName.
std::string_view phaseLegend(kpi::Phase phase);
// A collective as the timeline labels it: "all-gather 8.0 MiB"; "barrier" (no bytes).
std::string collectiveLabel(CollectiveKind kind, std::uint64_t bytes);
// Each kind's part of the exposed communication (CollectiveKpis::exposedShare), the largest
// first, the first `shown` of them: "all-reduce 31.0% · all-gather 12.0%", "" when none.
std::string collectiveSplit(const std::vector<kpi::CollectiveKpis>& kinds, std::size_t shown = 3);
// What a rank holds of the model's state at most, and an asynchronous job's staleness:
// "parameters 7.1 MiB, gradients 7.1 MiB, optimizer state 4.7 MiB per rank; staleness 1.2 (p99 3)";
// "" when no rank said.
std::string modelStateText(const kpi::JobKpis& k);
// Model FLOPs utilization (docs/kpis.md): "41.2% of peak (3.3 PFLOP/s of 7.9 PFLOP/s)", or
// "– (3.3 PFLOP/s; no peak known)" when only the FLOPs are; "" when no rank counted FLOPs.
std::string mfuText(const kpi::JobKpis& k);
// The FLOP/s the MFU is the ratio of: the ranks' with a peak (all of them, unless some lack one).
std::optional<double> mfuFlopsRate(const kpi::JobKpis& k);
// Where its figures came from: "FLOPs: declared by the program; peak: <the agents' words>".
std::string mfuBasisText(const kpi::JobKpis& k);
// The kind of data parallelism a trainer job runs: "all-reduce", "all-reduce, sharded: optimizer
// state (ZeRO 1)", "parameter server, synchronous", "parameter server, asynchronous (staleness
// <= 3)".
std::string parallelismText(const JobSpec& spec);

// A job's "Samples/s": while it runs, the rate over the last 10 s; once it ended, the whole job's
// mean (every sample over the elapsed time, start-up included), which is what it delivered.
kpi::Maybe jobThroughput(const kpi::JobKpis& k, bool ended);
// What jobThroughput means, for a tooltip or a report's "how it was obtained".
std::string_view jobThroughputMeaning(bool ended);

}  // namespace lockstep::present
