// File: worker/hf/safetensors_test_util.h
// Test-only helpers that build safetensors bytes in memory, so tests can write well-formed and
// deliberately malformed files without Python.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tinyserve::testing {

struct FloatTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, F32
};

// The 8-byte little-endian length, the header text as given, then `data`.
inline std::string SafetensorsFromHeader(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// A well-formed F32 file holding `tensors` in order (header padded to 8 bytes).
inline std::string MakeF32Safetensors(const std::vector<FloatTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const FloatTensor& t : tensors) {
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return SafetensorsFromHeader(text, data);
}

}  // namespace tinyserve::testing
