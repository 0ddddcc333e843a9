// File: common/fp16.h
// IEEE binary16 and bfloat16 conversions on the host (scalar, exact, round-to-nearest-even).
// SIMD kernels use F16C instead; these are the reference and the fallback.
#pragma once

#include <cstdint>
#include <cstring>

namespace tinyserve {

using fp16_t = uint16_t;  // IEEE binary16 bits.
using bf16_t = uint16_t;  // bfloat16 bits (top half of a float).

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float Fp16ToFloat(fp16_t h) {
  // Shift the exponent/mantissa into float position, then rescale by 2^112 so that normals,
  // subnormals and zero come out right in one multiply; infinities and NaNs are patched.
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  if (em >= 0x7c00u) return BitsToFloat(sign | 0x7f800000u | (em & 0x3ffu) << 13);
  return BitsToFloat(sign | FloatToBits(BitsToFloat(em << 13) * 0x1.0p112f));
}

inline fp16_t FloatToFp16(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<fp16_t>(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return static_cast<fp16_t>(sign | 0x7c00u);  // overflow -> inf
  if (ax < 0x38800000u) {
    // Subnormal or zero in fp16: add 0.5 (as float) so the FPU rounds the mantissa for us.
    const float r = BitsToFloat(ax) + 0.5f;
    return static_cast<fp16_t>(sign | (FloatToBits(r) - 0x3f000000u));
  }
  // Normal: rebias the exponent and round to nearest even on the 13 dropped bits.
  const uint32_t mant_odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + mant_odd;  // (15 - 127) << 23, plus rounding bias
  return static_cast<fp16_t>(sign | (ax >> 13));
}

// Directed rounding, for bounds kept in fp16: the largest fp16 <= f, and the smallest >= f.
// (An f beyond the fp16 range gives -inf / +inf respectively; NaN stays NaN.)
inline fp16_t FloatToFp16Down(float f) {
  fp16_t h = FloatToFp16(f);
  if ((h & 0x7fffu) > 0x7c00u || !(Fp16ToFloat(h) > f)) return h;
  if (h == 0x0000u || h == 0x8000u) return 0x8001u;  // just below zero
  return static_cast<fp16_t>(h & 0x8000u ? h + 1 : h - 1);
}
inline fp16_t FloatToFp16Up(float f) {
  fp16_t h = FloatToFp16(f);
  if ((h & 0x7fffu) > 0x7c00u || !(Fp16ToFloat(h) < f)) return h;
  if (h == 0x0000u || h == 0x8000u) return 0x0001u;  // just above zero
  return static_cast<fp16_t>(h & 0x8000u ? h - 1 : h + 1);
}

inline float Bf16ToFloat(bf16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

inline bf16_t FloatToBf16(float f) {
  uint32_t x = FloatToBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<bf16_t>(x >> 16);
}

}  // namespace tinyserve
