#include "gpu_model.h"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>

#include "cuda_check.h"
#include "kernels.cuh"

namespace lockstep::trainer::gpu {
namespace {

constexpr std::size_t kWorkspaceBytes = 64u << 20;

template <class T>
constexpr cudaDataType_t dataType() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct PinnedFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
template <class T>
using DevicePtr = std::unique_ptr<T, CudaFree>;
template <class T>
using PinnedPtr = std::unique_ptr<T, PinnedFree>;

template <class T>
Result<DevicePtr<T>> deviceAlloc(std::size_t count, bool zero = true) {
  void* p = nullptr;
  LOCKSTEP_CUDA(cudaMalloc(&p, std::max<std::size_t>(1, count) * sizeof(T)));
  DevicePtr<T> out(static_cast<T*>(p));
  if (zero) LOCKSTEP_CUDA(cudaMemset(p, 0, std::max<std::size_t>(1, count) * sizeof(T)));
  return out;
}

template <class T>
Result<PinnedPtr<T>> pinnedAlloc(std::size_t count) {
  void* p = nullptr;
  LOCKSTEP_CUDA(cudaMallocHost(&p, std::max<std::size_t>(1, count) * sizeof(T)));
  return PinnedPtr<T>(static_cast<T*>(p));
}

// Whether an environment switch (LOCKSTEP_GEMM_TUNING, LOCKSTEP_GPU_FUSED) is set to 0.
bool switchedOff(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string(value) == "0";
}

// How many of the heuristic's algorithms a GEMM of the full batch is timed with at start-up.
constexpr int kCandidates = 8;

// One GEMM shape with its descriptors and algorithm, kept for the run: the heuristic costs tens of
// microseconds, a step calls a dozen GEMMs.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};                     // the one used: the heuristic's first, or the fastest timed
  std::vector<cublasLtMatmulAlgo_t> candidates;    // the heuristic's best first
  bool tuned = false;
  ~Plan() {
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
  }
};

// Column-major GEMM D[m, n] = op(A) op(B) (+ beta D), with an epilogue.
struct Gemm {
  cublasOperation_t opA = CUBLAS_OP_N, opB = CUBLAS_OP_N;
  std::uint64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldd = 0;
  cudaDataType_t abType = CUDA_R_32F, dType = CUDA_R_32F;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  std::int64_t auxLd = 0;
  bool accumulate = false;

  auto key() const {
    return std::tuple(static_cast<int>(opA), static_cast<int>(opB), m, n, k, lda, ldb, ldd, static_cast<int>(abType),
                      static_cast<int>(dType), static_cast<int>(epilogue), auxLd, accumulate);
  }
};

template <class T>
class Impl final : public GpuModel {
 public:
  Impl(const ParamLayout& layout, const JobSpec& spec, std::size_t stateBegin, std::size_t stateEnd, LayerSource* source)
      : layout_(layout), spec_(spec), stateBegin_(stateBegin), stateFloats_(stateEnd - stateBegin), source_(source) {
    if (source_) {
      partBegin_ = source_->partBegin();
      partFloats_ = source_->partEnd() - partBegin_;
      shardsParameters_ = source_->shardsParameters();
    }
  }

  ~Impl() override {
    if (compute_) cudaStreamSynchronize(compute_);
    if (data_) cudaStreamSynchronize(data_);
    for (auto& slot : h2dDone_)
      for (auto e : slot) cudaEventDestroy(e);
    for (auto& slot : batchReady_)
      for (auto e : slot) cudaEventDestroy(e);
    for (auto e : layerEvents_) cudaEventDestroy(e);
    if (tuneStart_) cudaEventDestroy(tuneStart_);
    if (tuneEnd_) cudaEventDestroy(tuneEnd_);
    plans_.clear();
    if (lt_) cublasLtDestroy(lt_);
    if (compute_) cudaStreamDestroy(compute_);
    if (data_) cudaStreamDestroy(data_);
  }

  Result<void> init(const Dataset& data, int device) {
    LOCKSTEP_CUDA(cudaSetDevice(device));
    LOCKSTEP_CUDA(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    LOCKSTEP_CUDA(cudaStreamCreateWithFlags(&data_, cudaStreamNonBlocking));
    LOCKSTEP_CUBLAS(cublasLtCreate(&lt_));
    LOCKSTEP_ASSIGN_OR_RETURN(workspace_, deviceAlloc<char>(kWorkspaceBytes, false));
    computeType_ = spec_.precision == Precision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    activation_ = spec_.activation == Activation::kGelu ? Act::kGelu : Act::kRelu;
    layers_ = layout_.layerCount();
    dim_ = data.dim;
    maxBatch_ = spec_.batchPerRank;
    accum_ = spec_.accumSteps;

    // The data set, once, in the math type.
    {
      LOCKSTEP_ASSIGN_OR_RETURN(auto staging, deviceAlloc<float>(data.features.size(), false));
      // On the compute stream (non-blocking streams do not wait for the legacy one), then waited for.
      LOCKSTEP_CUDA(cudaMemcpyAsync(staging.get(), data.features.data(), data.features.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, compute_));
      LOCKSTEP_ASSIGN_OR_RETURN(features_, deviceAlloc<T>(data.features.size(), false));
      launchConvert<T>(staging.get(), features_.get(), data.features.size(), compute_);
      LOCKSTEP_ASSIGN_OR_RETURN(labels_, deviceAlloc<std::int32_t>(data.labels.size(), false));
      LOCKSTEP_CUDA(cudaMemcpyAsync(labels_.get(), data.labels.data(), data.labels.size() * sizeof(std::int32_t),
                                    cudaMemcpyHostToDevice, compute_));
      LOCKSTEP_CUDA(cudaStreamSynchronize(compute_));
    }

    LOCKSTEP_ASSIGN_OR_RETURN(params_, deviceAlloc<float>(masterFloats()));
    LOCKSTEP_ASSIGN_OR_RETURN(grads_, deviceAlloc<float>(gradFloats()));
    if constexpr (!std::is_same_v<T, float>) {
      // The GEMMs' copy of the weights: whole, or at stage 3 the layer gathered last.
      LOCKSTEP_ASSIGN_OR_RETURN(lowStorage_, deviceAlloc<T>(lowFloats()));
    }
    if (stateFloats_ > 0 && spec_.optimizer.kind == OptimizerKind::kAdamW) {
      LOCKSTEP_ASSIGN_OR_RETURN(state1_, deviceAlloc<float>(stateFloats_));
      LOCKSTEP_ASSIGN_OR_RETURN(state2_, deviceAlloc<float>(stateFloats_));
    } else if (stateFloats_ > 0 && spec_.optimizer.momentum > 0) {
      LOCKSTEP_ASSIGN_OR_RETURN(state1_, deviceAlloc<float>(stateFloats_));
    }

    std::uint32_t widest = 0;
    for (auto w : layout_.layers()) widest = std::max(widest, w);
    for (std::size_t i = 0; i + 1 < layers_; ++i) {
      const std::size_t n = std::size_t{maxBatch_} * layout_.layers()[i + 1];
      LOCKSTEP_ASSIGN_OR_RETURN(auto act, deviceAlloc<T>(n, false));
      act_.push_back(std::move(act));
      if (activation_ == Act::kGelu) {
        LOCKSTEP_ASSIGN_OR_RETURN(auto pre, deviceAlloc<T>(n, false));
        pre_.push_back(std::move(pre));
      }
    }
    LOCKSTEP_ASSIGN_OR_RETURN(logits_, deviceAlloc<float>(std::size_t{maxBatch_} * layout_.layers().back(), false));
    LOCKSTEP_ASSIGN_OR_RETURN(dOut_, deviceAlloc<T>(std::size_t{maxBatch_} * widest, false));
    LOCKSTEP_ASSIGN_OR_RETURN(dIn_, deviceAlloc<T>(std::size_t{maxBatch_} * widest, false));
    LOCKSTEP_ASSIGN_OR_RETURN(biasGrad_, deviceAlloc<T>(widest, false));

    for (int slot = 0; slot < 2; ++slot) {
      for (std::uint32_t m = 0; m < accum_; ++m) {
        // Zeros: warmUp() computes on them before the first batch arrives.
        LOCKSTEP_ASSIGN_OR_RETURN(auto x, deviceAlloc<T>(std::size_t{maxBatch_} * dim_));
        LOCKSTEP_ASSIGN_OR_RETURN(auto y, deviceAlloc<std::int32_t>(maxBatch_));
        LOCKSTEP_ASSIGN_OR_RETURN(auto idx, deviceAlloc<std::uint32_t>(maxBatch_, false));
        LOCKSTEP_ASSIGN_OR_RETURN(auto host, pinnedAlloc<std::uint32_t>(maxBatch_));
        batchX_[slot].push_back(std::move(x));
        batchY_[slot].push_back(std::move(y));
        indices_[slot].push_back(std::move(idx));
        hostIndices_[slot].push_back(std::move(host));
        cudaEvent_t copied = nullptr, ready = nullptr;
        LOCKSTEP_CUDA(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
        LOCKSTEP_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
        LOCKSTEP_CUDA(cudaEventRecord(copied, data_));
        h2dDone_[slot].push_back(copied);
        batchReady_[slot].push_back(ready);
      }
    }
    for (std::size_t i = 0; i < layers_; ++i) {
      cudaEvent_t e = nullptr;
      LOCKSTEP_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      layerEvents_.push_back(e);
    }
    // The zeroing above ran on the legacy stream, which the non-blocking streams do not wait for.
    LOCKSTEP_CUDA(cudaDeviceSynchronize());
    chooseEpilogues();
    return warmUp();
  }

  Result<void> upload(const float* params, const std::vector<std::vector<float>*>& optimizerState) override {
    LOCKSTEP_CUDA(cudaMemcpyAsync(params_.get(), params + masterBase(), masterFloats() * sizeof(float),
                                  cudaMemcpyHostToDevice, compute_));
    float* states[] = {state1_.get(), state2_.get()};
    for (std::size_t i = 0; i < optimizerState.size() && i < 2; ++i) {
      if (states[i]) {
        LOCKSTEP_TRY(sameStateSize(*optimizerState[i]));
        LOCKSTEP_CUDA(cudaMemcpyAsync(states[i], optimizerState[i]->data(), stateFloats_ * sizeof(float),
                                      cudaMemcpyHostToDevice, compute_));
      }
    }
    if (!shardsParameters_) refreshLowCopy(0, layout_.totalFloats(), compute_);
    LOCKSTEP_CUDA(cudaStreamSynchronize(compute_));
    return {};
  }

  Result<void> download(float* params, const std::vector<std::vector<float>*>& optimizerState) override {
    LOCKSTEP_CUDA(cudaDeviceSynchronize());
    LOCKSTEP_CUDA(cudaMemcpy(params + masterBase(), params_.get(), masterFloats() * sizeof(float), cudaMemcpyDeviceToHost));
    const float* states[] = {state1_.get(), state2_.get()};
    for (std::size_t i = 0; i < optimizerState.size() && i < 2; ++i) {
      if (!states[i]) continue;
      LOCKSTEP_TRY(sameStateSize(*optimizerState[i]));
      LOCKSTEP_CUDA(cudaMemcpy(optimizerState[i]->data(), states[i], stateFloats_ * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return {};
  }

  Result<void> downloadGradients(float* host) override {
    LOCKSTEP_CUDA(cudaMemcpyAsync(host, grads_.get(), gradFloats() * sizeof(float), cudaMemcpyDeviceToHost, compute_));
    LOCKSTEP_CUDA(cudaStreamSynchronize(compute_));
    return {};
  }

  Result<void> prepareBatch(int slot, std::uint32_t micro, const std::vector<std::uint32_t>& indices,
                            cudaEvent_t slotFree) override {
    const auto rows = static_cast<std::uint32_t>(indices.size());
    if (rows > maxBatch_) return invalidArgument("a micro-batch of " + std::to_string(rows) + " rows exceeds the " +
                                                 std::to_string(maxBatch_) + " the GPU buffers hold");
    // The pinned buffer's previous copy finished long ago (two steps back); this wait is a formality.
    LOCKSTEP_CUDA(cudaEventSynchronize(h2dDone_[slot][micro]));
    std::copy(indices.begin(), indices.end(), hostIndices_[slot][micro].get());
    if (slotFree) LOCKSTEP_CUDA(cudaStreamWaitEvent(data_, slotFree));
    LOCKSTEP_CUDA(cudaMemcpyAsync(indices_[slot][micro].get(), hostIndices_[slot][micro].get(),
                                  rows * sizeof(std::uint32_t), cudaMemcpyHostToDevice, data_));
    LOCKSTEP_CUDA(cudaEventRecord(h2dDone_[slot][micro], data_));
    launchGather<T>(features_.get(), labels_.get(), indices_[slot][micro].get(), rows, dim_, batchX_[slot][micro].get(),
                    batchY_[slot][micro].get(), data_);
    LOCKSTEP_CUDA(cudaGetLastError());
    LOCKSTEP_CUDA(cudaEventRecord(batchReady_[slot][micro], data_));
    return {};
  }

  void beginStep(float samples, float stopVote) override { launchSetHeader(grads_.get(), samples, stopVote, compute_); }

  Result<void> forwardBackward(int slot, std::uint32_t micro, std::uint32_t rows, bool last,
                               const std::function<void(std::size_t, cudaEvent_t)>& layerDone) override {
    if (rows > maxBatch_) return invalidArgument("a micro-batch of " + std::to_string(rows) + " rows exceeds the " +
                                                   std::to_string(maxBatch_) + " the GPU buffers hold");
    LOCKSTEP_CUDA(cudaStreamWaitEvent(compute_, batchReady_[slot][micro]));
    if (rows == 0) return emptySlice(micro, last, layerDone);
    // Sharded, each micro-step's gradients are staged and reduced on their own: nothing to add to.
    const bool accumulate = micro > 0 && !source_;
    const T* x = batchX_[slot][micro].get();
    const auto& widths = layout_.layers();

    // Forward.
    for (std::size_t i = 0; i < layers_; ++i) {
      LOCKSTEP_TRY(fetch(i, i + 1 < layers_ ? std::optional<std::size_t>(i + 1) : std::nullopt));
      const T* in = i == 0 ? x : act_[i - 1].get();
      const std::uint32_t outW = widths[i + 1];
      Gemm g = forwardGemm(i, rows);
      if (i + 1 == layers_) {
        g.dType = CUDA_R_32F;
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;
        LOCKSTEP_TRY(matmul(g, weights(i), in, logits_.get(), layerMaster_ + inLayer(layout_.bias(i).offset, i), nullptr));
      } else if (activation_ == Act::kRelu) {
        g.epilogue = CUBLASLT_EPILOGUE_RELU_BIAS;
        LOCKSTEP_TRY(matmul(g, weights(i), in, act_[i].get(), lowBias(i), nullptr));
      } else if (Gemm f = fusedForward(g); fusedForward_ && plan(f)) {
        LOCKSTEP_TRY(matmul(f, weights(i), in, act_[i].get(), lowBias(i), pre_[i].get()));
      } else {
        // Also where cuBLASLt has no fused algorithm for this row count (an epoch's short tail).
        g.epilogue = CUBLASLT_EPILOGUE_BIAS;
        LOCKSTEP_TRY(matmul(g, weights(i), in, pre_[i].get(), lowBias(i), nullptr));
        launchActivation<T>(pre_[i].get(), act_[i].get(), std::size_t{rows} * outW, activation_, compute_);
      }
    }
    launchSoftmaxCrossEntropy<T>(logits_.get(), batchY_[slot][micro].get(), rows, widths.back(), dOut_.get(),
                                 grads_.get() + kLossSum, compute_);

    // Backward: dOut_ holds the gradient w.r.t. layer i's output before its activation.
    T* dOut = dOut_.get();
    T* dIn = dIn_.get();
    bool biasSummed = false;  // layer i's bias gradient came with layer i+1's input-gradient GEMM, in biasGrad_
    for (std::size_t i = layers_; i-- > 0;) {
      const T* in = i == 0 ? x : act_[i - 1].get();
      const std::uint32_t inW = widths[i], outW = widths[i + 1];
      LOCKSTEP_ASSIGN_OR_RETURN(float* grad, layerGradients(i));
      float* gradW = grad + inLayer(layout_.weight(i).offset, i);
      float* gradB = grad + inLayer(layout_.bias(i).offset, i);
      if (biasSummed) {
        launchAddInto<T>(biasGrad_.get(), gradB, outW, accumulate, compute_);
      } else {
        launchColumnSums<T>(dOut, rows, outW, gradB, accumulate, compute_);
      }
      biasSummed = false;
      // Asked for before the weight gradient, so that the layer after it is gathered meanwhile.
      if (i > 0) LOCKSTEP_TRY(fetch(i, backwardNext(i)));

      Gemm w = weightGradGemm(i, rows, accumulate);
      LOCKSTEP_TRY(matmul(w, in, dOut, gradW, nullptr, nullptr));

      if (i > 0) {
        Gemm d = inputGradGemm(i, rows);
        if (Gemm f = fusedBackward(d); fusedBackward_ && plan(f)) {
          // Also multiplies by GELU'(pre of layer i-1) and sums layer i-1's bias gradient.
          LOCKSTEP_TRY(matmul(f, weights(i), dOut, dIn, biasGrad_.get(), pre_[i - 1].get()));
          biasSummed = true;
        } else {
          LOCKSTEP_TRY(matmul(d, weights(i), dOut, dIn, nullptr, nullptr));
          const T* gate = activation_ == Act::kRelu ? act_[i - 1].get() : pre_[i - 1].get();
          launchActivationBackward<T>(dIn, gate, std::size_t{rows} * inW, activation_, compute_);
        }
      }
      if (last || source_) LOCKSTEP_TRY(layerFinished(i, layerDone));
      std::swap(dOut, dIn);
    }
    LOCKSTEP_CUDA(cudaGetLastError());
    return {};
  }

  // An empty slice (the end of an epoch with more ranks than samples left): nothing to add, but the
  // first micro-step's gradients must be zeros, not the last step's. Sharded, the layers are asked
  // for in forwardBackward's order, so that every rank's collectives match.
  Result<void> emptySlice(std::uint32_t micro, bool last, const std::function<void(std::size_t, cudaEvent_t)>& layerDone) {
    if (!source_) {
      if (micro == 0) {
        const std::size_t from = ParamLayout::kHeaderFloats;
        LOCKSTEP_CUDA(cudaMemsetAsync(grads_.get() + from, 0, (layout_.totalFloats() - from) * sizeof(float), compute_));
      }
      if (last) {
        for (std::size_t i = layers_; i-- > 0;) LOCKSTEP_TRY(layerFinished(i, layerDone));
      }
      return {};
    }
    for (std::size_t i = 0; i < layers_; ++i) {
      LOCKSTEP_TRY(fetch(i, i + 1 < layers_ ? std::optional<std::size_t>(i + 1) : std::nullopt));
    }
    for (std::size_t i = layers_; i-- > 0;) {
      LOCKSTEP_ASSIGN_OR_RETURN(float* grad, layerGradients(i));
      LOCKSTEP_CUDA(cudaMemsetAsync(grad, 0, layout_.layerFloats(i) * sizeof(float), compute_));
      if (i > 0) LOCKSTEP_TRY(fetch(i, backwardNext(i)));
      LOCKSTEP_TRY(layerFinished(i, layerDone));
    }
    return {};
  }

  void applyOptimizer(std::size_t begin, std::size_t end, const Optimizer& optimizer, cudaStream_t stream) override {
    begin = std::max(begin, ParamLayout::kHeaderFloats);
    if (begin >= end) return;
    const std::size_t n = end - begin;
    T* lowCopy = nullptr;  // stage 3 has none: a layer is converted when it is gathered
    if constexpr (!std::is_same_v<T, float>) lowCopy = shardsParameters_ ? nullptr : lowStorage_.get() + begin;
    const float* count = grads_.get() + kSampleCount;  // the kernels take the gradient scale from it
    // The caller keeps to the state's range (the rank's part when sharded).
    const std::size_t at = begin - stateBegin_;
    if (spec_.optimizer.kind == OptimizerKind::kSgd) {
      launchSgd<T>(master(begin), gradient(begin), state1_ ? state1_.get() + at : nullptr, lowCopy, n,
                   count, optimizer.sgdParams(1.0f), stream);
      return;
    }
    launchAdamW<T>(master(begin), gradient(begin), state1_.get() + at, state2_.get() + at, lowCopy, n,
                   count, optimizer.adamwParams(1.0f), stream);
  }

  float* grads() override { return grads_.get(); }
  float* params() override { return params_.get(); }
  void refreshLowCopy(std::size_t begin, std::size_t end, cudaStream_t stream) override {
    if constexpr (!std::is_same_v<T, float>) {
      if (begin < end && !shardsParameters_) launchConvert<T>(params_.get() + begin, lowStorage_.get() + begin, end - begin, stream);
    }
  }
  std::uint64_t paramBytes() const override {
    return masterFloats() * sizeof(float) + (lowStorage_ ? lowFloats() * sizeof(T) : 0);
  }
  cudaStream_t computeStream() override { return compute_; }
  cudaStream_t dataStream() override { return data_; }
  cudaEvent_t batchReady(int slot, std::uint32_t micro) override { return batchReady_[slot][micro]; }
  std::string epilogues() const override {
    return fusedBackward_ ? "bias + GELU forward, dGELU + bias gradient backward"
           : fusedForward_ ? "bias + GELU forward"
                           : "bias";
  }
  int tunedGemms() const override {
    return static_cast<int>(std::count_if(plans_.begin(), plans_.end(), [](const auto& entry) {
      return entry.second && entry.second->tuned && entry.second->candidates.size() > 1;
    }));
  }

 private:
  Result<void> sameStateSize(const std::vector<float>& host) const {
    if (host.size() == stateFloats_) return {};
    return Error{ErrorCode::kInternal, "optimizer state of " + std::to_string(host.size()) + " floats for a range of " +
                                           std::to_string(stateFloats_)};
  }

  T* low() {
    if constexpr (std::is_same_v<T, float>) {
      return params_.get();
    } else {
      return lowStorage_.get();
    }
  }
  // The master weights' and the gradients' buffers: whole, or this rank's part (LayerSource).
  std::size_t masterBase() const { return shardsParameters_ ? partBegin_ : 0; }
  std::size_t masterFloats() const { return shardsParameters_ ? partFloats_ : layout_.totalFloats(); }
  std::size_t gradFloats() const { return source_ ? ParamLayout::kHeaderFloats : layout_.totalFloats(); }
  float* master(std::size_t at) { return params_.get() + (at - masterBase()); }
  float* gradient(std::size_t at) { return source_ ? source_->partGradients() + (at - partBegin_) : grads_.get() + at; }
  // bf16's copy of the weights the GEMMs read: whole, or at stage 3 the layer gathered last.
  std::size_t lowFloats() const { return shardsParameters_ ? layout_.widestLayerFloats() : layout_.totalFloats(); }
  // A flat-buffer offset within layer i, from the layer's beginning.
  std::size_t inLayer(std::size_t offset, std::size_t layer) const { return offset - layout_.layerBegin(layer); }

  // Points layerMaster_ and layerLow_ at layer i's parameters: the model's own buffers, or at
  // stage 3 the layer the source gathered (converted for the GEMMs in bf16), with `next` asked for.
  Result<void> fetch(std::size_t i, std::optional<std::size_t> next) {
    const std::size_t begin = layout_.layerBegin(i);
    if (!shardsParameters_) {
      layerMaster_ = params_.get() + begin;
      layerLow_ = low() + begin;
      return {};
    }
    LOCKSTEP_ASSIGN_OR_RETURN(layerMaster_, source_->parameters(i, next));
    if constexpr (std::is_same_v<T, float>) {
      layerLow_ = layerMaster_;
    } else {
      launchConvert<T>(layerMaster_, lowStorage_.get(), layout_.layerFloats(i), compute_);
      layerLow_ = lowStorage_.get();
    }
    return {};
  }
  // Backward asks for layer i's weights (its input gradient) and, meanwhile, layer i-1's unless that
  // is the first layer, whose input gradient is not computed.
  static std::optional<std::size_t> backwardNext(std::size_t i) {
    return i > 1 ? std::optional<std::size_t>(i - 1) : std::nullopt;
  }
  const T* weights(std::size_t layer) const { return layerLow_ + inLayer(layout_.weight(layer).offset, layer); }
  const T* lowBias(std::size_t layer) const { return layerLow_ + inLayer(layout_.bias(layer).offset, layer); }
  Result<float*> layerGradients(std::size_t layer) {
    if (source_) return source_->gradients(layer);
    return grads_.get() + layout_.layerBegin(layer);
  }

  Result<void> layerFinished(std::size_t layer, const std::function<void(std::size_t, cudaEvent_t)>& layerDone) {
    const TensorSlot& w = layout_.weight(layer);
    LOCKSTEP_CUDA(cudaEventRecord(layerEvents_[layer], compute_));
    if (layerDone) layerDone(w.offset + w.paddedCount, layerEvents_[layer]);  // none in warmUp()
    return {};
  }

  // The GEMMs of layer i for `rows` rows (row-major activations, PyTorch's [out, in] weights, seen
  // column-major by cuBLASLt). Epilogues are set by the caller.
  //   forward:         y^T[out, rows] = W[out, in] x^T[in, rows]              (W read transposed)
  //   weight gradient: dW^T[in, out]  = x^T[in, rows] dOut[rows, out]         (fp32, into the grads)
  //   input gradient:  dIn^T[in, rows] = W^T[in, out] dOut^T[out, rows]
  Gemm forwardGemm(std::size_t i, std::uint32_t rows) const {
    const auto& w = layout_.layers();
    Gemm g;
    g.opA = CUBLAS_OP_T;
    g.m = w[i + 1];
    g.n = rows;
    g.k = w[i];
    g.lda = g.ldb = w[i];
    g.ldd = w[i + 1];
    g.abType = g.dType = dataType<T>();
    return g;
  }
  Gemm weightGradGemm(std::size_t i, std::uint32_t rows, bool accumulate) const {
    const auto& w = layout_.layers();
    Gemm g;
    g.opB = CUBLAS_OP_T;
    g.m = w[i];
    g.n = w[i + 1];
    g.k = rows;
    g.lda = w[i];
    g.ldb = w[i + 1];
    g.ldd = w[i];
    g.abType = dataType<T>();
    g.dType = CUDA_R_32F;
    g.accumulate = accumulate;
    return g;
  }
  Gemm inputGradGemm(std::size_t i, std::uint32_t rows) const {
    const auto& w = layout_.layers();
    Gemm g;
    g.m = w[i];
    g.n = rows;
    g.k = w[i + 1];
    g.lda = w[i];
    g.ldb = w[i + 1];
    g.ldd = w[i];
    g.abType = g.dType = dataType<T>();
    return g;
  }

  Gemm fusedForward(Gemm g) const {
    g.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    g.auxLd = static_cast<std::int64_t>(g.m);
    return g;
  }
  Gemm fusedBackward(Gemm g) const {
    g.epilogue = CUBLASLT_EPILOGUE_DGELU_BGRAD;
    g.auxLd = static_cast<std::int64_t>(g.m);
    return g;
  }

  // bf16 GELU layers use the fused epilogues when cuBLASLt offers an algorithm for every such GEMM
  // at the full batch (hidden widths must suit its auxiliary-buffer alignment); forward and
  // backward are decided apart, the backward only where the forward is fused (it reads the forward's
  // auxiliary output). cuBLASLt's GELU is the tanh approximation, which differs from the exact
  // (erf) GELU by less than bf16 resolves; fp32 and tf32 keep the exact one, as the CPU backend and
  // PyTorch compute it. LOCKSTEP_GPU_FUSED=0 turns fusion off (to measure what it gains).
  void chooseEpilogues() {
    fusedForward_ = fusedBackward_ = false;
    if (activation_ != Act::kGelu || layers_ < 2 || std::is_same_v<T, float>) return;
    if (switchedOff("LOCKSTEP_GPU_FUSED")) return;
    const auto& widths = layout_.layers();
    bool forward = true, backward = true;
    for (std::size_t i = 0; i + 1 < layers_; ++i) {
      forward = forward && widths[i + 1] % 8 == 0 && plan(fusedForward(forwardGemm(i, maxBatch_)));
      // Layer i+1's input gradient is the gradient of layer i's output.
      backward = backward && plan(fusedBackward(inputGradGemm(i + 1, maxBatch_)));
    }
    fusedForward_ = forward;
    fusedBackward_ = forward && backward;
  }

  // The plan for a GEMM shape, made on first use; nullptr when cuBLASLt has no algorithm for it.
  Plan* plan(const Gemm& g) {
    auto key = g.key();
    if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
    auto p = std::make_unique<Plan>();
    bool ok = cublasLtMatmulDescCreate(&p->desc, computeType_, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    const auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value) {
      ok = ok && cublasLtMatmulDescSetAttribute(p->desc, attr, &value, sizeof value) == CUBLAS_STATUS_SUCCESS;
    };
    set(CUBLASLT_MATMUL_DESC_TRANSA, g.opA);
    set(CUBLASLT_MATMUL_DESC_TRANSB, g.opB);
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, g.epilogue);
    if (g.auxLd) set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.auxLd);
    const bool aT = g.opA != CUBLAS_OP_N, bT = g.opB != CUBLAS_OP_N;
    ok = ok && cublasLtMatrixLayoutCreate(&p->a, g.abType, aT ? g.k : g.m, aT ? g.m : g.k, g.lda) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&p->b, g.abType, bT ? g.n : g.k, bT ? g.k : g.n, g.ldb) == CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatrixLayoutCreate(&p->d, g.dType, g.m, g.n, g.ldd) == CUBLAS_STATUS_SUCCESS;
    if (ok) {
      cublasLtMatmulPreference_t pref = nullptr;
      ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
      const std::size_t workspace = kWorkspaceBytes;
      ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof workspace) == CUBLAS_STATUS_SUCCESS;
      // The heuristic's default: every operand 256-byte aligned, which ours are (cudaMalloc'd
      // buffers, and tensor slices of the flat buffers, 512-byte aligned in fp32, 256 in bf16), so
      // no algorithm is ruled out.
      static_assert(ParamLayout::kAlignFloats * sizeof(__nv_bfloat16) % 256 == 0);
      cublasLtMatmulHeuristicResult_t results[kCandidates]{};
      int found = 0;
      ok = ok && cublasLtMatmulAlgoGetHeuristic(lt_, p->desc, p->a, p->b, p->d, p->d, pref, kCandidates, results,
                                                &found) == CUBLAS_STATUS_SUCCESS;
      if (pref) cublasLtMatmulPreferenceDestroy(pref);
      for (int i = 0; ok && i < found; ++i) {
        if (results[i].state == CUBLAS_STATUS_SUCCESS) p->candidates.push_back(results[i].algo);
      }
      ok = ok && !p->candidates.empty();
      if (ok) p->algo = p->candidates.front();
    }
    Plan* out = ok ? p.get() : nullptr;
    plans_[key] = ok ? std::move(p) : nullptr;
    return out;
  }

  Result<void> matmul(const Gemm& g, const void* a, const void* b, void* d, const void* bias, void* aux) {
    Plan* p = plan(g);
    if (!p) {
      return Error{ErrorCode::kInternal, "cuBLASLt has no algorithm for a " + std::to_string(g.m) + "x" +
                                             std::to_string(g.n) + "x" + std::to_string(g.k) + " GEMM on this GPU"};
    }
    if (bias) LOCKSTEP_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (aux) LOCKSTEP_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
    if (tuning_ && !p->tuned) LOCKSTEP_TRY(tune(*p, a, b, d, beta));
    LOCKSTEP_CUBLAS(cublasLtMatmul(lt_, p->desc, &alpha, a, p->a, b, p->b, &beta, d, p->d, d, p->d, &p->algo,
                                   workspace_.get(), kWorkspaceBytes, compute_));
    return {};
  }

  // Times each candidate algorithm on these operands (a warm-up run, then three) and keeps the
  // fastest: the heuristic's first choice is not always the fastest for a shape (PyTorch uses the
  // first). Only during warmUp(), since the runs overwrite D.
  Result<void> tune(Plan& p, const void* a, const void* b, void* d, float beta) {
    p.tuned = true;
    if (p.candidates.size() < 2) return {};
    const float alpha = 1.0f;
    float best = INFINITY;
    for (const cublasLtMatmulAlgo_t& algo : p.candidates) {
      bool ok = true;
      for (int run = 0; run < 4 && ok; ++run) {
        if (run == 1) LOCKSTEP_CUDA(cudaEventRecord(tuneStart_, compute_));
        ok = cublasLtMatmul(lt_, p.desc, &alpha, a, p.a, b, p.b, &beta, d, p.d, d, p.d, &algo, workspace_.get(),
                            kWorkspaceBytes, compute_) == CUBLAS_STATUS_SUCCESS;
      }
      LOCKSTEP_CUDA(cudaEventRecord(tuneEnd_, compute_));
      LOCKSTEP_CUDA(cudaEventSynchronize(tuneEnd_));
      float ms = 0;
      if (ok && cudaEventElapsedTime(&ms, tuneStart_, tuneEnd_) == cudaSuccess && ms < best) {
        best = ms;
        p.algo = algo;
      }
      (void)cudaGetLastError();  // a candidate that failed to launch leaves nothing behind
    }
    return {};
  }

  // Runs the GEMMs of a full-batch step once, on buffers that hold nothing yet (zeros), so that
  // tune() picks each shape's algorithm before training starts. Shapes met later (an epoch's short
  // last batch) keep the heuristic's choice: timing them would overwrite live gradients.
  Result<void> warmUp() {
    if (switchedOff("LOCKSTEP_GEMM_TUNING")) return {};
    LOCKSTEP_CUDA(cudaEventCreate(&tuneStart_));
    LOCKSTEP_CUDA(cudaEventCreate(&tuneEnd_));
    tuning_ = true;
    Result<void> done;
    for (std::uint32_t micro = 0; micro < std::min(accum_, 2u) && done; ++micro) {
      done = forwardBackward(0, micro, maxBatch_, false, {});
    }
    tuning_ = false;
    LOCKSTEP_TRY(done);
    LOCKSTEP_CUDA(cudaMemsetAsync(grads_.get(), 0, gradFloats() * sizeof(float), compute_));
    LOCKSTEP_CUDA(cudaStreamSynchronize(compute_));
    return {};
  }

  const ParamLayout& layout_;
  JobSpec spec_;
  cublasComputeType_t computeType_ = CUBLAS_COMPUTE_32F;
  Act activation_ = Act::kRelu;
  std::size_t layers_ = 0;
  std::uint32_t dim_ = 0, maxBatch_ = 0, accum_ = 1;
  bool fusedForward_ = false, fusedBackward_ = false;
  bool tuning_ = false;  // during warmUp()
  cudaEvent_t tuneStart_ = nullptr, tuneEnd_ = nullptr;
  cudaStream_t compute_ = nullptr, data_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DevicePtr<char> workspace_;
  DevicePtr<T> features_;
  DevicePtr<std::int32_t> labels_;
  DevicePtr<float> params_, grads_, state1_, state2_;  // the states: params[stateBegin_, + stateFloats_)
  std::size_t stateBegin_ = 0, stateFloats_ = 0;
  LayerSource* source_ = nullptr;  // sharded (--shard gradients|parameters): where the layers are
  std::size_t partBegin_ = 0, partFloats_ = 0;
  bool shardsParameters_ = false;
  const float* layerMaster_ = nullptr;  // fetch(): the layer's fp32 parameters, from its beginning
  const T* layerLow_ = nullptr;         // and the GEMMs' copy of them
  DevicePtr<T> lowStorage_;
  std::vector<DevicePtr<T>> act_, pre_;
  DevicePtr<float> logits_;
  DevicePtr<T> dOut_, dIn_, biasGrad_;
  std::vector<DevicePtr<T>> batchX_[2];
  std::vector<DevicePtr<std::int32_t>> batchY_[2];
  std::vector<DevicePtr<std::uint32_t>> indices_[2];
  std::vector<PinnedPtr<std::uint32_t>> hostIndices_[2];
  std::vector<cudaEvent_t> h2dDone_[2], batchReady_[2];
  std::vector<cudaEvent_t> layerEvents_;
  std::map<decltype(Gemm{}.key()), std::unique_ptr<Plan>> plans_;
};

template <class T>
Result<std::unique_ptr<GpuModel>> make(const ParamLayout& layout, const JobSpec& spec, const Dataset& data, int device,
                                       std::size_t stateBegin, std::size_t stateEnd, LayerSource* layers) {
  auto model = std::make_unique<Impl<T>>(layout, spec, stateBegin, stateEnd, layers);
  LOCKSTEP_TRY(model->init(data, device));
  return std::unique_ptr<GpuModel>(std::move(model));
}

}  // namespace

Result<std::unique_ptr<GpuModel>> GpuModel::create(const ParamLayout& layout, const JobSpec& spec, const Dataset& data,
                                                   int device, std::size_t stateBegin, std::size_t stateEnd,
                                                   LayerSource* layers) {
  if (stateEnd < stateBegin || stateEnd > layout.totalFloats()) {
    return Error{ErrorCode::kInternal, "the optimizer's range lies outside the parameters"};
  }
  if (spec.precision == Precision::kBf16) return make<__nv_bfloat16>(layout, spec, data, device, stateBegin, stateEnd, layers);
  return make<float>(layout, spec, data, device, stateBegin, stateEnd, layers);
}

}  // namespace lockstep::trainer::gpu
