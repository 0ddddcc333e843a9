// File: kernels/cpu/attention512.h
// AVX-512 helpers of the prefill attention kernels (include only from files compiled with
// -mavx512f -mavx512bw -mf16c): a base-2 exponential and the widening of one KV token to fp32.
// Static, like simd512.h: each file has its own copy, compiled with its own -m flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace tinyserve {

// 2^x for x <= 0 (x = -inf gives 0): x = n + r, |r| <= 1/2, 2^r by its degree-7 Taylor
// polynomial in r·ln 2 (relative error < 1e-8), scaled by 2^n with vscalefps.
static inline __m512 Exp2(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-150.0f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(1.5252734e-5f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.5403530e-4f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3333558e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Dims [c, c + 16) of token t's key (value = false) or value in a span, in fp32.
static inline __m512 KvRow16(const KvSpan& s, bool value, int t, int c, int d) {
  const int64_t off = static_cast<int64_t>(t) * d + c;
  if (s.type == KvSpanType::kF16) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>((value ? s.v : s.k) + off)));
  }
  const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>((value ? s.v8 : s.k8) + off))));
  return _mm512_mul_ps(x, value ? _mm512_set1_ps(s.v_scale) : _mm512_loadu_ps(s.k_scales + c));
}

// Token t of a span -> k[d], v[d] in fp32 (64-byte aligned). REQUIRES: d % 16 == 0.
static inline void WidenKvToken(const KvSpan& s, int t, int d, float* k, float* v) {
  for (int c = 0; c < d; c += 16) {
    _mm512_store_ps(k + c, KvRow16(s, false, t, c, d));
    _mm512_store_ps(v + c, KvRow16(s, true, t, c, d));
  }
}

}  // namespace tinyserve
