#pragma once
// One table per job-spec enum: each value's name (what flags, checkpoints, workload keys and JSON
// say: "bf16") and its title (what reports show: "BF16"). Everything that turns these enums into
// text, or text into them, goes through the tables. codec.cpp ties the values to the protobuf
// ones with static_asserts.

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "lockstep/protocol/types.h"

namespace lockstep {

template <typename E>
struct Named {
  E value;
  std::string_view name;
  std::string_view title;
};

inline constexpr Named<Backend> kBackendNames[] = {{Backend::kCpu, "cpu", "CPU"}, {Backend::kCuda, "cuda", "CUDA"}};
inline constexpr Named<Activation> kActivationNames[] = {{Activation::kRelu, "relu", "ReLU"},
                                                         {Activation::kGelu, "gelu", "GELU"}};
inline constexpr Named<Precision> kPrecisionNames[] = {
    {Precision::kFp32, "fp32", "FP32"}, {Precision::kTf32, "tf32", "TF32"}, {Precision::kBf16, "bf16", "BF16"},
    {Precision::kFp16, "fp16", "FP16"}, {Precision::kFp8, "fp8", "FP8"}};
inline constexpr Named<FlopsBasis> kFlopsBasisNames[] = {
    {FlopsBasis::kDeclared, "declared", "declared by the program"},
    {FlopsBasis::kTokens, "tokens", "6 × parameters × tokens"},
    {FlopsBasis::kLayers, "layers", "counted on linear and convolution layers"}};
inline constexpr Named<OptimizerKind> kOptimizerNames[] = {{OptimizerKind::kSgd, "sgd", "SGD"},
                                                           {OptimizerKind::kAdamW, "adamw", "AdamW"}};
inline constexpr Named<LrScaling> kLrScalingNames[] = {{LrScaling::kNone, "none", "none"},
                                                       {LrScaling::kLinear, "linear", "linear"}};
inline constexpr Named<Shard> kShardNames[] = {{Shard::kNone, "none", "none"},
                                               {Shard::kOptimizer, "optimizer", "optimizer state (ZeRO 1)"},
                                               {Shard::kGradients, "gradients", "gradients (ZeRO 2)"},
                                               {Shard::kParameters, "parameters", "parameters (ZeRO 3)"}};
inline constexpr Named<Sync> kSyncNames[] = {{Sync::kAllReduce, "allreduce", "all-reduce"},
                                             {Sync::kParameterServer, "parameter-server", "parameter server"}};

inline constexpr Named<SupervisionState> kSupervisionStateNames[] = {
    {SupervisionState::kNone, "none", "not supervised"},
    {SupervisionState::kFollowing, "following", "following"},
    {SupervisionState::kRestarting, "restarting", "restarting"},
    {SupervisionState::kEnded, "ended", "ended"},
    {SupervisionState::kStandby, "standby", "standing by"}};

inline constexpr Named<OnStall> kOnStallNames[] = {
    {OnStall::kReport, "report", "report"}, {OnStall::kStop, "stop", "stop"}, {OnStall::kRestart, "restart", "restart"}};

inline constexpr Named<CollectiveKind> kCollectiveKindNames[] = {
    {CollectiveKind::kAllReduce, "all_reduce", "all-reduce"},
    {CollectiveKind::kReduceScatter, "reduce_scatter", "reduce-scatter"},
    {CollectiveKind::kAllGather, "all_gather", "all-gather"},
    {CollectiveKind::kBroadcast, "broadcast", "broadcast"},
    {CollectiveKind::kAllToAll, "all_to_all", "all-to-all"},
    {CollectiveKind::kBarrier, "barrier", "barrier"},
    {CollectiveKind::kReduce, "reduce", "reduce"},
    {CollectiveKind::kGather, "gather", "gather"},
    {CollectiveKind::kScatter, "scatter", "scatter"},
    {CollectiveKind::kSendRecv, "send_recv", "send/recv"},
    {CollectiveKind::kPush, "push", "push"},
    {CollectiveKind::kPull, "pull", "pull"}};

constexpr std::span<const Named<Backend>> namesOf(Backend) { return kBackendNames; }
constexpr std::span<const Named<OnStall>> namesOf(OnStall) { return kOnStallNames; }
constexpr std::span<const Named<Activation>> namesOf(Activation) { return kActivationNames; }
constexpr std::span<const Named<Precision>> namesOf(Precision) { return kPrecisionNames; }
constexpr std::span<const Named<FlopsBasis>> namesOf(FlopsBasis) { return kFlopsBasisNames; }
constexpr std::span<const Named<OptimizerKind>> namesOf(OptimizerKind) { return kOptimizerNames; }
constexpr std::span<const Named<LrScaling>> namesOf(LrScaling) { return kLrScalingNames; }
constexpr std::span<const Named<Shard>> namesOf(Shard) { return kShardNames; }
constexpr std::span<const Named<Sync>> namesOf(Sync) { return kSyncNames; }
constexpr std::span<const Named<SupervisionState>> namesOf(SupervisionState) { return kSupervisionStateNames; }
constexpr std::span<const Named<CollectiveKind>> namesOf(CollectiveKind) { return kCollectiveKindNames; }

template <typename E>
constexpr std::string_view nameOf(E value) {
  for (const auto& n : namesOf(value)) {
    if (n.value == value) return n.name;
  }
  return "unknown";
}

template <typename E>
constexpr std::string_view titleOf(E value) {
  for (const auto& n : namesOf(value)) {
    if (n.value == value) return n.title;
  }
  return "unknown";
}

template <typename E>
std::optional<E> named(std::string_view name) {
  for (const auto& n : namesOf(E{})) {
    if (n.name == name) return n.value;
  }
  return std::nullopt;
}

// "relu, gelu": the names, for an error message.
template <typename E>
std::string namesText() {
  std::string out;
  for (const auto& n : namesOf(E{})) out += (out.empty() ? "" : ", ") + std::string(n.name);
  return out;
}

}  // namespace lockstep
