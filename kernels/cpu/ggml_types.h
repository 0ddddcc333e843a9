// File: kernels/cpu/ggml_types.h
// The ggml tensor types TinyServe reads (codes as stored in GGUF), with their block geometry.
// Block layouts are documented in shared/reference/model-formats.md §4 and in dequant.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tinyserve {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  std::string_view name;
  int block_size;    // elements per block
  int block_bytes;   // bytes per block
};

// Returns nullptr for a code TinyServe does not support (the GGUF reader turns that into an
// error naming the tensor and the code).
const GgmlTypeInfo* GetGgmlTypeInfo(uint32_t code);
inline const GgmlTypeInfo* GetGgmlTypeInfo(GgmlType t) {
  return GetGgmlTypeInfo(static_cast<uint32_t>(t));
}
std::string_view GgmlTypeName(GgmlType t);

// Bytes of one row of n elements; REQUIRES: n % block_size == 0 and t supported.
size_t GgmlRowBytes(GgmlType t, int64_t n);

}  // namespace tinyserve
