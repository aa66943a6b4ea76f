#include "safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "lockstep/common/files.h"

namespace lockstep::trainer {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;

Error bad(const std::string& path, const std::string& message) {
  return invalidArgument(path + " is not a valid safetensors file: " + message);
}

}  // namespace

std::string encodeSafetensors(const std::vector<TensorRef>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    std::uint64_t count = 1;
    for (auto d : t.shape) count *= d;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + count * 4}}};
    offset += count * 4;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  out.reserve(out.size() + offset);
  for (const auto& t : tensors) {
    std::uint64_t count = 1;
    for (auto d : t.shape) count *= d;
    out.append(reinterpret_cast<const char*>(t.data), count * 4);
  }
  return out;
}

Result<SafetensorsFile> decodeSafetensors(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8) return bad(path, "shorter than its 8-byte header length");
  std::uint64_t headerBytes = 0;
  for (int i = 0; i < 8; ++i) headerBytes |= std::uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  if (headerBytes > kMaxHeaderBytes || 8 + headerBytes > bytes.size()) {
    // Not the number itself: it is the file's first 8 bytes, and the file may be a secret.
    return bad(path, "its first 8 bytes, the header length, do not fit the file (is it a safetensors file?)");
  }
  const nlohmann::json header =
      nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(headerBytes), nullptr,
                            /*allow_exceptions=*/false);
  if (!header.is_object()) return bad(path, "the header is not a JSON object");
  const std::uint64_t dataStart = 8 + headerBytes;
  const std::uint64_t dataBytes = bytes.size() - dataStart;

  SafetensorsFile file;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return bad(path, "__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) return bad(path, "metadata value '" + k + "' is not a string");
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      return bad(path, "tensor '" + name + "' lacks dtype, shape or data_offsets");
    }
    if (!entry["dtype"].is_string() || entry["dtype"] != "F32") {
      return invalidArgument(path + ": tensor '" + name + "' has dtype " + entry["dtype"].dump() +
                             "; Lockstep reads float32 (F32) tensors: save with tensor.float()");
    }
    const auto& shape = entry["shape"];
    const auto& offsets = entry["data_offsets"];
    if (!shape.is_array() || !offsets.is_array() || offsets.size() != 2) return bad(path, "tensor '" + name + "' has a malformed shape or data_offsets");
    Tensor t;
    std::uint64_t count = 1;
    for (const auto& d : shape) {
      if (!d.is_number_unsigned()) return bad(path, "tensor '" + name + "' has a malformed shape");
      t.shape.push_back(d.get<std::uint64_t>());
      if (t.shape.back() > (1ull << 40) || (count *= t.shape.back()) > (1ull << 40)) {
        return bad(path, "tensor '" + name + "' is too large");
      }
    }
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) return bad(path, "tensor '" + name + "' has malformed data_offsets");
    const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > dataBytes || end - begin != count * 4) {
      return bad(path, "tensor '" + name + "' data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                           ") do not match its shape or the file size");
    }
    ranges.emplace_back(begin, end);
    t.data.resize(count);
    std::memcpy(t.data.data(), bytes.data() + dataStart + begin, count * 4);
    file.tensors.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return bad(path, "two tensors' data overlap");
  }
  return file;
}

Result<SafetensorsFile> readSafetensors(const std::string& path, std::uint64_t maxBytes) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto bytes, readFile(path, maxBytes));
  return decodeSafetensors(bytes, path);
}

}  // namespace lockstep::trainer
