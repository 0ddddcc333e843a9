// File: kernels/cpu/dequant.h
// Dequantizers: ggml blocks to float32, one row (or any whole number of blocks) at a time.
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL
// and IQ4_XS (layouts in
// shared/reference/model-formats.md §4). Each is checked against reference values from the
// `gguf` Python package (tests/golden/dequant/, made by scripts/make_dequant_goldens.py).
//
// And the reference quantizers (float32 to blocks, bit-identical to ggml's reference
// quantize_row_*_ref) for Q4_0, Q4_1, Q8_0 and Q8_1, used by tests and by the activation
// quantization of the CPU kernels.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

// IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Q4_K's and Q5_K's 6-bit scale and min of sub-block j (0..7), unpacked from scales[12].
inline void ScaleMinK4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Writes n floats to dst from the blocks at src. InvalidArgument if the type is unsupported
// or n is not a multiple of its block size.
absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// Reference quantizers; REQUIRES: n % 32 == 0. dst holds n / 32 blocks of the type.
void QuantizeRowQ4_0(const float* x, void* dst, int64_t n);
void QuantizeRowQ4_1(const float* x, void* dst, int64_t n);
void QuantizeRowQ8_0(const float* x, void* dst, int64_t n);
void QuantizeRowQ8_1(const float* x, void* dst, int64_t n);

}  // namespace tinyserve
