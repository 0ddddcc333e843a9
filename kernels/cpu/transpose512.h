// File: kernels/cpu/transpose512.h
// A 16x16 transpose of 32-bit elements in sixteen 512-bit registers, for the AVX-512 / AMX
// kernels (include only from files compiled with -mavx512f).
#pragma once

#include <immintrin.h>

namespace tinyserve {

// r[i] = dword row i; on return r[j] = column j (dword i of r[j] = old dword j of r[i]).
// static: each including file has its own copy, compiled with its own -m flags.
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
