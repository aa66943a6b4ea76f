#include "kernels.h"

#include <algorithm>
#include <cmath>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOCKSTEP_SIMD __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LOCKSTEP_SIMD
#endif

namespace lockstep::trainer::kernels {
namespace {

LOCKSTEP_SIMD void biasRelu(float* __restrict pre, float* __restrict act, const float* __restrict bias,
                            std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r) {
    float* p = pre + r * cols;
    float* a = act + r * cols;
    for (std::size_t c = 0; c < cols; ++c) {
      const float z = p[c] + bias[c];
      p[c] = z;
      a[c] = z > 0.0f ? z : 0.0f;
    }
  }
}

LOCKSTEP_SIMD void reluBackward(float* __restrict grad, const float* __restrict pre, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) grad[i] = pre[i] > 0.0f ? grad[i] : 0.0f;
}

}  // namespace

void biasActivation(float* pre, float* act, const float* bias, std::size_t rows, std::size_t cols, Activation a) {
  if (a == Activation::kRelu) {
    biasRelu(pre, act, bias, rows, cols);
    return;
  }
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) {
      const float z = pre[r * cols + c] + bias[c];
      pre[r * cols + c] = z;
      act[r * cols + c] = gelu(z);
    }
  }
}

double biasSoftmaxCrossEntropy(float* logits, const float* bias, const std::int32_t* labels, float* dlogits,
                               std::size_t rows, std::size_t classes) {
  double lossSum = 0.0;
  for (std::size_t r = 0; r < rows; ++r) {
    float* z = logits + r * classes;
    float* d = dlogits + r * classes;
    float maxLogit = -INFINITY;
    for (std::size_t c = 0; c < classes; ++c) {
      z[c] += bias[c];
      maxLogit = std::max(maxLogit, z[c]);
    }
    float sum = 0.0f;
    for (std::size_t c = 0; c < classes; ++c) {
      d[c] = std::exp(z[c] - maxLogit);
      sum += d[c];
    }
    const float inv = 1.0f / sum;
    for (std::size_t c = 0; c < classes; ++c) d[c] *= inv;
    const auto label = static_cast<std::size_t>(labels[r]);
    lossSum += static_cast<double>(std::log(sum) + maxLogit - z[label]);
    d[label] -= 1.0f;
  }
  return lossSum;
}

void activationBackward(float* grad, const float* pre, std::size_t n, Activation a) {
  if (a == Activation::kRelu) {
    reluBackward(grad, pre, n);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) grad[i] *= geluGrad(pre[i]);
}

LOCKSTEP_SIMD void columnSums(const float* __restrict m, std::size_t rows, std::size_t cols, float* __restrict out,
                              bool accumulate) {
  if (!accumulate) std::fill(out, out + cols, 0.0f);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* row = m + r * cols;
    for (std::size_t c = 0; c < cols; ++c) out[c] += row[c];
  }
}

LOCKSTEP_SIMD void sumFloats(void* c, const void* a, const void* b, std::size_t n) {
  auto* out = static_cast<float*>(c);  // may be a: no __restrict
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

LOCKSTEP_SIMD void sgdUpdate(float* __restrict param, const float* __restrict grad, float* __restrict momentumBuf,
                             std::size_t n, const SgdParams& p) {
  const SgdParams q = p;  // a local: stores through param cannot change it, so the loop vectorises
  if (q.momentum == 0.0f) {
    float unused = 0.0f;
    for (std::size_t i = 0; i < n; ++i) param[i] = sgdStep(param[i], grad[i], unused, q);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) param[i] = sgdStep(param[i], grad[i], momentumBuf[i], q);
}

LOCKSTEP_SIMD void adamwUpdate(float* __restrict param, const float* __restrict grad, float* __restrict expAvg,
                               float* __restrict expAvgSq, std::size_t n, const AdamWParams& p) {
  const AdamWParams q = p;
  for (std::size_t i = 0; i < n; ++i) param[i] = adamwStep(param[i], grad[i], expAvg[i], expAvgSq[i], q);
}

}  // namespace lockstep::trainer::kernels
