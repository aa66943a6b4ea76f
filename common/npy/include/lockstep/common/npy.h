#pragma once
// NumPy .npy files: the header, and opening the features and labels of a data set with checks
// that name what is wrong (dtype, shape, truncation) and how to fix it. The trainer loads data with
// these; the agent checks a job's files with them before starting it.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/common/fd.h"
#include "lockstep/common/result.h"

namespace lockstep {

// At most 2^31 samples: sample indices are 32-bit.
inline constexpr std::uint64_t kMaxNpySamples = 1ull << 31;

struct NpyHeader {
  std::string descr;  // e.g. "<f4"
  bool fortranOrder = false;
  std::vector<std::uint64_t> shape;
  std::uint64_t dataOffset = 0;  // bytes from the start of the file
};

// Parses the header at the start of a .npy file (`head` holds at least its first bytes).
Result<NpyHeader> parseNpyHeader(std::string_view head, const std::string& path);

// Bytes per element of a descr such as "<f4".
inline std::size_t npyItemSize(const std::string& descr) { return static_cast<std::size_t>(descr.back() - '0'); }

struct NpyFile {
  UniqueFd file;
  NpyHeader header;
  std::uint64_t fileBytes = 0;
};

// float32 [N, expectedDim], C order, N in [1, 2^31], the file's size matching its header.
Result<NpyFile> openNpyFeatures(const std::string& path, std::uint32_t expectedDim);
// Any integer dtype, [samples], the file's size matching its header.
Result<NpyFile> openNpyLabels(const std::string& path, std::uint64_t samples);
// Both, without reading the data.
Result<void> checkNpyDataset(const std::string& featuresPath, const std::string& labelsPath, std::uint32_t expectedDim);

// pread() of exactly `bytes` at `offset`; a short file is an InvalidArgument naming the path.
Result<void> readExactly(int fd, void* out, std::uint64_t bytes, std::uint64_t offset, const std::string& path);

}  // namespace lockstep
