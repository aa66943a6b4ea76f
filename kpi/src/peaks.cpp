#include "lockstep/kpi/peaks.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <vector>

namespace lockstep::kpi {
namespace {

// TFLOP/s, dense, from NVIDIA's datasheets (their tensor-core figures are "with sparsity": half of
// them here). 0: the GPU has no such math. fp32 is the CUDA cores' (what fp32 without TF32 runs on).
struct Row {
  std::array<std::string_view, 2> words;  // every one of them among the name's words; "" matches all
  std::string_view model;
  double fp32, tf32, bf16, fp16, fp8;
};

// The most particular first: an "H100 PCIe" is also an "H100".
constexpr Row kTable[] = {
    {{"H200", "NVL"}, "H200 NVL", 60, 417.5, 835.5, 835.5, 1670.5},
    {{"H200", ""}, "H200 SXM", 67, 494.5, 989.5, 989.5, 1979},
    {{"GH200", ""}, "GH200", 67, 494.5, 989.5, 989.5, 1979},
    {{"H100", "PCIe"}, "H100 PCIe", 51, 378, 756.5, 756.5, 1513},
    {{"H100", "NVL"}, "H100 NVL", 60, 417.5, 835.5, 835.5, 1670.5},
    {{"H100", ""}, "H100 SXM", 67, 494.5, 989.5, 989.5, 1979},
    {{"B200", ""}, "B200", 75, 1100, 2250, 2250, 4500},
    {{"A100", ""}, "A100", 19.5, 156, 312, 312, 0},
    {{"L40S", ""}, "L40S", 91.6, 183, 362, 362, 733},
    {{"L40", ""}, "L40", 90.5, 90.5, 181, 181, 362},
    {{"L4", ""}, "L4", 30.3, 60, 121, 121, 242.5},
    {{"A10", ""}, "A10", 31.2, 62.5, 125, 125, 0},
    {{"V100", "PCIE"}, "V100 PCIe", 14, 0, 0, 112, 0},
    {{"V100", ""}, "V100 SXM2", 15.7, 0, 0, 125, 0},
};

std::string lower(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// "NVIDIA A100-SXM4-80GB" → nvidia, a100, sxm4, 80gb.
std::vector<std::string> wordsOf(std::string_view name) {
  std::vector<std::string> words;
  std::string word;
  for (const char c : name) {
    if (c == ' ' || c == '-' || c == '_') {
      if (!word.empty()) words.push_back(lower(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(lower(word));
  return words;
}

double at(const Row& row, Precision precision) {
  switch (precision) {
    case Precision::kFp32: return row.fp32;
    case Precision::kTf32: return row.tf32;
    case Precision::kBf16: return row.bf16;
    case Precision::kFp16: return row.fp16;
    case Precision::kFp8: return row.fp8;
  }
  return 0;
}

}  // namespace

std::optional<GpuPeak> gpuPeak(std::string_view nvmlName, Precision precision) {
  const auto words = wordsOf(nvmlName);
  const auto has = [&](std::string_view w) {
    return w.empty() || std::find(words.begin(), words.end(), lower(w)) != words.end();
  };
  for (const Row& row : kTable) {
    if (!has(row.words[0]) || !has(row.words[1])) continue;
    const double tflops = at(row, precision);
    if (tflops <= 0) return std::nullopt;
    return GpuPeak{tflops * 1e12, row.model};
  }
  return std::nullopt;
}

}  // namespace lockstep::kpi
