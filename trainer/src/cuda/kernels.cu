#include <cmath>

#include "kernels.cuh"

namespace lockstep::trainer::gpu {
namespace {

constexpr int kThreads = 256;

__device__ inline float toFloat(float x) { return x; }
__device__ inline float toFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ inline T fromFloat(float x);
template <>
__device__ inline float fromFloat<float>(float x) { return x; }
template <>
__device__ inline __nv_bfloat16 fromFloat<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

unsigned blocksFor(std::size_t n) {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535u * 16u ? blocks : 65535u * 16u);
}

using kernels::gelu;
using kernels::geluGrad;

__global__ void setHeader(float* grads, float samples, float stopVote) {
  grads[0] = 0.0f;
  grads[1] = samples;
  grads[2] = stopVote;
}

// One thread waits on the GPU's global nanosecond timer.
__global__ void spin(std::uint64_t nanoseconds) {
  std::uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

// One block per row, copying `Word`s (16 bytes where the row length allows).
template <class Word>
__global__ void gather(const Word* __restrict__ data, const std::int32_t* __restrict__ labels,
                       const std::uint32_t* __restrict__ indices, std::uint32_t rows, std::uint32_t words,
                       Word* __restrict__ batch, std::int32_t* __restrict__ batchLabels) {
  const std::uint32_t row = blockIdx.x;
  if (row >= rows) return;
  const std::uint32_t src = indices[row];
  const Word* in = data + std::size_t{src} * words;
  Word* out = batch + std::size_t{row} * words;
  for (std::uint32_t c = threadIdx.x; c < words; c += blockDim.x) out[c] = in[c];
  if (threadIdx.x == 0) batchLabels[row] = labels[src];
}

template <class T>
__global__ void convert(const float* __restrict__ in, T* __restrict__ out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = fromFloat<T>(in[i]);
  }
}

template <class T>
__global__ void activation(const T* __restrict__ pre, T* __restrict__ act, std::size_t n, Act a) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    const float x = toFloat(pre[i]);
    act[i] = fromFloat<T>(a == Act::kRelu ? fmaxf(x, 0.0f) : gelu(x));
  }
}

template <class T>
__global__ void activationBackward(T* __restrict__ grad, const T* __restrict__ pre, std::size_t n, Act a) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    const float x = toFloat(pre[i]);
    const float d = a == Act::kRelu ? (x > 0.0f ? 1.0f : 0.0f) : geluGrad(x);
    grad[i] = fromFloat<T>(toFloat(grad[i]) * d);
  }
}

// One block per row: max, sum of exponentials, loss, gradient.
template <class T>
__global__ void softmaxCrossEntropy(const float* __restrict__ logits, const std::int32_t* __restrict__ labels,
                                    std::uint32_t classes, T* __restrict__ dlogits, float* lossSum) {
  __shared__ float shared[kThreads / 32];
  __shared__ float broadcast;
  const float* z = logits + std::size_t{blockIdx.x} * classes;
  T* d = dlogits + std::size_t{blockIdx.x} * classes;
  const auto reduce = [&](float v, bool isMax) {
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_down_sync(0xffffffffu, v, offset);
      v = isMax ? fmaxf(v, other) : v + other;
    }
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
      float r = shared[0];
      for (unsigned w = 1; w < blockDim.x / 32; ++w) r = isMax ? fmaxf(r, shared[w]) : r + shared[w];
      broadcast = r;
    }
    __syncthreads();
    return broadcast;
  };
  float m = -INFINITY;
  for (std::uint32_t c = threadIdx.x; c < classes; c += blockDim.x) m = fmaxf(m, z[c]);
  const float maxLogit = reduce(m, true);
  float s = 0.0f;
  for (std::uint32_t c = threadIdx.x; c < classes; c += blockDim.x) s += expf(z[c] - maxLogit);
  const float sum = reduce(s, false);
  const float inv = 1.0f / sum;
  const auto label = static_cast<std::uint32_t>(labels[blockIdx.x]);
  for (std::uint32_t c = threadIdx.x; c < classes; c += blockDim.x) {
    const float p = expf(z[c] - maxLogit) * inv;
    d[c] = fromFloat<T>(c == label ? p - 1.0f : p);
  }
  if (threadIdx.x == 0) atomicAdd(lossSum, logf(sum) + maxLogit - z[label]);
}

// A column per thread, rows split across blockIdx.y; partial sums meet in the output by atomics.
template <class T>
__global__ void columnSums(const T* __restrict__ m, std::uint32_t rows, std::uint32_t cols, std::uint32_t rowsPerBlock,
                           float* __restrict__ out) {
  const std::uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const std::uint32_t begin = blockIdx.y * rowsPerBlock;
  const std::uint32_t end = min(rows, begin + rowsPerBlock);
  float s = 0.0f;
  for (std::uint32_t r = begin; r < end; ++r) s += toFloat(m[std::size_t{r} * cols + c]);
  atomicAdd(out + c, s);
}

template <class T>
__global__ void addInto(const T* __restrict__ in, float* __restrict__ out, std::size_t n, bool accumulate) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = (accumulate ? out[i] : 0.0f) + toFloat(in[i]);
  }
}

// The per-parameter rules are the CPU backend's (element_math.h).
template <class T>
__global__ void sgd(float* __restrict__ p, const float* __restrict__ grad, float* __restrict__ buf,
                    T* __restrict__ low, std::size_t n, const float* __restrict__ count, kernels::SgdParams a) {
  a.gradScale = 1.0f / *count;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    float b = buf != nullptr ? buf[i] : 0.0f;
    const float param = kernels::sgdStep(p[i], grad[i], b, a);
    if (buf != nullptr) buf[i] = b;
    p[i] = param;
    if (low != nullptr) low[i] = fromFloat<T>(param);
  }
}

template <class T>
__global__ void adamw(float* __restrict__ p, const float* __restrict__ grad, float* __restrict__ m1,
                      float* __restrict__ m2, T* __restrict__ low, std::size_t n, const float* __restrict__ count,
                      kernels::AdamWParams a) {
  a.gradScale = 1.0f / *count;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n; i += std::size_t{gridDim.x} * blockDim.x) {
    float m = m1[i], v = m2[i];
    const float param = kernels::adamwStep(p[i], grad[i], m, v, a);
    m1[i] = m;
    m2[i] = v;
    p[i] = param;
    if (low != nullptr) low[i] = fromFloat<T>(param);
  }
}

}  // namespace

void launchSpin(std::uint32_t microseconds, cudaStream_t stream) {
  if (microseconds > 0) spin<<<1, 1, 0, stream>>>(std::uint64_t{microseconds} * 1000);
}

void launchSetHeader(float* grads, float samples, float stopVote, cudaStream_t stream) {
  setHeader<<<1, 1, 0, stream>>>(grads, samples, stopVote);
}

template <class T>
void launchGather(const T* data, const std::int32_t* labels, const std::uint32_t* indices, std::uint32_t rows,
                  std::uint32_t dim, T* batch, std::int32_t* batchLabels, cudaStream_t stream) {
  if (rows == 0) return;
  // Rows start 16-byte aligned when their length is a multiple of 16 bytes (both buffers come
  // from cudaMalloc).
  if (std::size_t{dim} * sizeof(T) % sizeof(uint4) == 0) {
    const auto words = static_cast<std::uint32_t>(std::size_t{dim} * sizeof(T) / sizeof(uint4));
    gather<uint4><<<rows, kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(data), labels, indices, rows, words,
                                                 reinterpret_cast<uint4*>(batch), batchLabels);
  } else {
    gather<T><<<rows, kThreads, 0, stream>>>(data, labels, indices, rows, dim, batch, batchLabels);
  }
}

template <class T>
void launchConvert(const float* in, T* out, std::size_t n, cudaStream_t stream) {
  if (n > 0) convert<T><<<blocksFor(n), kThreads, 0, stream>>>(in, out, n);
}

template <class T>
void launchActivation(const T* pre, T* act, std::size_t n, Act a, cudaStream_t stream) {
  if (n > 0) activation<T><<<blocksFor(n), kThreads, 0, stream>>>(pre, act, n, a);
}

template <class T>
void launchActivationBackward(T* grad, const T* pre, std::size_t n, Act a, cudaStream_t stream) {
  if (n > 0) activationBackward<T><<<blocksFor(n), kThreads, 0, stream>>>(grad, pre, n, a);
}

template <class T>
void launchSoftmaxCrossEntropy(const float* logits, const std::int32_t* labels, std::uint32_t rows,
                               std::uint32_t classes, T* dlogits, float* lossSum, cudaStream_t stream) {
  if (rows > 0) softmaxCrossEntropy<T><<<rows, kThreads, 0, stream>>>(logits, labels, classes, dlogits, lossSum);
}

template <class T>
void launchColumnSums(const T* m, std::uint32_t rows, std::uint32_t cols, float* out, bool accumulate,
                      cudaStream_t stream) {
  if (!accumulate) cudaMemsetAsync(out, 0, sizeof(float) * cols, stream);
  if (rows == 0 || cols == 0) return;
  // Enough blocks to keep every SM's memory pipeline busy (a [8192, 1000] matrix: 512 blocks).
  constexpr std::uint32_t kRowsPerBlock = 64;
  const dim3 grid((cols + kThreads - 1) / kThreads, (rows + kRowsPerBlock - 1) / kRowsPerBlock);
  columnSums<T><<<grid, kThreads, 0, stream>>>(m, rows, cols, kRowsPerBlock, out);
}

template <class T>
void launchAddInto(const T* in, float* out, std::size_t n, bool accumulate, cudaStream_t stream) {
  if (n > 0) addInto<T><<<blocksFor(n), kThreads, 0, stream>>>(in, out, n, accumulate);
}

template <class T>
void launchSgd(float* params, const float* grads, float* momentum, T* lowParams, std::size_t n,
               const float* sampleCount, const kernels::SgdParams& args, cudaStream_t stream) {
  if (n > 0) sgd<T><<<blocksFor(n), kThreads, 0, stream>>>(params, grads, momentum, lowParams, n, sampleCount, args);
}

template <class T>
void launchAdamW(float* params, const float* grads, float* expAvg, float* expAvgSq, T* lowParams, std::size_t n,
                 const float* sampleCount, const kernels::AdamWParams& args, cudaStream_t stream) {
  if (n > 0) {
    adamw<T><<<blocksFor(n), kThreads, 0, stream>>>(params, grads, expAvg, expAvgSq, lowParams, n, sampleCount, args);
  }
}

#define LOCKSTEP_INSTANTIATE(T)                                                                                   \
  template void launchGather<T>(const T*, const std::int32_t*, const std::uint32_t*, std::uint32_t, std::uint32_t, \
                                T*, std::int32_t*, cudaStream_t);                                                 \
  template void launchConvert<T>(const float*, T*, std::size_t, cudaStream_t);                                    \
  template void launchActivation<T>(const T*, T*, std::size_t, Act, cudaStream_t);                                \
  template void launchActivationBackward<T>(T*, const T*, std::size_t, Act, cudaStream_t);                        \
  template void launchSoftmaxCrossEntropy<T>(const float*, const std::int32_t*, std::uint32_t, std::uint32_t, T*, \
                                             float*, cudaStream_t);                                               \
  template void launchColumnSums<T>(const T*, std::uint32_t, std::uint32_t, float*, bool, cudaStream_t);          \
  template void launchAddInto<T>(const T*, float*, std::size_t, bool, cudaStream_t);                              \
  template void launchSgd<T>(float*, const float*, float*, T*, std::size_t, const float*, const kernels::SgdParams&,     \
                             cudaStream_t);                                                                       \
  template void launchAdamW<T>(float*, const float*, float*, float*, T*, std::size_t, const float*,               \
                               const kernels::AdamWParams&, cudaStream_t);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(__nv_bfloat16)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep::trainer::gpu
