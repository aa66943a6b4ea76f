#include "optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace lockstep::trainer {

Optimizer::Optimizer(const OptimizerSpec& spec, const ParamLayout& layout) : Optimizer(spec, 0, layout.totalFloats()) {}

Optimizer::Optimizer(const OptimizerSpec& spec, std::size_t begin, std::size_t end) : spec_(spec), begin_(begin), end_(end) {
  if (spec_.kind == OptimizerKind::kAdamW) {
    first_.assign(end - begin, 0.0f);
    second_.assign(end - begin, 0.0f);
  } else if (spec_.momentum > 0.0) {
    first_.assign(end - begin, 0.0f);
  }
}

void Optimizer::beginStep(double lr) {
  ++steps_;
  lr_ = lr;
}

void Optimizer::apply(float* params, const float* grads, std::size_t begin, std::size_t end, float gradScale) {
  begin = std::max({begin, ParamLayout::kHeaderFloats, begin_});
  end = std::min(end, end_);
  if (begin >= end) return;
  update(params + begin, grads + begin, begin - begin_, end - begin, gradScale);
}

void Optimizer::applyToRange(float* params, const float* grads, float gradScale) {
  // The header floats, where the range holds them, are not parameters.
  const std::size_t skip = begin_ < ParamLayout::kHeaderFloats ? ParamLayout::kHeaderFloats - begin_ : 0;
  if (begin_ + skip >= end_) return;
  update(params + skip, grads + skip, skip, end_ - begin_ - skip, gradScale);
}

void Optimizer::update(float* params, const float* grads, std::size_t state, std::size_t n, float gradScale) {
  if (spec_.kind == OptimizerKind::kSgd) {
    kernels::sgdUpdate(params, grads, first_.empty() ? nullptr : first_.data() + state, n, sgdParams(gradScale));
    return;
  }
  kernels::adamwUpdate(params, grads, first_.data() + state, second_.data() + state, n, adamwParams(gradScale));
}

kernels::SgdParams Optimizer::sgdParams(float gradScale) const {
  kernels::SgdParams p;
  p.lr = static_cast<float>(lr_);
  p.gradScale = gradScale;
  p.momentum = static_cast<float>(spec_.momentum);
  p.weightDecay = static_cast<float>(spec_.weightDecay);
  p.nesterov = spec_.nesterov;
  return p;
}

kernels::AdamWParams Optimizer::adamwParams(float gradScale) const {
  kernels::AdamWParams p;
  p.lr = static_cast<float>(lr_);
  p.gradScale = gradScale;
  p.beta1 = static_cast<float>(spec_.beta1);
  p.beta2 = static_cast<float>(spec_.beta2);
  p.eps = static_cast<float>(spec_.eps);
  p.weightDecay = static_cast<float>(spec_.weightDecay);
  // In double, as PyTorch computes these Python floats.
  const auto t = static_cast<double>(steps_);
  p.stepSize = static_cast<float>(lr_ / (1.0 - std::pow(spec_.beta1, t)));
  p.biasCorrection2Sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(spec_.beta2, t)));
  return p;
}

std::vector<Optimizer::StateBuffer> Optimizer::stateBuffers() {
  if (spec_.kind == OptimizerKind::kAdamW) return {{"exp_avg", &first_}, {"exp_avg_sq", &second_}};
  if (!first_.empty()) return {{"momentum_buffer", &first_}};
  return {};
}

double effectiveLearningRate(const JobSpec& spec) { return learningRateFor(spec, spec.globalBatch()); }

double learningRateFor(const JobSpec& spec, std::uint64_t updateBatch) {
  if (spec.optimizer.lrScaling == LrScaling::kNone) return spec.optimizer.lr;
  const double base = spec.optimizer.lrBaseBatch > 0 ? spec.optimizer.lrBaseBatch : spec.batchPerRank;
  return spec.optimizer.lr * static_cast<double>(updateBatch) / base;
}

}  // namespace lockstep::trainer
