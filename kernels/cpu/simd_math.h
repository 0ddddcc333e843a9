// File: kernels/cpu/simd_math.h
// Vectorized exp for the softmax of CPU attention: one exp per key per query head dominates
// decode at long contexts when done with libm. Cephes-style range reduction (x = n ln2 + r, hi/lo
// split of ln2) and a degree-6 polynomial: relative error under 2e-7 on [-87, 88], inputs below
// -87 flush toward 0 (softmax terms that small do not matter), no NaN/inf handling needed because
// callers pass score - running max <= 0.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>

namespace tinyserve {

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) inline __m256 Exp256(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.0f), hi = _mm256_set1_ps(88.0f);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  const __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n*ln2, with ln2 split so that n*ln2_hi is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // Scale by 2^n through the exponent bits.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// max(init, x[0], ..., x[n - 1]).
__attribute__((target("avx2,fma"))) inline float MaxAvx2(const float* x, int n, float init) {
  __m256 m = _mm256_set1_ps(init);
  int i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + i));
  __m128 v = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  v = _mm_max_ps(v, _mm_movehl_ps(v, v));
  v = _mm_max_ss(v, _mm_shuffle_ps(v, v, 1));
  float r = _mm_cvtss_f32(v);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

// x[i] = exp(x[i] - sub) for i < n; returns the sum of the results.
__attribute__((target("avx2,fma"))) inline float ExpSubSumAvx2(float* x, int n, float sub) {
  const __m256 s = _mm256_set1_ps(sub);
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  __m128 v = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_shuffle_ps(v, v, 1));
  float sum = _mm_cvtss_f32(v);
  for (; i < n; ++i) sum += (x[i] = std::exp(x[i] - sub));
  return sum;
}
#endif

}  // namespace tinyserve
