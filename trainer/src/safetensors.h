#pragma once
// Reading and writing the safetensors format (https://github.com/huggingface/safetensors):
// u64 little-endian header size, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__":
// {string: string}}, then the raw little-endian tensor bytes. float32 only.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lockstep/common/result.h"

namespace lockstep::trainer {

struct TensorRef {
  std::string name;
  std::vector<std::uint64_t> shape;
  const float* data = nullptr;  // shape's product of floats
};

struct Tensor {
  std::vector<std::uint64_t> shape;
  std::vector<float> data;
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Serializes in memory; write the result with writeFileAtomic.
std::string encodeSafetensors(const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata);

// Refuses malformed headers, offsets outside the file, overlapping or misordered data, non-F32
// tensors, and files larger than maxBytes.
Result<SafetensorsFile> readSafetensors(const std::string& path, std::uint64_t maxBytes = 64ull << 30);
Result<SafetensorsFile> decodeSafetensors(const std::string& bytes, const std::string& path);

}  // namespace lockstep::trainer
