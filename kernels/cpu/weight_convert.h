// File: kernels/cpu/weight_convert.h
// Load-time conversion of the weight types the matrix kernels do not read (the K-quants
// Q2_K..Q6_K, IQ4_XS) to ones they do, so a GGUF file of any common quantization (Q4_K_M,
// Q5_K_M, Q6_K, IQ4_XS, ...) runs on the int8 kernels instead of as F32. (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0 and IQ4_NL have their own kernels.)
//
//   Q4_K          -> Q4_1  per 32-element sub-block: scale d·sc and minimum −dmin·m, each
//                          rounded once to fp16 (relative error <= 2^-11 of that scale); the
//                          4-bit codes are the file's
//   Q5_K          -> Q5_1  the same, with the file's 5-bit codes
//   IQ4_XS        -> IQ4_NL  per 32-element sub-block: the scale d·(ls − 32) rounded once to
//                          fp16; the 4-bit codes are the file's
//   Q2_K, Q3_K, Q6_K -> Q8_0 requantized: each block of 32 dequantized and quantized again to
//                          int8 with its absolute maximum as 127, so every weight moves by at
//                          most half a Q8_0 step (amax / 254) — the error the kernels already
//                          make on the activations, which they quantize the same way
//
// The sizes: Q4_K 4.5 -> 5 bits a weight, Q5_K 5.5 -> 6, IQ4_XS 4.25 -> 4.5, Q6_K 6.6 -> 8.5,
// Q2_K/Q3_K -> 8.5. With TINYSERVE_WEIGHTS_EXACT=1 (read once) every such type is dequantized
// to F32 instead, as before: exact and 4-12x the memory, for numerical comparisons.
#pragma once

#include <cstdint>

#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

// The type ConvertRow writes for `type`, or `type` itself where there is no conversion (MatMul
// types, F32, F16, BF16).
GgmlType ConvertedType(GgmlType type);
// Converts one row of n elements (REQUIRES: ConvertedType(type) != type; n a whole number of
// blocks of `type`). Returns false, having written part of dst, when a converted fp16 scale is
// not finite (a scale above 65504: never in a real model); the caller then takes F32.
bool ConvertRow(GgmlType type, const uint8_t* src, uint8_t* dst, int64_t n);
// False when TINYSERVE_WEIGHTS_EXACT=1.
bool WeightConversionEnabled();

}  // namespace tinyserve
