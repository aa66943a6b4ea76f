#pragma once
// The trainer's own GPU kernels: what cuBLASLt's GEMM epilogues do not cover. Each launcher
// enqueues on `stream` and returns at once. `T` is the math type of activations: float (fp32,
// tf32) or __nv_bfloat16 (bf16); master weights, gradients and optimizer state are always float.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "element_math.h"

namespace lockstep::trainer::gpu {

enum class Act { kRelu, kGelu };

// Writes the step's header into grads[0..2]: loss sum 0 (the loss kernel adds to it), the sample
// count and the stop vote.
void launchSetHeader(float* grads, float samples, float stopVote, cudaStream_t stream);

// Holds `stream` back for about `microseconds` (LOCKSTEP_TEST_COMM_DELAY's stand-in for a slow link).
void launchSpin(std::uint32_t microseconds, cudaStream_t stream);

// batch[i][:] = data[indices[i]][:], and labels likewise.
template <class T>
void launchGather(const T* data, const std::int32_t* labels, const std::uint32_t* indices, std::uint32_t rows,
                  std::uint32_t dim, T* batch, std::int32_t* batchLabels, cudaStream_t stream);

// Converts n floats to T (data upload, weight copies).
template <class T>
void launchConvert(const float* in, T* out, std::size_t n, cudaStream_t stream);

// act = activation(pre), element-wise.
template <class T>
void launchActivation(const T* pre, T* act, std::size_t n, Act a, cudaStream_t stream);
// grad *= activation'(pre) (for ReLU, pre may be the activation: the sign is the same).
template <class T>
void launchActivationBackward(T* grad, const T* pre, std::size_t n, Act a, cudaStream_t stream);

// Softmax cross-entropy of float logits [rows, classes]: adds the summed loss to *lossSum and
// writes dlogits = softmax - onehot (the gradient of the summed loss) as T.
template <class T>
void launchSoftmaxCrossEntropy(const float* logits, const std::int32_t* labels, std::uint32_t rows,
                               std::uint32_t classes, T* dlogits, float* lossSum, cudaStream_t stream);

// out[c] (+)= sum_r m[r][c] over a row-major [rows, cols] matrix.
template <class T>
void launchColumnSums(const T* m, std::uint32_t rows, std::uint32_t cols, float* out, bool accumulate,
                      cudaStream_t stream);

// out[i] (+)= in[i] (a bias gradient cuBLASLt wrote in T, into the float gradient buffer).
template <class T>
void launchAddInto(const T* in, float* out, std::size_t n, bool accumulate, cudaStream_t stream);

// The optimizer on params[0, n) (a bucket), with the CPU backend's per-parameter rule
// (element_math.h), but the gradient scale (1 / samples of the global step) read from the reduced
// header on the device, so that the host never waits for it: args.gradScale is ignored. Also
// refreshes the low-precision copy of the weights the GEMMs read (lowParams null: none).
template <class T>
void launchSgd(float* params, const float* grads, float* momentum, T* lowParams, std::size_t n,
               const float* sampleCount, const kernels::SgdParams& args, cudaStream_t stream);
template <class T>
void launchAdamW(float* params, const float* grads, float* expAvg, float* expAvgSq, T* lowParams, std::size_t n,
                 const float* sampleCount, const kernels::AdamWParams& args, cudaStream_t stream);

}  // namespace lockstep::trainer::gpu
