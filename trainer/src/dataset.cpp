#include "dataset.h"

#include <cblas.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "lockstep/common/npy.h"
#include "rng.h"

namespace lockstep::trainer {
namespace {

constexpr std::uint32_t kTeacherHidden = 64;

// Refuses a data set that cannot fit in this machine's memory, before trying to allocate it.
Result<void> checkFitsInMemory(std::uint64_t bytes, const std::string& what) {
  const long pages = ::sysconf(_SC_PHYS_PAGES), pageSize = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || pageSize <= 0) return {};
  const auto total = static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(pageSize);
  if (bytes > total) {
    return Error{ErrorCode::kResourceExhausted,
                 what + " needs " + std::to_string(bytes >> 20) + " MiB of memory but this machine has " +
                     std::to_string(total >> 20) + " MiB; use fewer samples or features"};
  }
  return {};
}

Error bad(std::string message) { return invalidArgument(std::move(message)); }

template <class T>
Result<void> convertLabels(const std::string& raw, Dataset& d, const std::string& path) {
  const size_t n = raw.size() / sizeof(T);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
    // Compare in a wide type: T may be unsigned or 64-bit.
    const long double wide = static_cast<long double>(v);
    if (wide < 0 || wide >= static_cast<long double>(d.classes)) {
      return bad("labels " + path + ": label " + std::to_string(v) + " at index " + std::to_string(i) +
                 " is outside [0, " + std::to_string(d.classes) + "); the last layer size is the class count");
    }
    d.labels[i] = static_cast<std::int32_t>(v);
  }
  return {};
}

}  // namespace

Result<Dataset> loadNpyDataset(const NpyDataset& spec, std::uint32_t expectedDim, std::uint32_t classes) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto features, openNpyFeatures(spec.featuresPath, expectedDim));
  LOCKSTEP_ASSIGN_OR_RETURN(auto labels, openNpyLabels(spec.labelsPath, features.header.shape[0]));
  Dataset d;
  d.samples = features.header.shape[0];
  d.dim = expectedDim;
  d.classes = classes;
  LOCKSTEP_TRY(checkFitsInMemory(d.samples * (std::uint64_t{d.dim} + 1) * 4, "the data set " + spec.featuresPath));
  d.features.resize(d.samples * d.dim);
  LOCKSTEP_TRY(readExactly(features.file.get(), d.features.data(), d.features.size() * sizeof(float),
                           features.header.dataOffset, spec.featuresPath));
  for (std::uint64_t i = 0; i < d.features.size(); ++i) {
    if (!std::isfinite(d.features[i])) {
      return bad("features " + spec.featuresPath + ": sample " + std::to_string(i / d.dim) + " feature " +
                 std::to_string(i % d.dim) + " is not finite (NaN or inf)");
    }
  }
  std::string raw(d.samples * npyItemSize(labels.header.descr), '\0');
  LOCKSTEP_TRY(readExactly(labels.file.get(), raw.data(), raw.size(), labels.header.dataOffset, spec.labelsPath));
  d.labels.resize(d.samples);
  const std::string& t = labels.header.descr;
  Result<void> converted = t == "|i1"   ? convertLabels<std::int8_t>(raw, d, spec.labelsPath)
                           : t == "|u1" ? convertLabels<std::uint8_t>(raw, d, spec.labelsPath)
                           : t == "<i2" ? convertLabels<std::int16_t>(raw, d, spec.labelsPath)
                           : t == "<u2" ? convertLabels<std::uint16_t>(raw, d, spec.labelsPath)
                           : t == "<i4" ? convertLabels<std::int32_t>(raw, d, spec.labelsPath)
                           : t == "<u4" ? convertLabels<std::uint32_t>(raw, d, spec.labelsPath)
                           : t == "<i8" ? convertLabels<std::int64_t>(raw, d, spec.labelsPath)
                                        : convertLabels<std::uint64_t>(raw, d, spec.labelsPath);
  if (!converted) return converted.error();
  return d;
}

Result<Dataset> makeSyntheticDataset(const SyntheticDataset& spec) {
  LOCKSTEP_TRY(checkFitsInMemory(spec.samples * (std::uint64_t{spec.dim} + spec.classes + 1) * 4,
                                 "the synthetic data set (n=" + std::to_string(spec.samples) + ", dim=" +
                                     std::to_string(spec.dim) + ")"));
  Dataset d;
  d.samples = spec.samples;
  d.dim = spec.dim;
  d.classes = spec.classes;
  d.features.resize(d.samples * d.dim);
  d.labels.resize(d.samples);

  const float scale = std::sqrt(3.0f);
  for (std::uint64_t i = 0; i < d.samples; ++i) {
    // One stream per sample: any sample can be regenerated alone, and the set is the same on
    // every rank without communication.
    SplitMix64 rng(mixSeed(spec.seed, i));
    float* row = d.features.data() + i * d.dim;
    for (std::uint32_t j = 0; j < d.dim; ++j) row[j] = scale * rng.uniformSigned();
  }

  // The teacher: W1 [H, dim] ~ U(+-sqrt(3/dim)), tanh, W2 [classes, H] ~ U(+-sqrt(3/H)).
  SplitMix64 teacher(mixSeed(spec.seed, ~0ull));
  std::vector<float> w1(std::size_t{kTeacherHidden} * d.dim), w2(std::size_t{d.classes} * kTeacherHidden);
  const float s1 = std::sqrt(3.0f / static_cast<float>(d.dim));
  const float s2 = std::sqrt(3.0f / kTeacherHidden);
  for (auto& w : w1) w = s1 * teacher.uniformSigned();
  for (auto& w : w2) w = s2 * teacher.uniformSigned();

  std::vector<float> logits(d.samples * d.classes);
  constexpr std::uint64_t kChunk = 4096;
  std::vector<float> hidden(kChunk * kTeacherHidden);
  for (std::uint64_t start = 0; start < d.samples; start += kChunk) {
    const auto rows = static_cast<int>(std::min(kChunk, d.samples - start));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, kTeacherHidden, static_cast<int>(d.dim), 1.0f,
                d.row(start), static_cast<int>(d.dim), w1.data(), static_cast<int>(d.dim), 0.0f, hidden.data(),
                kTeacherHidden);
    for (std::size_t k = 0; k < std::size_t(rows) * kTeacherHidden; ++k) hidden[k] = std::tanh(hidden[k]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, static_cast<int>(d.classes), kTeacherHidden, 1.0f,
                hidden.data(), kTeacherHidden, w2.data(), kTeacherHidden, 0.0f, logits.data() + start * d.classes,
                static_cast<int>(d.classes));
  }
  // Centre each class's logit over the data set so that no class wins by its offset alone.
  std::vector<double> mean(d.classes, 0.0);
  for (std::uint64_t i = 0; i < d.samples; ++i)
    for (std::uint32_t c = 0; c < d.classes; ++c) mean[c] += logits[i * d.classes + c];
  for (auto& m : mean) m /= static_cast<double>(d.samples);
  for (std::uint64_t i = 0; i < d.samples; ++i) {
    const float* z = logits.data() + i * d.classes;
    std::uint32_t best = 0;
    for (std::uint32_t c = 1; c < d.classes; ++c) {
      if (z[c] - mean[c] > z[best] - mean[best]) best = c;
    }
    d.labels[i] = static_cast<std::int32_t>(best);
  }
  return d;
}

Result<Dataset> loadDataset(const JobSpec& spec) {
  if (const auto* syn = std::get_if<SyntheticDataset>(&spec.dataset)) return makeSyntheticDataset(*syn);
  return loadNpyDataset(std::get<NpyDataset>(spec.dataset), spec.layers.front(), spec.layers.back());
}

}  // namespace lockstep::trainer
