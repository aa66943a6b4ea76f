#include "dataset.h"

#include <cblas.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "lockstep/common/fd.h"
#include "rng.h"

namespace lockstep::trainer {
namespace {

constexpr std::uint32_t kTeacherHidden = 64;
constexpr std::uint64_t kMaxSamples = 1ull << 31;  // sample indices are 32-bit

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

std::string shapeText(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<void> readExactly(int fd, void* out, std::uint64_t bytes, std::uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, std::min<std::uint64_t>(bytes, 1u << 30), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errnoError("cannot read " + path, errno);
    }
    if (n == 0) return bad(path + " ended early: the file is truncated");
    p += n;
    bytes -= static_cast<std::uint64_t>(n);
    offset += static_cast<std::uint64_t>(n);
  }
  return {};
}

struct OpenNpy {
  UniqueFd file;
  NpyHeader header;
  std::uint64_t fileBytes = 0;
};

Result<OpenNpy> openNpy(const std::string& path, const char* role) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errnoError(std::string("cannot open the ") + role + " file " + path, errno)
        .withContext("--dataset npy");
  }
  OpenNpy npy{UniqueFd(fd), {}, 0};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errnoError("cannot stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return bad(path + " is not a regular file");
  npy.fileBytes = static_cast<std::uint64_t>(st.st_size);
  std::string head(static_cast<size_t>(std::min<std::uint64_t>(npy.fileBytes, 65536 + 12)), '\0');
  LOCKSTEP_TRY(readExactly(fd, head.data(), head.size(), 0, path));
  LOCKSTEP_ASSIGN_OR_RETURN(npy.header, parseNpyHeader(head, path));
  if (npy.header.fortranOrder) {
    return bad(path + " is stored in Fortran order; save it with np.save(path, np.ascontiguousarray(a))");
  }
  return npy;
}

size_t itemSize(const std::string& descr) { return static_cast<size_t>(descr.back() - '0'); }

Result<void> checkDataBytes(const OpenNpy& npy, const std::string& path) {
  std::uint64_t elements = 1;
  for (auto d : npy.header.shape) elements *= d;
  const std::uint64_t expected = npy.header.dataOffset + elements * itemSize(npy.header.descr);
  if (npy.fileBytes != expected) {
    return bad(path + " has " + std::to_string(npy.fileBytes) + " bytes but its header " +
               shapeText(npy.header.shape) + " " + npy.header.descr + " needs " + std::to_string(expected) +
               (npy.fileBytes < expected ? ": the file is truncated" : ": there are extra bytes"));
  }
  return {};
}

Result<OpenNpy> openFeatures(const std::string& path, std::uint32_t expectedDim) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto npy, openNpy(path, "features"));
  const auto& h = npy.header;
  if (h.descr != "<f4") {
    return bad("features " + path + " have dtype " + h.descr +
               "; they must be float32 ('<f4'): convert with a.astype(np.float32)");
  }
  if (h.shape.size() != 2) {
    return bad("features " + path + " have shape " + shapeText(h.shape) + "; they must be 2-D [samples, features]");
  }
  if (h.shape[0] == 0) return bad("features " + path + " hold no samples");
  if (h.shape[0] > kMaxSamples) {
    return bad("features " + path + " hold " + std::to_string(h.shape[0]) + " samples; at most 2^31 are supported");
  }
  if (h.shape[1] != expectedDim) {
    return bad("features " + path + " have " + std::to_string(h.shape[1]) + " features per sample but the first layer size is " +
               std::to_string(expectedDim) + "; make the first entry of --layers " + std::to_string(h.shape[1]));
  }
  LOCKSTEP_TRY(checkDataBytes(npy, path));
  return npy;
}

bool isIntegerDescr(const std::string& d) {
  static const char* kAllowed[] = {"|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8"};
  return std::any_of(std::begin(kAllowed), std::end(kAllowed), [&](const char* a) { return d == a; });
}

Result<OpenNpy> openLabels(const std::string& path, std::uint64_t samples) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto npy, openNpy(path, "labels"));
  const auto& h = npy.header;
  if (!isIntegerDescr(h.descr)) {
    return bad("labels " + path + " have dtype " + h.descr + "; they must be integers (e.g. int64 '<i8')");
  }
  if (h.shape.size() != 1) {
    return bad("labels " + path + " have shape " + shapeText(h.shape) + "; they must be 1-D [samples]");
  }
  if (h.shape[0] != samples) {
    return bad("labels " + path + " hold " + std::to_string(h.shape[0]) + " labels but the features hold " +
               std::to_string(samples) + " samples; they must match");
  }
  LOCKSTEP_TRY(checkDataBytes(npy, path));
  return npy;
}

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

Result<NpyHeader> parseNpyHeader(std::string_view head, const std::string& path) {
  static constexpr char kMagic[] = "\x93NUMPY";
  if (head.size() < 10 || head.substr(0, 6) != std::string_view(kMagic, 6)) {
    return bad(path + " is not a NumPy .npy file (no \\x93NUMPY magic)");
  }
  const auto major = static_cast<unsigned char>(head[6]);
  std::uint64_t headerLen = 0;
  std::uint64_t prefix = 0;
  if (major == 1) {
    headerLen = static_cast<unsigned char>(head[8]) | (static_cast<unsigned>(static_cast<unsigned char>(head[9])) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (head.size() < 12) return bad(path + ": truncated .npy header");
    for (int i = 0; i < 4; ++i) headerLen |= std::uint64_t{static_cast<unsigned char>(head[8 + i])} << (8 * i);
    prefix = 12;
  } else {
    return bad(path + ": unsupported .npy format version " + std::to_string(major));
  }
  if (head.size() < prefix + headerLen) return bad(path + ": truncated .npy header");
  const std::string_view dict = head.substr(prefix, headerLen);

  NpyHeader h;
  h.dataOffset = prefix + headerLen;
  auto valueOf = [&](std::string_view key) -> std::string_view {
    const auto k = dict.find(key);
    if (k == std::string_view::npos) return {};
    auto rest = dict.substr(k + key.size());
    const auto colon = rest.find(':');
    if (colon == std::string_view::npos) return {};
    rest.remove_prefix(colon + 1);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    return rest;
  };
  const auto descr = valueOf("'descr'");
  if (descr.size() < 2 || descr.front() != '\'') return bad(path + ": the .npy header has no 'descr'");
  const auto descrEnd = descr.find('\'', 1);
  if (descrEnd == std::string_view::npos) return bad(path + ": malformed 'descr' in the .npy header");
  h.descr = std::string(descr.substr(1, descrEnd - 1));
  if (h.descr.size() < 3 || h.descr.back() < '1' || h.descr.back() > '8') {
    return bad(path + ": unsupported dtype '" + h.descr + "'");
  }
  const auto fortran = valueOf("'fortran_order'");
  if (fortran.rfind("True", 0) == 0) {
    h.fortranOrder = true;
  } else if (fortran.rfind("False", 0) != 0) {
    return bad(path + ": the .npy header has no 'fortran_order'");
  }
  const auto shape = valueOf("'shape'");
  if (shape.empty() || shape.front() != '(') return bad(path + ": the .npy header has no 'shape'");
  const auto close = shape.find(')');
  if (close == std::string_view::npos) return bad(path + ": malformed 'shape' in the .npy header");
  std::string_view dims = shape.substr(1, close - 1);
  while (!dims.empty()) {
    while (!dims.empty() && (dims.front() == ' ' || dims.front() == ',')) dims.remove_prefix(1);
    if (dims.empty()) break;
    std::uint64_t v = 0;
    size_t digits = 0;
    while (digits < dims.size() && dims[digits] >= '0' && dims[digits] <= '9') {
      if (v > (1ull << 40)) return bad(path + ": a dimension in the .npy shape is too large");
      v = v * 10 + static_cast<std::uint64_t>(dims[digits] - '0');
      ++digits;
    }
    if (digits == 0) return bad(path + ": malformed 'shape' in the .npy header");
    h.shape.push_back(v);
    dims.remove_prefix(digits);
  }
  return h;
}

Result<void> checkNpyDataset(const NpyDataset& spec, std::uint32_t expectedDim) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto features, openFeatures(spec.featuresPath, expectedDim));
  LOCKSTEP_ASSIGN_OR_RETURN(auto labels, openLabels(spec.labelsPath, features.header.shape[0]));
  return {};
}

Result<Dataset> loadNpyDataset(const NpyDataset& spec, std::uint32_t expectedDim, std::uint32_t classes) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto features, openFeatures(spec.featuresPath, expectedDim));
  LOCKSTEP_ASSIGN_OR_RETURN(auto labels, openLabels(spec.labelsPath, features.header.shape[0]));
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
  std::string raw(d.samples * itemSize(labels.header.descr), '\0');
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
