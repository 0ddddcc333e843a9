#include "kernels/cpu/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/simd_math.h"

#if defined(TINYSERVE_PREFILL_AMX)
#include "kernels/cpu/cpu_features.h"
#endif

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

// The AVX-512 prefill block kernel (attention_prefill.cc): on with SIMD attention on a CPU with
// AVX-512 F/BW/VL, unless TINYSERVE_ATTENTION_ISA or TINYSERVE_CPU_ISA asks for avx2.
bool DetectPrefillAvx512() {
#if defined(TINYSERVE_PREFILL_AVX512)
  if (!kSimd) return false;
  for (const char* var : {"TINYSERVE_CPU_ISA", "TINYSERVE_ATTENTION_ISA"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::strcmp(v, "avx2") == 0) return false;
  }
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

const bool kPrefillAvx512 = DetectPrefillAvx512();

void WidenFp16BoxScalar(const fp16_t* v, fp16_t* mn, fp16_t* mx, int n) {
  for (int i = 0; i < n; ++i) {
    const float x = Fp16ToFloat(v[i]);
    if (x < Fp16ToFloat(mn[i])) mn[i] = v[i];
    if (x > Fp16ToFloat(mx[i])) mx[i] = v[i];
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) void Fp16ToFloatAvx2(const fp16_t* src, float* dst,
                                                               int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = Fp16ToFloat(src[i]);
}

__attribute__((target("avx2,fma,f16c"))) void FloatToFp16Avx2(const float* src, fp16_t* dst,
                                                              int n) {
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = FloatToFp16(src[i]);
}

__attribute__((target("avx2,fma,f16c"))) void WidenFp16BoxAvx2(const fp16_t* v, fp16_t* mn,
                                                               fp16_t* mx, int n) {
  int i = 0;
  // 8 x 32-bit compare masks -> 8 x 16-bit (saturating pack keeps 0 and -1).
  const auto narrow = [](__m256 m) __attribute__((target("avx2"))) {
    const __m256i b = _mm256_castps_si256(m);
    return _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  };
  for (; i + 8 <= n; i += 8) {
    const __m128i vh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i));
    const __m128i nh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + i));
    const __m128i xh = _mm_loadu_si128(reinterpret_cast<const __m128i*>(mx + i));
    const __m256 vf = _mm256_cvtph_ps(vh);
    const __m128i lt = narrow(_mm256_cmp_ps(vf, _mm256_cvtph_ps(nh), _CMP_LT_OQ));
    const __m128i gt = narrow(_mm256_cmp_ps(vf, _mm256_cvtph_ps(xh), _CMP_GT_OQ));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(mn + i), _mm_blendv_epi8(nh, vh, lt));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(mx + i), _mm_blendv_epi8(xh, vh, gt));
  }
  WidenFp16BoxScalar(v + i, mn + i, mx + i, n - i);
}

__attribute__((target("avx2,fma"))) inline float HorizontalSum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

#endif

// Block kernels of the SIMD path: a block of up to kBlock tokens of one span against G query
// heads at once, so each K and V row is loaded and widened once for the whole GQA group.
#if defined(__x86_64__)
struct F16Rows {
  using T = fp16_t;
  __attribute__((target("avx2,fma,f16c"))) static __m256 Load(const fp16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct I8Rows {
  using T = int8_t;
  __attribute__((target("avx2,fma"))) static __m256 Load(const int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
};

// r[t] = the sum of the lanes of v[t], t < 8.
__attribute__((target("avx2,fma"))) inline __m256 Transpose8Sum(const __m256* v) {
  const __m256 a01 = _mm256_hadd_ps(v[0], v[1]), a23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a45 = _mm256_hadd_ps(v[4], v[5]), a67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 b0 = _mm256_hadd_ps(a01, a23), b1 = _mm256_hadd_ps(a45, a67);
  return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

// Rows of the next span, pulled into L2 one row per row computed now: a sequence's pages are
// scattered (2 KB of one head's K per page at d = 64), which the hardware prefetchers do not
// follow, and prefetching a whole span at once stalls on the line fill buffers.
struct RowPrefetch {
  const char* base = nullptr;
  int row_bytes = 0, rows = 0;
  void Row(int r) const {
    if (r >= rows) return;
    const char* p = base + static_cast<size_t>(r) * row_bytes;
    // An asm statement: GCC 12 drops _mm_prefetch here (the early return and the row offset
    // together make it treat the loop as dead).
    for (int o = 0; o < row_bytes; o += 64) __asm__ volatile("prefetcht1 %0" : : "m"(p[o]));
  }
};

// s[g][j] = scale * (q_g · k_j) for g < G, j < nb (nb <= kBlock; s rows are written 8 at a time,
// so up to the next multiple of 8). q [G][d], k [nb][d], d % 8 == 0. Prefetches rows
// row0 + j of pf.
template <int G, class R>
__attribute__((target("avx2,fma,f16c"))) void BlockScores(const float* q, int d,
                                                          const typename R::T* k, int nb,
                                                          float scale, float (*s)[kBlock],
                                                          const RowPrefetch& pf, int row0) {
  constexpr int A = G <= 4 ? 2 : 1;  // accumulators per head: shorter FMA chains
  const __m256 sc = _mm256_set1_ps(scale);
  for (int j0 = 0; j0 < nb; j0 += 8) {
    __m256 part[G][8];
    for (int t = 0; t < 8; ++t) {
      __m256 acc[A][G];
      for (int a = 0; a < A; ++a)
        for (int g = 0; g < G; ++g) acc[a][g] = _mm256_setzero_ps();
      if (j0 + t < nb) {
        pf.Row(row0 + j0 + t);
        const typename R::T* row = k + static_cast<size_t>(j0 + t) * d;
        int i = 0;
        for (; i + 8 * A <= d; i += 8 * A)
          for (int a = 0; a < A; ++a) {
            const __m256 kv = R::Load(row + i + 8 * a);
            for (int g = 0; g < G; ++g)
              acc[a][g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + i + 8 * a), kv, acc[a][g]);
          }
        for (; i < d; i += 8) {
          const __m256 kv = R::Load(row + i);
          for (int g = 0; g < G; ++g)
            acc[0][g] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * d + i), kv, acc[0][g]);
        }
      }
      for (int g = 0; g < G; ++g)
        part[g][t] = A == 2 ? _mm256_add_ps(acc[0][g], acc[A - 1][g]) : acc[0][g];
    }
    for (int g = 0; g < G; ++g)
      _mm256_storeu_ps(s[g] + j0, _mm256_mul_ps(sc, Transpose8Sum(part[g])));
  }
}

// out_g += sum_j w[g][j] * v_j for g < G, j < nb. v [nb][d], out [G][d], d % 8 == 0. The
// accumulators of S column vectors of every head stay in registers across the block.
template <int G, int S, class R>
__attribute__((target("avx2,fma,f16c"))) void BlockAccumulateCols(const float (*w)[kBlock], int nb,
                                                                  const typename R::T* v, int d,
                                                                  int i0, float* out,
                                                                  const RowPrefetch& pf, int row0) {
  __m256 acc[G][S];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < S; ++c) acc[g][c] = _mm256_loadu_ps(out + g * d + i0 + 8 * c);
  for (int j = 0; j < nb; ++j) {
    pf.Row(row0 + j);
    const typename R::T* row = v + static_cast<size_t>(j) * d + i0;
    __m256 x[S];
    for (int c = 0; c < S; ++c) x[c] = R::Load(row + 8 * c);
    for (int g = 0; g < G; ++g) {
      const __m256 wv = _mm256_broadcast_ss(&w[g][j]);
      for (int c = 0; c < S; ++c) acc[g][c] = _mm256_fmadd_ps(wv, x[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < S; ++c) _mm256_storeu_ps(out + g * d + i0 + 8 * c, acc[g][c]);
}

// The accumulation of one block (prefetching rows row0 + j of pf in the first column pass).
template <int G, class R>
void BlockAccumulate(const float (*w)[kBlock], int nb, const typename R::T* v, int d, float* out,
                     const RowPrefetch& pf, int row0) {
  constexpr int S = G == 1 ? 8 : G <= 3 ? 4 : G <= 6 ? 2 : 1;  // G * S <= 12 accumulators
  const RowPrefetch none;
  int i = 0;
  for (; i + 8 * S <= d; i += 8 * S)
    BlockAccumulateCols<G, S, R>(w, nb, v, d, i, out, i == 0 ? pf : none, row0);
  for (; i < d; i += 8) BlockAccumulateCols<G, 1, R>(w, nb, v, d, i, out, i == 0 ? pf : none, row0);
}

// Calls f(std::integral_constant<int, G>, g0) for the heads [g0, g0 + G) of n_q, G <= 8.
template <class F>
void ForHeadChunks(int n_q, F&& f) {
  for (int g0 = 0; g0 < n_q; g0 += 8) {
    const int n = std::min(8, n_q - g0);
    [&]<int... I>(std::integer_sequence<int, I...>) {
      ((n == I + 1 && (f(std::integral_constant<int, I + 1>{}, g0), true)) || ...);
    }
    (std::make_integer_sequence<int, 8>{});
  }
}

// The two instruction paths of AttendImpl, each a set of block operations on one span's rows
// [j0, j0 + nb): Scores (s[g][j] = scale * q_g · k_j), Accumulate (out_g += w[g][j] * v_j), and the
// softmax's Max, ExpSubSum (x = exp(x - m), returning the sum) and Scale (x *= c).
struct Avx2Ops {
  // The next span's rows, prefetched alongside this span's (the first chunk of heads does it).
  struct Next {
    RowPrefetch k, v;
  };
  static Next Plan(const KvSpan* next, int d) {
    Next n;
    if (next == nullptr) return n;
    const bool i8 = next->type == KvSpanType::kInt8;
    n.k.row_bytes = n.v.row_bytes = d * (i8 ? 1 : 2);
    n.k.rows = n.v.rows = next->n;
    n.k.base =
        i8 ? reinterpret_cast<const char*>(next->k8) : reinterpret_cast<const char*>(next->k);
    n.v.base =
        i8 ? reinterpret_cast<const char*>(next->v8) : reinterpret_cast<const char*>(next->v);
    return n;
  }
  // Rows the current span did not reach (a next span longer than this one).
  static void FinishPrefetch(const Next& next, int done) {
    for (int r = done; r < next.k.rows; ++r) {
      next.k.Row(r);
      next.v.Row(r);
    }
  }
  static void Scores(const KvSpan& span, const float* q, int n_q, int d, int j0, int nb,
                     float scale, float (*s)[kBlock], const Next& next) {
    ForHeadChunks(n_q, [&](auto G, int g0) {
      const float* qg = q + static_cast<size_t>(g0) * d;
      const RowPrefetch& pf = g0 == 0 ? next.k : RowPrefetch{};
      if (span.type == KvSpanType::kInt8) {
        BlockScores<G, I8Rows>(qg, d, span.k8 + static_cast<size_t>(j0) * d, nb, scale, s + g0, pf,
                               j0);
      } else {
        BlockScores<G, F16Rows>(qg, d, span.k + static_cast<size_t>(j0) * d, nb, scale, s + g0, pf,
                                j0);
      }
    });
  }
  static void Accumulate(const KvSpan& span, const float (*w)[kBlock], int n_q, int d, int j0,
                         int nb, float* out, const Next& next) {
    ForHeadChunks(n_q, [&](auto G, int g0) {
      float* o = out + static_cast<size_t>(g0) * d;
      const RowPrefetch& pf = g0 == 0 ? next.v : RowPrefetch{};
      if (span.type == KvSpanType::kInt8) {
        BlockAccumulate<G, I8Rows>(w + g0, nb, span.v8 + static_cast<size_t>(j0) * d, d, o, pf, j0);
      } else {
        BlockAccumulate<G, F16Rows>(w + g0, nb, span.v + static_cast<size_t>(j0) * d, d, o, pf, j0);
      }
    });
  }
  static float Max(const float* x, int n, float init) { return MaxAvx2(x, n, init); }
  static float ExpSubSum(float* x, int n, float m) { return ExpSubSumAvx2(x, n, m); }
  __attribute__((target("avx2,fma"))) static void Scale(float* x, float c, int d) {
    const __m256 cv = _mm256_set1_ps(c);
    for (int i = 0; i < d; i += 8)
      _mm256_storeu_ps(x + i, _mm256_mul_ps(cv, _mm256_loadu_ps(x + i)));
  }
};
#endif

// Plain loops: one token and one head at a time.
struct ScalarOps {
  struct Next {};
  static Next Plan(const KvSpan*, int) { return {}; }
  static void FinishPrefetch(const Next&, int) {}
  static void Scores(const KvSpan& span, const float* q, int n_q, int d, int j0, int nb,
                     float scale, float (*s)[kBlock], const Next&) {
    for (int j = 0; j < nb; ++j)
      for (int g = 0; g < n_q; ++g) {
        const float* qg = q + g * d;
        const size_t row = static_cast<size_t>(j0 + j) * d;
        float dot = 0;
        if (span.type == KvSpanType::kInt8) {
          for (int i = 0; i < d; ++i) dot += qg[i] * static_cast<float>(span.k8[row + i]);
        } else {
          for (int i = 0; i < d; ++i) dot += qg[i] * Fp16ToFloat(span.k[row + i]);
        }
        s[g][j] = dot * scale;
      }
  }
  static void Accumulate(const KvSpan& span, const float (*w)[kBlock], int n_q, int d, int j0,
                         int nb, float* out, const Next&) {
    for (int j = 0; j < nb; ++j) {
      const size_t row = static_cast<size_t>(j0 + j) * d;
      for (int g = 0; g < n_q; ++g) {
        float* acc = out + g * d;
        if (span.type == KvSpanType::kInt8) {
          for (int i = 0; i < d; ++i) acc[i] += w[g][j] * static_cast<float>(span.v8[row + i]);
        } else {
          for (int i = 0; i < d; ++i) acc[i] += w[g][j] * Fp16ToFloat(span.v[row + i]);
        }
      }
    }
  }
  static float Max(const float* x, int n, float init) {
    for (int j = 0; j < n; ++j) init = std::max(init, x[j]);
    return init;
  }
  static float ExpSubSum(float* x, int n, float m) {
    float sum = 0;
    for (int j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - m));
    return sum;
  }
  static void Scale(float* x, float c, int d) {
    for (int i = 0; i < d; ++i) x[i] *= c;
  }
};

// The online-softmax state of each query head.
struct SoftmaxState {
  float m[kMaxQ];   // running max of the scores
  float l[kMaxQ];   // running sum of exp(score - m)
};

template <class Ops>
void AttendImpl(const float* q, int n_q, int d, const KvSpan* spans, int n_spans,
                const AttendOptions& opt, float* out) {
  SoftmaxState st;
  for (int g = 0; g < n_q; ++g) {
    st.m[g] = -std::numeric_limits<float>::infinity();
    st.l[g] = 0;
  }
  std::memset(out, 0, sizeof(float) * n_q * d);
  alignas(32) float s[kMaxQ][kBlock];
  thread_local std::vector<float> qs;  // int8 spans: the scaled query [n_q][d]
  int64_t total = 0;
  for (int i = 0; i < n_spans; ++i) total += spans[i].n;
  int64_t pos = 0;
  for (int si = 0; si < n_spans; ++si) {
    const KvSpan& span = spans[si];
    const bool i8 = span.type == KvSpanType::kInt8;
    const typename Ops::Next next = Ops::Plan(si + 1 < n_spans ? &spans[si + 1] : nullptr, d);
    // int8: the query with the span's K channel scales and the softmax scale folded in.
    const float* qk = q;
    float score_scale = opt.scale;
    if (i8 && span.n > 0) {
      qs.resize(static_cast<size_t>(n_q) * d);
      for (int g = 0; g < n_q; ++g)
        for (int i = 0; i < d; ++i) qs[g * d + i] = q[g * d + i] * (span.k_scales[i] * opt.scale);
      qk = qs.data();
      score_scale = 1.0f;
    }
    for (int j0 = 0; j0 < span.n; j0 += kBlock) {
      const int nb = std::min(kBlock, span.n - j0);
      Ops::Scores(span, qk, n_q, d, j0, nb, score_scale, s, next);
      if (opt.scores_out != nullptr)
        for (int g = 0; g < n_q; ++g)
          std::memcpy(opt.scores_out + g * total + pos + j0, s[g], sizeof(float) * nb);
      // Online softmax: rescale the accumulator when the running max grows (by exp(-inf) = 0
      // on the first block, when the accumulator is still zero).
      for (int g = 0; g < n_q; ++g) {
        const float bm = Ops::Max(s[g], nb, st.m[g]);
        if (bm > st.m[g]) {
          const float c = std::exp(st.m[g] - bm);
          st.l[g] *= c;
          Ops::Scale(out + g * d, c, d);
          st.m[g] = bm;
        }
        if (bm == -std::numeric_limits<float>::infinity()) {  // only -inf scores so far
          std::fill(s[g], s[g] + nb, 0.0f);
          continue;
        }
        st.l[g] += Ops::ExpSubSum(s[g], nb, bm);
        if (i8)
          for (int j = 0; j < nb; ++j) s[g][j] *= span.v_scale;
      }
      // Accumulate V weighted by the probabilities; each V row is read once for the group.
      Ops::Accumulate(span, s, n_q, d, j0, nb, out, next);
    }
    Ops::FinishPrefetch(next, span.n);
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

// Rows of one sequence at consecutive positions (speculative decoding's verification): row r
// attends the first limit[r] tokens of the spans. Each row does exactly AttendImpl's arithmetic
// over its own tokens (the same blocks, head chunks and summation order; a row's last blocks are
// just shorter or absent), in lockstep, so every K/V block is loaded once for all rows and read
// again from cache.
template <class Ops>
void AttendRowsImpl(const float* q, int64_t q_stride, int n_rows, int n_q, int d,
                    const KvSpan* spans, int n_spans, const int64_t* limit, float scale, float* out,
                    int64_t out_stride, float* lse_out) {
  const int heads = n_rows * n_q;
  thread_local std::vector<float> m, l, qs;
  thread_local std::vector<std::array<float, kBlock>> s;
  m.assign(heads, -std::numeric_limits<float>::infinity());
  l.assign(heads, 0.0f);
  s.resize(heads);
  for (int r = 0; r < n_rows; ++r) std::memset(out + r * out_stride, 0, sizeof(float) * n_q * d);
  int64_t longest = 0;
  for (int r = 0; r < n_rows; ++r) longest = std::max(longest, limit[r]);
  int64_t pos = 0;
  for (int si = 0; si < n_spans && pos < longest; ++si) {
    const KvSpan& span = spans[si];
    const bool i8 = span.type == KvSpanType::kInt8;
    const typename Ops::Next next = Ops::Plan(si + 1 < n_spans ? &spans[si + 1] : nullptr, d);
    float score_scale = scale;
    if (i8 && span.n > 0) {
      qs.resize(static_cast<size_t>(heads) * d);
      for (int r = 0; r < n_rows; ++r)
        for (int g = 0; g < n_q; ++g)
          for (int i = 0; i < d; ++i)
            qs[(r * n_q + g) * d + i] = q[r * q_stride + g * d + i] * (span.k_scales[i] * scale);
      score_scale = 1.0f;
    }
    for (int j0 = 0; j0 < span.n; j0 += kBlock) {
      const int nb = std::min(kBlock, span.n - j0);
      for (int r = 0; r < n_rows; ++r) {
        const int nr = static_cast<int>(std::clamp<int64_t>(limit[r] - pos - j0, 0, nb));
        if (nr == 0) continue;
        const float* qk = i8 ? &qs[static_cast<size_t>(r) * n_q * d] : q + r * q_stride;
        auto* sr = reinterpret_cast<float(*)[kBlock]>(s[r * n_q].data());
        Ops::Scores(span, qk, n_q, d, j0, nr, score_scale, sr, next);
        float* o = out + r * out_stride;
        for (int g = 0; g < n_q; ++g) {
          float& mg = m[r * n_q + g];
          float& lg = l[r * n_q + g];
          const float bm = Ops::Max(sr[g], nr, mg);
          if (bm > mg) {
            const float c = std::exp(mg - bm);
            lg *= c;
            Ops::Scale(o + g * d, c, d);
            mg = bm;
          }
          if (bm == -std::numeric_limits<float>::infinity()) {
            std::fill(sr[g], sr[g] + nr, 0.0f);
            continue;
          }
          lg += Ops::ExpSubSum(sr[g], nr, bm);
          if (i8)
            for (int j = 0; j < nr; ++j) sr[g][j] *= span.v_scale;
        }
        Ops::Accumulate(span, sr, n_q, d, j0, nr, o, next);
      }
    }
    Ops::FinishPrefetch(next, span.n);
    pos += span.n;
  }
  for (int r = 0; r < n_rows; ++r)
    for (int g = 0; g < n_q; ++g) {
      const float lg = l[r * n_q + g];
      const float inv = lg > 0 ? 1.0f / lg : 0.0f;
      float* o = out + r * out_stride + g * d;
      for (int i = 0; i < d; ++i) o[i] *= inv;
      if (lse_out != nullptr)
        lse_out[r * n_q + g] =
            lg > 0 ? m[r * n_q + g] + std::log(lg) : -std::numeric_limits<float>::infinity();
    }
}

}  // namespace

bool AttentionUsesSimd() { return kSimd; }

void AttendSpansRows(const float* q, int64_t q_stride, int n_rows, int n_q, int head_dim,
                     const KvSpan* spans, int n_spans, const int64_t* limit, float scale,
                     float* out, int64_t out_stride, float* lse_out) {
#if defined(__x86_64__)
  if (kSimd) {
    AttendRowsImpl<Avx2Ops>(q, q_stride, n_rows, n_q, head_dim, spans, n_spans, limit, scale, out,
                            out_stride, lse_out);
    return;
  }
#endif
  AttendRowsImpl<ScalarOps>(q, q_stride, n_rows, n_q, head_dim, spans, n_spans, limit, scale, out,
                            out_stride, lse_out);
}

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

#if defined(__x86_64__)
__attribute__((target("avx2,fma,f16c"))) static float BoxScoreSplitAvx2(const float* qp,
                                                                        const float* qn,
                                                                        const fp16_t* mn,
                                                                        const fp16_t* mx, int d) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int i = 0; i < d; i += 8) {
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + i)));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mx + i)));
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp + i), hi, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qn + i), lo, acc1);
  }
  return HorizontalSum(_mm256_add_ps(acc0, acc1));
}
#endif

float BoxScoreSplit(const float* qp, const float* qn, const fp16_t* mn, const fp16_t* mx, int d) {
#if defined(__x86_64__)
  if (kSimd) return BoxScoreSplitAvx2(qp, qn, mn, mx, d);
#endif
  float acc = 0;
  for (int i = 0; i < d; ++i) acc += qp[i] * Fp16ToFloat(mx[i]) + qn[i] * Fp16ToFloat(mn[i]);
  return acc;
}

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

void FloatToFp16Row(const float* src, fp16_t* dst, int n) {
#if defined(__x86_64__)
  if (kSimd) return FloatToFp16Avx2(src, dst, n);
#endif
  for (int i = 0; i < n; ++i) dst[i] = FloatToFp16(src[i]);
}

void WidenFp16Box(const fp16_t* v, fp16_t* mn, fp16_t* mx, int n) {
#if defined(__x86_64__)
  if (kSimd) return WidenFp16BoxAvx2(v, mn, mx, n);
#endif
  WidenFp16BoxScalar(v, mn, mx, n);
}

void AttendSpans(const float* q, int n_q, int head_dim, const KvSpan* spans, int n_spans,
                 const AttendOptions& options, float* out) {
#if defined(__x86_64__)
  if (kSimd) {
    AttendImpl<Avx2Ops>(q, n_q, head_dim, spans, n_spans, options, out);
    return;
  }
#endif
  AttendImpl<ScalarOps>(q, n_q, head_dim, spans, n_spans, options, out);
}

#if defined(TINYSERVE_PREFILL_AVX512)
void AttendCausalBlockAvx512(const float* q, int64_t q_stride, int n_rows, int n_q, int d,
                             int64_t pos0, const KvSpan* spans, int n_spans, float scale,
                             float* out, int64_t out_stride);
#endif

#if defined(TINYSERVE_PREFILL_AVX2)
void AttendCausalBlockAvx2(const float* q, int64_t q_stride, int n_rows, int n_q, int d,
                           int64_t pos0, const KvSpan* spans, int n_spans, float scale, float* out,
                           int64_t out_stride);
#endif

#if defined(TINYSERVE_PREFILL_AMX)
void AttendCausalBlockAmx(const float* q, int64_t q_stride, int n_rows, int n_q, int d,
                          int64_t pos0, const KvSpan* spans, int n_spans, float scale, float* out,
                          int64_t out_stride);

// The AMX block kernel: with the AVX-512 one on, where MatMul's path is AMX (the CPU has it, the
// OS granted the tile state, TINYSERVE_CPU_ISA does not lower it), unless
// TINYSERVE_ATTENTION_ISA=avx512.
static bool PrefillAmx() {
  static const bool wanted = [] {
    const char* v = std::getenv("TINYSERVE_ATTENTION_ISA");
    return v == nullptr || std::strcmp(v, "avx512") != 0;
  }();
  return kPrefillAvx512 && wanted && ActiveCpuIsa() == CpuIsa::kAmx;
}
#endif

void AttendCausalBlock(const float* q, int64_t q_stride, int n_rows, int n_q, int head_dim,
                       int64_t pos0, const KvSpan* spans, int n_spans, float scale, float* out,
                       int64_t out_stride) {
#if defined(TINYSERVE_PREFILL_AMX)
  if (PrefillAmx()) {
    AttendCausalBlockAmx(q, q_stride, n_rows, n_q, head_dim, pos0, spans, n_spans, scale, out,
                         out_stride);
    return;
  }
#endif
#if defined(TINYSERVE_PREFILL_AVX512)
  if (kPrefillAvx512) {
    AttendCausalBlockAvx512(q, q_stride, n_rows, n_q, head_dim, pos0, spans, n_spans, scale, out,
                            out_stride);
    return;
  }
#endif
#if defined(TINYSERVE_PREFILL_AVX2)
  if (kSimd) {
    AttendCausalBlockAvx2(q, q_stride, n_rows, n_q, head_dim, pos0, spans, n_spans, scale, out,
                          out_stride);
    return;
  }
#endif
  // Row by row over the row's own tokens: the spans cut at pos0 + r + 1 tokens.
  std::vector<KvSpan> own;
  AttendOptions opt;
  opt.scale = scale;
  for (int r = 0; r < n_rows; ++r) {
    int64_t left = pos0 + r + 1;
    own.clear();
    for (int i = 0; i < n_spans && left > 0; ++i) {
      own.push_back(spans[i]);
      own.back().n = static_cast<int>(std::min<int64_t>(spans[i].n, left));
      left -= own.back().n;
    }
    AttendSpans(q + r * q_stride, n_q, head_dim, own.data(), static_cast<int>(own.size()), opt,
                out + r * out_stride);
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
