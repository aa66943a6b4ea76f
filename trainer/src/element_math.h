#pragma once
// The per-element math that both backends run: GELU and its derivative, and PyTorch's SGD and
// AdamW rules for one parameter. Written once, for the CPU loops (kernels.cpp) and the CUDA kernels
// (cuda/kernels.cu), so that the CPU tests, which compare training against PyTorch, check the
// formulas the GPU computes too. Plain C math functions (erff, expf, sqrtf) exist on both sides.

#include <math.h>

#if defined(__CUDACC__)
#define LOCKSTEP_HOST_DEVICE __host__ __device__
#else
#define LOCKSTEP_HOST_DEVICE
#endif

namespace lockstep::trainer::kernels {

// PyTorch's default (exact, erf-based) GELU: x * Phi(x).
LOCKSTEP_HOST_DEVICE inline float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

// d/dx of gelu: Phi(x) + x * phi(x).
LOCKSTEP_HOST_DEVICE inline float geluGrad(float x) {
  return 0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x);
}

struct SgdParams {
  float lr = 0;
  float gradScale = 1;  // multiplies the raw gradient (1 / samples in the global step)
  float momentum = 0;
  float weightDecay = 0;
  bool nesterov = false;
};

// One parameter's SGD step, PyTorch's rule: g = scale * grad + wd * param; with momentum
// buf = mu * buf + g and the step is buf (Nesterov: g + mu * buf). A zeroed buffer gives PyTorch's
// first-step buffer = g. Returns the new parameter; buf is untouched without momentum.
LOCKSTEP_HOST_DEVICE inline float sgdStep(float param, float grad, float& buf, const SgdParams& p) {
  const float g = p.gradScale * grad + p.weightDecay * param;
  if (p.momentum == 0.0f) return param - p.lr * g;
  const float b = p.momentum * buf + g;
  buf = b;
  return param - p.lr * (p.nesterov ? g + p.momentum * b : b);
}

struct AdamWParams {
  float lr = 0;
  float gradScale = 1;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weightDecay = 0;
  float stepSize = 0;                // lr / (1 - beta1^t)
  float biasCorrection2Sqrt = 1;     // sqrt(1 - beta2^t)
};

// One parameter's AdamW step, PyTorch's rule and order of operations (decoupled weight decay,
// then param -= stepSize * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)). Returns the new parameter
// and updates both moments.
LOCKSTEP_HOST_DEVICE inline float adamwStep(float param, float grad, float& expAvg, float& expAvgSq,
                                            const AdamWParams& p) {
  const float g = p.gradScale * grad;
  const float m = p.beta1 * expAvg + (1.0f - p.beta1) * g;
  const float v = p.beta2 * expAvgSq + (1.0f - p.beta2) * g * g;
  expAvg = m;
  expAvgSq = v;
  const float decayed = param * (1.0f - p.lr * p.weightDecay);
  return decayed - p.stepSize * m / (sqrtf(v) / p.biasCorrection2Sqrt + p.eps);
}

}  // namespace lockstep::trainer::kernels
