#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/attention.h"

namespace tinyserve {

#if defined(__x86_64__)
namespace {

// RmsNorm with the sum of squares in four double lanes x 2 (the scalar loop's double sum up to
// order) and y = x·inv·w in the same order as the scalar loop.
__attribute__((target("avx2,fma"))) void RmsNormAvx2(const float* x, const float* w, int n,
                                                     float eps, float* y) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
  double ss = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (int j = i; j < n; ++j) ss += static_cast<double>(x[j]) * x[j];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  const __m256 vinv = _mm256_set1_ps(inv);
  for (i = 0; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = x[i] * inv * w[i];
}

// exp(x) for 4 doubles, |x| <= 700: x = n·ln2 + r, |r| <= ln2/2, exp(r) by its degree-10 Taylor
// polynomial (relative error < 1e-13), times 2^n through the exponent bits.
__attribute__((target("avx2,fma"))) __m256d ExpPd(__m256d x) {
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0.6931471805599453), x);
  r = _mm256_fnmadd_pd(n, _mm256_set1_pd(2.3190468138462996e-17), r);
  __m256d p = _mm256_set1_pd(1.0 / 3628800);
  for (const double c : {1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24,
                         1.0 / 6, 0.5, 1.0, 1.0})
    p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c));
  // n + 1023 into the exponent field: n sits in the low bits of n + 1.5·2^52.
  const __m256i bits = _mm256_castpd_si256(_mm256_add_pd(n, _mm256_set1_pd(6755399441055744.0)));
  const __m256i e = _mm256_slli_epi64(_mm256_add_epi64(bits, _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(e));
}

// gate = gate / (1 + exp(-gate)) * up in the scalar loop's float operations, with exp(-gate)
// from ExpPd rounded to float: the scalar loop's bits for all but ~0.03 % of inputs (1-3 ulp
// there, where libm's expf or this one misses the correct rounding), so vectorizing it does not
// move the model's outputs (ops_test).
__attribute__((target("avx2,fma"))) void SwiGluAvx2(float* gate, const float* up, int n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256d lim = _mm256_set1_pd(700.0);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 ng = _mm256_sub_ps(_mm256_setzero_ps(), g);
    const auto exp4 = [&](__m128 x) __attribute__((target("avx2,fma"))) {
      const __m256d d = _mm256_max_pd(_mm256_min_pd(_mm256_cvtps_pd(x), lim), -lim);
      return _mm256_cvtpd_ps(ExpPd(d));
    };
    const __m256 e =
        _mm256_set_m128(exp4(_mm256_extractf128_ps(ng, 1)), exp4(_mm256_castps256_ps128(ng)));
    _mm256_storeu_ps(
        gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace
#endif

void RmsNorm(const float* x, const float* w, int n, float eps, float* y) {
#if defined(__x86_64__)
  if (AttentionUsesSimd()) return RmsNormAvx2(x, w, n, eps, y);
#endif
  double ss = 0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / n) + eps);
  for (int i = 0; i < n; ++i) y[i] = x[i] * inv * w[i];
}

void LayerNorm(const float* x, const float* w, const float* b, int n, float eps, float* y) {
  double mean = 0;
  for (int i = 0; i < n; ++i) mean += x[i];
  mean /= n;
  double var = 0;
  for (int i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= n;
  const float inv = 1.0f / std::sqrt(static_cast<float>(var) + eps);
  const float m = static_cast<float>(mean);
  for (int i = 0; i < n; ++i) y[i] = (x[i] - m) * inv * w[i] + (b ? b[i] : 0.0f);
}

void ApplyRope(float* x, int d, int64_t pos, float theta, bool adjacent) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    // Angles in double: positions up to 8K times frequencies near 1 lose digits in float.
    const double freq = std::pow(static_cast<double>(theta), -2.0 * i / d);
    const double a = static_cast<double>(pos) * freq;
    const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    float* x0 = adjacent ? &x[2 * i] : &x[i];
    float* x1 = adjacent ? &x[2 * i + 1] : &x[i + half];
    const float a0 = *x0, a1 = *x1;
    *x0 = a0 * c - a1 * s;
    *x1 = a0 * s + a1 * c;
  }
}

void SwiGlu(float* gate, const float* up, int n) {
#if defined(__x86_64__)
  if (AttentionUsesSimd()) return SwiGluAvx2(gate, up, n);
#endif
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void GeluNew(float* x, int n) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  for (int i = 0; i < n; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.0f + std::tanh(kC * (v + 0.044715f * v * v * v)));
  }
}

void GeGlu(float* gate, const float* up, int n) {
  GeluNew(gate, n);
  for (int i = 0; i < n; ++i) gate[i] *= up[i];
}

void AddInPlace(float* y, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace tinyserve

namespace tinyserve {

RopeTable::RopeTable(int head_dim, int max_pos, float theta, float freq_scale,
                     const std::vector<float>& freq_factors, float attn_factor)
    : head_dim_(head_dim), max_pos_(max_pos), attn_factor_(attn_factor) {
  const int half = head_dim / 2;
  freq_.resize(half);
  for (int i = 0; i < half; ++i) {
    const double factor = freq_factors.empty() ? 1.0 : freq_factors[i];
    freq_[i] = freq_scale * std::pow(static_cast<double>(theta), -2.0 * i / head_dim) / factor;
  }
  Reserve(std::min(max_pos, 4096));
}

void RopeTable::Reserve(int64_t n) {
  n = std::min<int64_t>(n, max_pos_);
  if (n <= reserved_) return;
  n = std::min<int64_t>(std::max(n, reserved_ + reserved_ / 2), max_pos_);
  const size_t half = freq_.size();
  cos_.resize(static_cast<size_t>(n) * half);
  sin_.resize(cos_.size());
  for (int64_t p = reserved_; p < n; ++p)
    for (size_t i = 0; i < half; ++i) {
      const double a = p * freq_[i];
      cos_[p * half + i] = static_cast<float>(attn_factor_ * std::cos(a));
      sin_[p * half + i] = static_cast<float>(attn_factor_ * std::sin(a));
    }
  reserved_ = n;
}

void RopeTable::Apply(float* x, int64_t pos, bool adjacent) const {
  const int half = head_dim_ / 2;
  const float* c = &cos_[static_cast<size_t>(pos) * half];
  const float* s = &sin_[static_cast<size_t>(pos) * half];
  if (adjacent) {
    for (int i = 0; i < half; ++i) {
      const float a0 = x[2 * i], a1 = x[2 * i + 1];
      x[2 * i] = a0 * c[i] - a1 * s[i];
      x[2 * i + 1] = a0 * s[i] + a1 * c[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float a0 = x[i], a1 = x[i + half];
      x[i] = a0 * c[i] - a1 * s[i];
      x[i + half] = a0 * s[i] + a1 * c[i];
    }
  }
}

}  // namespace tinyserve
