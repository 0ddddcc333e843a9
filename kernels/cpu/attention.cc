#include "kernels/cpu/attention.h"

#include "kernels/cpu/simd_math.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tinyserve {
namespace {

constexpr int kMaxQ = 64;
constexpr int kBlock = 32;  // tokens scored before each softmax update

bool DetectSimd() {
#if defined(__x86_64__)
  const char* isa = std::getenv("TINYSERVE_CPU_ISA");
  if (isa != nullptr && std::strcmp(isa, "scalar") == 0) return false;
  const char* attn = std::getenv("TINYSERVE_ATTENTION_ISA");
  if (attn != nullptr && std::strcmp(attn, "scalar") == 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

const bool kSimd = DetectSimd();

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) void Fp16ToFloatAvx2(const fp16_t* src, float* dst,
                                                               int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = Fp16ToFloat(src[i]);
}

__attribute__((target("avx2,fma"))) inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

// dot(q, k) with k in fp16; d % 8 == 0.
__attribute__((target("avx2,fma,f16c"))) inline float DotF16(const float* q, const fp16_t* k,
                                                             int d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= d; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                           _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i))),
                           acc0);
    acc1 = _mm256_fmadd_ps(
        _mm256_loadu_ps(q + i + 8),
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i + 8))), acc1);
  }
  for (; i < d; i += 8)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i),
                           _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i))),
                           acc0);
  return HorizontalSum(_mm256_add_ps(acc0, acc1));
}

// acc[d] = acc[d] * c + w * v[d] with v in fp16.
__attribute__((target("avx2,fma,f16c"))) inline void AxpyF16(float* acc, float w,
                                                             const fp16_t* v, int d) {
  const __m256 wv = _mm256_set1_ps(w);
  for (int i = 0; i < d; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(acc + i)));
  }
}

// dot(q, k) with k in int8 (unscaled); d % 8 == 0.
__attribute__((target("avx2,fma"))) inline float DotI8(const float* q, const int8_t* k, int d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= d; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + i));
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                           acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8),
                           _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), acc1);
  }
  for (; i < d; i += 8)
    acc0 = _mm256_fmadd_ps(
        _mm256_loadu_ps(q + i),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k + i)))),
        acc0);
  return HorizontalSum(_mm256_add_ps(acc0, acc1));
}

// acc[d] += w * v[d] with v in int8 (w carries the scale).
__attribute__((target("avx2,fma"))) inline void AxpyI8(float* acc, float w, const int8_t* v,
                                                       int d) {
  const __m256 wv = _mm256_set1_ps(w);
  for (int i = 0; i < d; i += 8) {
    __m256 x = _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(v + i))));
    _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, x, _mm256_loadu_ps(acc + i)));
  }
}

__attribute__((target("avx2,fma"))) inline void ScaleRow(float* acc, float c, int d) {
  const __m256 cv = _mm256_set1_ps(c);
  for (int i = 0; i < d; i += 8) _mm256_storeu_ps(acc + i, _mm256_mul_ps(cv, _mm256_loadu_ps(acc + i)));
}
#endif

inline float DotF16Scalar(const float* q, const fp16_t* k, int d) {
  float s = 0;
  for (int i = 0; i < d; ++i) s += q[i] * Fp16ToFloat(k[i]);
  return s;
}

inline float DotI8Scalar(const float* q, const int8_t* k, int d) {
  float s = 0;
  for (int i = 0; i < d; ++i) s += q[i] * static_cast<float>(k[i]);
  return s;
}

// The online-softmax state of each query head.
struct SoftmaxState {
  float m[kMaxQ];   // running max of the scores
  float l[kMaxQ];   // running sum of exp(score - m)
};

template <bool kUseSimd>
void AttendImpl(const float* q, int n_q, int d, const KvSpan* spans, int n_spans,
                const AttendOptions& opt, float* out) {
  SoftmaxState st;
  for (int g = 0; g < n_q; ++g) {
    st.m[g] = -std::numeric_limits<float>::infinity();
    st.l[g] = 0;
  }
  std::memset(out, 0, sizeof(float) * n_q * d);
  float s[kMaxQ][kBlock];
  thread_local std::vector<float> qs;  // int8 spans: the scaled query [n_q][d]
  int64_t total = 0;
  for (int i = 0; i < n_spans; ++i) total += spans[i].n;
  int64_t pos = 0;
  for (int si = 0; si < n_spans; ++si) {
    const KvSpan& span = spans[si];
    for (int j0 = 0; j0 < span.n; j0 += kBlock) {
      const int nb = std::min(kBlock, span.n - j0);
      // Scores of the block for every query head.
      if (span.type == KvSpanType::kInt8) {
        // The query with the span's K channel scales and the softmax scale folded in.
        if (j0 == 0) {
          qs.resize(static_cast<size_t>(n_q) * d);
          for (int g = 0; g < n_q; ++g)
            for (int i = 0; i < d; ++i)
              qs[g * d + i] = q[g * d + i] * (span.k_scales[i] * opt.scale);
        }
        for (int j = 0; j < nb; ++j) {
          const int8_t* k = span.k8 + static_cast<size_t>(j0 + j) * d;
          for (int g = 0; g < n_q; ++g) {
#if defined(__x86_64__)
            if constexpr (kUseSimd) {
              s[g][j] = DotI8(&qs[g * d], k, d);
              continue;
            }
#endif
            s[g][j] = DotI8Scalar(&qs[g * d], k, d);
          }
        }
      } else {
        for (int j = 0; j < nb; ++j) {
          const fp16_t* k = span.k + static_cast<size_t>(j0 + j) * d;
          for (int g = 0; g < n_q; ++g) {
            float dot;
#if defined(__x86_64__)
            if constexpr (kUseSimd) {
              dot = DotF16(q + g * d, k, d);
            } else {
              dot = DotF16Scalar(q + g * d, k, d);
            }
#else
            dot = DotF16Scalar(q + g * d, k, d);
#endif
            s[g][j] = dot * opt.scale;
          }
        }
      }
      if (opt.scores_out != nullptr)
        for (int g = 0; g < n_q; ++g)
          std::memcpy(opt.scores_out + g * total + pos + j0, s[g], sizeof(float) * nb);
      // Online softmax: rescale the accumulator when the running max grows. The max() keeps
      // exp(-inf - -inf) = NaN out of the first block.
      for (int g = 0; g < n_q; ++g) {
        float bm = st.m[g];
        for (int j = 0; j < nb; ++j) bm = std::max(bm, s[g][j]);
        const float c = std::exp(st.m[g] - bm);  // 0 on the first block (m = -inf)
        st.l[g] *= c;
        float* acc = out + g * d;
        if (c != 1.0f) {
#if defined(__x86_64__)
          if constexpr (kUseSimd) {
            ScaleRow(acc, c, d);
          } else {
            for (int i = 0; i < d; ++i) acc[i] *= c;
          }
#else
          for (int i = 0; i < d; ++i) acc[i] *= c;
#endif
        }
        st.m[g] = bm;
#if defined(__x86_64__)
        if constexpr (kUseSimd) {
          st.l[g] += ExpSubSumAvx2(s[g], nb, bm);
          continue;
        }
#endif
        for (int j = 0; j < nb; ++j) {
          s[g][j] = std::exp(s[g][j] - bm);
          st.l[g] += s[g][j];
        }
      }
      // Accumulate V weighted by the probabilities; each V row is read once for the group.
      if (span.type == KvSpanType::kInt8) {
        for (int j = 0; j < nb; ++j) {
          const int8_t* v = span.v8 + static_cast<size_t>(j0 + j) * d;
          for (int g = 0; g < n_q; ++g) {
            const float w = s[g][j] * span.v_scale;
            float* acc = out + g * d;
#if defined(__x86_64__)
            if constexpr (kUseSimd) {
              AxpyI8(acc, w, v, d);
              continue;
            }
#endif
            for (int i = 0; i < d; ++i) acc[i] += w * static_cast<float>(v[i]);
          }
        }
        continue;
      }
      for (int j = 0; j < nb; ++j) {
        const fp16_t* v = span.v + static_cast<size_t>(j0 + j) * d;
#if defined(__x86_64__)
        if constexpr (kUseSimd) {
          for (int g = 0; g < n_q; ++g) AxpyF16(out + g * d, s[g][j], v, d);
          continue;
        }
#endif
        for (int g = 0; g < n_q; ++g) {
          float* acc = out + g * d;
          for (int i = 0; i < d; ++i) acc[i] += s[g][j] * Fp16ToFloat(v[i]);
        }
      }
    }
    pos += span.n;
  }
  for (int g = 0; g < n_q; ++g) {
    // With no tokens l is 0: leave zeros rather than dividing by zero.
    const float inv = st.l[g] > 0 ? 1.0f / st.l[g] : 0.0f;
    for (int i = 0; i < d; ++i) out[g * d + i] *= inv;
    if (opt.lse_out != nullptr)
      opt.lse_out[g] = st.l[g] > 0 ? st.m[g] + std::log(st.l[g])
                                   : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace

bool AttentionUsesSimd() { return kSimd; }

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) static float BoxScoreAvx2(const float* q, const fp16_t* mn,
                                                             const fp16_t* mx, int d) {
  __m256 acc = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    const __m256 lo =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + i)));
    const __m256 hi =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mx + i)));
    acc = _mm256_add_ps(acc, _mm256_max_ps(_mm256_mul_ps(qv, lo), _mm256_mul_ps(qv, hi)));
  }
  return HorizontalSum(acc);
}
#endif

float BoxScore(const float* q, const fp16_t* mn, const fp16_t* mx, int d) {
#if defined(__x86_64__)
  if (kSimd) return BoxScoreAvx2(q, mn, mx, d);
#endif
  // Eight partial sums, as the SIMD lanes.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < d; ++i)
    acc[i % 8] += std::max(q[i] * Fp16ToFloat(mn[i]), q[i] * Fp16ToFloat(mx[i]));
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void Fp16ToFloatRow(const fp16_t* src, float* dst, int n) {
#if defined(__x86_64__)
  if (kSimd) {
    Fp16ToFloatAvx2(src, dst, n);
    return;
  }
#endif
  for (int i = 0; i < n; ++i) dst[i] = Fp16ToFloat(src[i]);
}

void AttendSpans(const float* q, int n_q, int head_dim, const KvSpan* spans, int n_spans,
                 const AttendOptions& options, float* out) {
  if (kSimd) {
    AttendImpl<true>(q, n_q, head_dim, spans, n_spans, options, out);
  } else {
    AttendImpl<false>(q, n_q, head_dim, spans, n_spans, options, out);
  }
}

namespace {

// Element i of row j of a span's K or V, as attention reads it.
inline double SpanK(const KvSpan& s, int j, int i, int d) {
  const size_t x = static_cast<size_t>(j) * d + i;
  return s.type == KvSpanType::kInt8 ? static_cast<double>(static_cast<float>(s.k8[x]) * s.k_scales[i])
                                     : static_cast<double>(Fp16ToFloat(s.k[x]));
}
inline double SpanV(const KvSpan& s, int j, int i, int d) {
  const size_t x = static_cast<size_t>(j) * d + i;
  return s.type == KvSpanType::kInt8 ? static_cast<double>(static_cast<float>(s.v8[x]) * s.v_scale)
                                     : static_cast<double>(Fp16ToFloat(s.v[x]));
}

}  // namespace

void AttendSpansReference(const float* q, int n_q, int d, const KvSpan* spans, int n_spans,
                          const AttendOptions& opt, float* out) {
  // Materialize all tokens, softmax in double, weighted sum.
  int64_t total = 0;
  for (int i = 0; i < n_spans; ++i) total += spans[i].n;
  for (int g = 0; g < n_q; ++g) {
    std::vector<double> sc;
    sc.reserve(total);
    for (int si = 0; si < n_spans; ++si)
      for (int j = 0; j < spans[si].n; ++j) {
        double dot = 0;
        for (int i = 0; i < d; ++i)
          dot += static_cast<double>(q[g * d + i]) * SpanK(spans[si], j, i, d);
        sc.push_back(dot * opt.scale);
      }
    if (opt.scores_out != nullptr)
      for (int64_t t = 0; t < total; ++t) opt.scores_out[g * total + t] = static_cast<float>(sc[t]);
    double m = -std::numeric_limits<double>::infinity();
    for (double x : sc) m = std::max(m, x);
    double l = 0;
    for (double& x : sc) l += (x = std::exp(x - m));
    std::vector<double> acc(d, 0.0);
    int64_t t = 0;
    for (int si = 0; si < n_spans; ++si)
      for (int j = 0; j < spans[si].n; ++j, ++t)
        for (int i = 0; i < d; ++i) acc[i] += sc[t] * SpanV(spans[si], j, i, d);
    for (int i = 0; i < d; ++i) out[g * d + i] = l > 0 ? static_cast<float>(acc[i] / l) : 0.0f;
    if (opt.lse_out != nullptr)
      opt.lse_out[g] = l > 0 ? static_cast<float>(m + std::log(l))
                             : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace tinyserve
