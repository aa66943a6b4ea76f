#pragma once

#include <cstdint>
// Range, size and consistency checks shared by every part: the trainer validates its flags with
// validateJobSpec, the agent validates StartJob with it, the codec validates what it decodes.
// Errors are InvalidArgument and say which field is wrong and what would be right.

#include <string_view>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

Result<void> validateJobId(const std::string& jobId);
// A job spec on its own: sizes, ranges, exactly one of steps/epochs, rank placements; for a
// command job its argv, working directory and environment. Dataset files and programs are not
// looked at here (that needs the node's file system).
Result<void> validateJobSpec(const JobSpec& spec);
// An asynchronous parameter server's bound against its ranks (docs/trainer.md): with W ranks a
// gradient is W-1 updates old even in lockstep, so --staleness K needs K >= W-1. Part of
// validateJobSpec; the trainer checks it again once its environment says how many ranks there are.
Result<void> validateStaleness(const JobSpec& spec);
// --sync and what goes with it (--staleness, --shard, --balance, --steps). Part of validateJobSpec.
Result<void> validateSync(const JobSpec& spec);
// --ps-ranks against the ranks: each part of the server lives in a rank's process. Part of
// validateJobSpec where the spec knows more than one rank; the trainer checks it again once its
// environment says how many there are.
Result<void> validatePsRanks(const JobSpec& spec);
// The variables the agent sets for every rank of a command job (torchrun's, CUDA_VISIBLE_DEVICES,
// LOCKSTEP_*, TORCHELASTIC_*), which the job's own environment may not set.
bool isRankVariable(std::string_view name);
Result<void> validateNodeHello(const NodeHello& hello);
Result<void> validateJobEvent(const JobEvent& event);
Result<void> validateGpuSample(const GpuSample& sample);
Result<void> validateProcessSample(const ProcessSample& sample);
Result<void> validateNetSample(const NetSample& sample);
// A step's times: over a week is a unit mistaken (ns for us). A rank's clock in Unix microseconds:
// past 10^16 (the year 2286) it is another unit.
inline constexpr std::int64_t kMaxStepTimeUs = 7LL * 24 * 3600 * 1'000'000;
// A peak no one rank's hardware reaches (100 PFLOP/s): beyond it a unit was mistaken.
inline constexpr double kMaxPeakFlops = 1e17;
// A rank's model FLOPs in one step: a week (kMaxStepTimeUs) at that peak, 6e22.
inline constexpr double kMaxStepFlops = kMaxPeakFlops * 604800;
inline constexpr std::int64_t kMaxTimeUnixUs = 10'000'000'000'000'000;
// A step report's collectives: at most one entry per kind, and at most kMaxCollectiveSpans one by
// one; no list of a record holds more than kMaxRecordListItems (what the codec reads of one).
inline constexpr std::size_t kMaxCollectiveSpans = 64;
// A job's alert rules and webhooks (docs/alerts.md).
inline constexpr std::size_t kMaxAlertRules = 64;
inline constexpr std::size_t kMaxAlertRuleBytes = 512;
inline constexpr std::size_t kMaxWebhooks = 16;
inline constexpr std::size_t kMaxWebhookUrlBytes = 2048;
inline constexpr std::size_t kMaxRecordListItems = 64;
// The specs a ListJobsRequest may say its client holds.
inline constexpr std::size_t kMaxKnownSpecs = 4096;
// The jobs a FetchRequest may leave out (the jobs a client watches fanned in).
inline constexpr std::size_t kMaxJobsLeftOut = 64;
Result<void> validateStepReport(const StepReport& report);
// A phase's name: 1 to kMaxPhaseNameBytes bytes of UTF-8, no control characters.
inline constexpr std::size_t kMaxPhaseNameBytes = 64;
Result<void> validatePhaseReport(const PhaseReport& report);

}  // namespace lockstep
