#include "model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "rng.h"

namespace lockstep::trainer {
namespace {

std::size_t alignUp(std::size_t n) {
  return (n + ParamLayout::kAlignFloats - 1) / ParamLayout::kAlignFloats * ParamLayout::kAlignFloats;
}

}  // namespace

ParamLayout::ParamLayout(std::vector<std::uint32_t> layers) : layers_(std::move(layers)) {
  const std::size_t count = layerCount();
  tensors_.resize(2 * count);
  std::size_t offset = kHeaderFloats;
  for (std::size_t l = count; l-- > 0;) {
    const std::uint64_t in = layers_[l], out = layers_[l + 1];
    TensorSlot& b = tensors_[2 * l + 1];
    b = {"layers." + std::to_string(l) + ".bias", {out}, offset, out, alignUp(out)};
    offset += b.paddedCount;
    TensorSlot& w = tensors_[2 * l];
    w = {"layers." + std::to_string(l) + ".weight", {out, in}, offset, out * in, alignUp(out * in)};
    offset += w.paddedCount;
  }
  total_ = offset;
}

std::uint64_t ParamLayout::parameterCount() const {
  std::uint64_t n = 0;
  for (const auto& t : tensors_) n += t.count;
  return n;
}

double ParamLayout::flopsPerSample() const {
  double flops = 0;
  for (std::size_t l = 0; l < layerCount(); ++l) {
    const double products = l == 0 ? 2 : 3;
    flops += products * 2.0 * layers_[l] * layers_[l + 1];
  }
  return flops;
}

std::size_t ParamLayout::widestLayerFloats() const {
  std::size_t widest = 0;
  for (std::size_t l = 0; l < layerCount(); ++l) widest = std::max(widest, layerFloats(l));
  return widest;
}

std::vector<Bucket> planBuckets(const ParamLayout& layout, std::size_t bucketBytes, std::size_t firstBucketBytes) {
  // Units that may not be split: the header with the last layer's bias, then per layer its bias and
  // each weight row (the weight's padding rides with its last row).
  std::vector<std::size_t> unitEnds;
  for (std::size_t l = layout.layerCount(); l-- > 0;) {
    const TensorSlot& b = layout.bias(l);
    const TensorSlot& w = layout.weight(l);
    unitEnds.push_back(b.offset + b.paddedCount);
    const std::size_t rowFloats = layout.layers()[l];
    const std::size_t rows = layout.layers()[l + 1];
    for (std::size_t r = 1; r < rows; ++r) unitEnds.push_back(w.offset + r * rowFloats);
    unitEnds.push_back(w.offset + w.paddedCount);
  }
  std::vector<Bucket> buckets;
  std::size_t begin = 0, unitBegin = 0;
  std::size_t cap = std::max<std::size_t>(firstBucketBytes / sizeof(float), 1);
  for (std::size_t end : unitEnds) {
    if (unitBegin > begin && end - begin > cap) {
      buckets.push_back({begin, unitBegin});
      begin = unitBegin;
      cap = std::max<std::size_t>(bucketBytes / sizeof(float), 1);
    }
    unitBegin = end;
  }
  buckets.push_back({begin, layout.totalFloats()});
  return buckets;
}

void initParameters(const ParamLayout& layout, std::uint64_t seed, float* params) {
  std::fill(params, params + layout.totalFloats(), 0.0f);
  for (std::size_t l = 0; l < layout.layerCount(); ++l) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(layout.layers()[l]));
    for (const TensorSlot* t : {&layout.weight(l), &layout.bias(l)}) {
      SplitMix64 rng(mixSeed(seed, 0x1417000000ull + t->offset));
      for (std::size_t i = 0; i < t->count; ++i) params[t->offset + i] = bound * rng.uniformSigned();
    }
  }
}

Mlp::Mlp(const ParamLayout& layout, Activation activation, std::uint32_t maxBatch)
    : layout_(layout), activation_(activation), maxBatch_(maxBatch) {
  const auto& sizes = layout.layers();
  const std::size_t count = layout.layerCount();
  pre_.resize(count);
  act_.resize(count);
  std::size_t widest = 0;
  for (std::size_t l = 0; l < count; ++l) {
    pre_[l].resize(std::size_t{maxBatch} * sizes[l + 1]);
    if (l + 1 < count) act_[l].resize(std::size_t{maxBatch} * sizes[l + 1]);
    widest = std::max<std::size_t>(widest, std::max(sizes[l], sizes[l + 1]));
  }
  dOut_.resize(std::size_t{maxBatch} * widest);
  dIn_.resize(std::size_t{maxBatch} * widest);
}

double Mlp::forward(const float* params, const float* x, const std::int32_t* labels, std::uint32_t batch) {
  const std::function<void(std::size_t)> none = [](std::size_t) {};
  FlatLayers layers(layout_, params, nullptr, none);
  return forward(layers, x, labels, batch);
}

// An empty batch (a rank with no samples this step) still asks for every layer and writes zero
// gradients, in the order a full one does: sharded layers run collectives there, and every rank
// must reach the same ones.
double Mlp::forward(LayerStore& layers, const float* x, const std::int32_t* labels, std::uint32_t batch) {
  batch_ = std::min(batch, maxBatch_);
  input_ = x;
  labels_ = labels;
  const auto& sizes = layout_.layers();
  const std::size_t count = layout_.layerCount();
  const float* in = x;
  double loss = 0.0;
  for (std::size_t l = 0; l < count; ++l) {
    const int inF = static_cast<int>(sizes[l]), outF = static_cast<int>(sizes[l + 1]);
    const float* p = layers.parameters(l);
    if (batch_ == 0) continue;
    const float* w = p + (layout_.weight(l).offset - layout_.layerBegin(l));
    const float* b = p;  // the bias starts the layer's range
    // pre = in [B, in] x W^T [in, out]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(batch_), outF, inF, 1.0f, in, inF, w, inF,
                0.0f, pre_[l].data(), outF);
    if (l + 1 < count) {
      kernels::biasActivation(pre_[l].data(), act_[l].data(), b, batch_, static_cast<std::size_t>(outF), activation_);
      in = act_[l].data();
    } else {
      // The last layer's output becomes the gradient of the logits right away.
      loss = kernels::biasSoftmaxCrossEntropy(pre_[l].data(), b, labels_, dOut_.data(), batch_, sizes.back());
    }
  }
  return loss;
}

void Mlp::backward(const float* params, float* grads, bool accumulate, const std::vector<std::size_t>& cuts,
                   const std::function<void(std::size_t)>& ready) {
  FlatLayers layers(layout_, params, grads, ready);
  backward(layers, accumulate, cuts);
}

void Mlp::backward(LayerStore& layers, bool accumulate, const std::vector<std::size_t>& cuts) {
  const std::size_t count = layout_.layerCount();
  const auto& sizes = layout_.layers();
  const int batch = static_cast<int>(batch_);
  // No samples: the gradient is zero (or, accumulating, unchanged).
  auto zero = [accumulate](float* g, std::size_t n) {
    if (!accumulate) std::fill(g, g + n, 0.0f);
  };
  for (std::size_t l = count; l-- > 0;) {
    const int inF = static_cast<int>(sizes[l]), outF = static_cast<int>(sizes[l + 1]);
    const float* in = l == 0 ? input_ : act_[l - 1].data();
    const TensorSlot& ws = layout_.weight(l);
    const TensorSlot& bs = layout_.bias(l);

    float* gb = layers.gradients(bs.offset, bs.count);
    if (batch == 0) {
      zero(gb, bs.count);
    } else {
      kernels::columnSums(dOut_.data(), batch_, static_cast<std::size_t>(outF), gb, accumulate);
    }
    layers.ready(bs.offset + bs.paddedCount);

    // dW = dOut^T [out, B] x in [B, in], in row blocks that end at bucket cuts.
    int row = 0;
    auto cut = std::upper_bound(cuts.begin(), cuts.end(), ws.offset);
    while (row < outF) {
      int rowEnd = outF;
      if (cut != cuts.end() && *cut < ws.offset + ws.count) {
        rowEnd = static_cast<int>((*cut - ws.offset) / static_cast<std::size_t>(inF));
        ++cut;
      }
      const std::size_t at = ws.offset + std::size_t(row) * inF, n = std::size_t(rowEnd - row) * inF;
      float* gw = layers.gradients(at, n);
      if (batch == 0) {
        zero(gw, n);
      } else {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rowEnd - row, inF, batch, 1.0f, dOut_.data() + row, outF,
                    in, inF, accumulate ? 1.0f : 0.0f, gw, inF);
      }
      row = rowEnd;
      layers.ready(row == outF ? ws.offset + ws.paddedCount : ws.offset + std::size_t(row) * inF);
    }

    if (l == 0) break;
    // dIn = dOut [B, out] x W [out, in], then through the previous layer's activation.
    const float* w = layers.parameters(l) + (ws.offset - layout_.layerBegin(l));
    if (batch == 0) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, inF, outF, 1.0f, dOut_.data(), outF, w, inF, 0.0f,
                dIn_.data(), inF);
    kernels::activationBackward(dIn_.data(), pre_[l - 1].data(), std::size_t(batch) * inF, activation_);
    std::swap(dOut_, dIn_);
  }
}

}  // namespace lockstep::trainer
