// File: kernels/cpu/simd512.h
// Small AVX-512 helpers shared by the AVX-512 / AMX kernels (include only from files compiled
// with -mavx512f): horizontal sum and max, and a 16x16 transpose of 32-bit elements. All are
// static: each including file has its own copy, compiled with its own -m flags.
#pragma once

#include <immintrin.h>

namespace tinyserve {

// r[i] = dword row i; on return r[j] = column j (dword i of r[j] = old dword j of r[i]).
// Horizontal sum / max of 16 floats: halves, then quarters, then within 128 bits. (GCC 12's
// _mm512_reduce_add_ps and _mm512_cvtph_ps trip -Wuninitialized on their internal
// _mm*_undefined_* operands; these spellings avoid them.)
static inline float HSum512(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));
  const __m256 h = _mm512_castps512_ps256(v);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float HMax512(__m512 v) {
  v = _mm512_max_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));
  const __m256 h = _mm512_castps512_ps256(v);
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4a + c], 128-bit lane L: rows 4a..4a+3 at column 4L + c.
  for (int a = 0; a < 4; ++a) {
    u[4 * a + 0] = _mm512_unpacklo_epi64(t[4 * a], t[4 * a + 2]);
    u[4 * a + 1] = _mm512_unpackhi_epi64(t[4 * a], t[4 * a + 2]);
    u[4 * a + 2] = _mm512_unpacklo_epi64(t[4 * a + 1], t[4 * a + 3]);
    u[4 * a + 3] = _mm512_unpackhi_epi64(t[4 * a + 1], t[4 * a + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i p0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i p1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i q0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i q1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(p0, q0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(p0, q0, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(p1, q1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(p1, q1, 0xdd);
  }
}

}  // namespace tinyserve
