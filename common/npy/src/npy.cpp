#include "lockstep/common/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "lockstep/common/files.h"

namespace lockstep {
namespace {

Error bad(std::string message) { return invalidArgument(std::move(message)); }

std::string shapeText(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Result<NpyFile> openNpy(const std::string& path, const char* role) {
  auto opened = openRegularFile(path, std::string("the ") + role + " file");
  if (!opened) return opened.error().withContext("npy dataset");
  const int fd = *opened;
  NpyFile npy{UniqueFd(fd), {}, 0};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errnoError("cannot stat " + path, errno);
  npy.fileBytes = static_cast<std::uint64_t>(st.st_size);
  std::string head(static_cast<size_t>(std::min<std::uint64_t>(npy.fileBytes, 65536 + 12)), '\0');
  LOCKSTEP_TRY(readExactly(fd, head.data(), head.size(), 0, path));
  LOCKSTEP_ASSIGN_OR_RETURN(npy.header, parseNpyHeader(head, path));
  if (npy.header.fortranOrder) {
    return bad(path + " is stored in Fortran order; save it with np.save(path, np.ascontiguousarray(a))");
  }
  return npy;
}



Result<void> checkDataBytes(const NpyFile& npy, const std::string& path) {
  std::uint64_t elements = 1;
  for (auto d : npy.header.shape) elements *= d;
  const std::uint64_t expected = npy.header.dataOffset + elements * npyItemSize(npy.header.descr);
  if (npy.fileBytes != expected) {
    return bad(path + " has " + std::to_string(npy.fileBytes) + " bytes but its header " +
               shapeText(npy.header.shape) + " " + npy.header.descr + " needs " + std::to_string(expected) +
               (npy.fileBytes < expected ? ": the file is truncated" : ": there are extra bytes"));
  }
  return {};
}

bool isIntegerDescr(const std::string& d) {
  static const char* kAllowed[] = {"|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8"};
  return std::any_of(std::begin(kAllowed), std::end(kAllowed), [&](const char* a) { return d == a; });
}

}  // namespace

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


Result<NpyFile> openNpyFeatures(const std::string& path, std::uint32_t expectedDim) {
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
  if (h.shape[0] > kMaxNpySamples) {
    return bad("features " + path + " hold " + std::to_string(h.shape[0]) + " samples; at most 2^31 are supported");
  }
  if (h.shape[1] != expectedDim) {
    return bad("features " + path + " have " + std::to_string(h.shape[1]) + " features per sample but the first layer size is " +
               std::to_string(expectedDim) + "; make the first entry of --layers " + std::to_string(h.shape[1]));
  }
  LOCKSTEP_TRY(checkDataBytes(npy, path));
  return npy;
}

Result<NpyFile> openNpyLabels(const std::string& path, std::uint64_t samples) {
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

Result<void> checkNpyDataset(const std::string& featuresPath, const std::string& labelsPath,
                             std::uint32_t expectedDim) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto features, openNpyFeatures(featuresPath, expectedDim));
  LOCKSTEP_ASSIGN_OR_RETURN(auto labels, openNpyLabels(labelsPath, features.header.shape[0]));
  return {};
}

}  // namespace lockstep
