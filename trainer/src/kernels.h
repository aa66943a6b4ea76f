#pragma once
// Element-wise CPU kernels of the trainer. GEMMs go to OpenBLAS; these are the memory-bound loops
// around them. On x86-64 each is compiled for AVX-512, AVX2 and baseline, picked at load time.

#include <cstddef>
#include <cstdint>

#include "element_math.h"
#include "lockstep/protocol/types.h"

namespace lockstep::trainer::kernels {

// pre[r][c] += bias[c]; act[r][c] = activation(pre[r][c]).
void biasActivation(float* pre, float* act, const float* bias, std::size_t rows, std::size_t cols, Activation a);

// logits[r][c] += bias[c], then softmax cross-entropy: returns the summed loss over rows and writes
// dlogits = softmax - onehot(label) (the gradient of the summed loss).
double biasSoftmaxCrossEntropy(float* logits, const float* bias, const std::int32_t* labels, float* dlogits,
                               std::size_t rows, std::size_t classes);

// grad[i] *= activation'(pre[i]).
void activationBackward(float* grad, const float* pre, std::size_t n, Activation a);

// out[c] (+)= sum_r m[r][c].
void columnSums(const float* m, std::size_t rows, std::size_t cols, float* out, bool accumulate);

// c[i] = a[i] + b[i] (c may be a); Gloo's reduce function signature.
void sumFloats(void* c, const void* a, const void* b, std::size_t n);

// The optimizer rules over a range (element_math.h has the per-parameter math).
void sgdUpdate(float* param, const float* grad, float* momentumBuf, std::size_t n, const SgdParams& p);
void adamwUpdate(float* param, const float* grad, float* expAvg, float* expAvgSq, std::size_t n,
                 const AdamWParams& p);

}  // namespace lockstep::trainer::kernels
