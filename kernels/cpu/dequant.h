// File: kernels/cpu/dequant.h
// Dequantizers: ggml blocks to float32, one row (or any whole number of blocks) at a time.
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K (layouts in
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

// Writes n floats to dst from the blocks at src. InvalidArgument if the type is unsupported
// or n is not a multiple of its block size.
absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// Reference quantizers; REQUIRES: n % 32 == 0. dst holds n / 32 blocks of the type.
void QuantizeRowQ4_0(const float* x, void* dst, int64_t n);
void QuantizeRowQ4_1(const float* x, void* dst, int64_t n);
void QuantizeRowQ8_0(const float* x, void* dst, int64_t n);
void QuantizeRowQ8_1(const float* x, void* dst, int64_t n);

}  // namespace tinyserve
