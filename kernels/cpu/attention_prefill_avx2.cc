// Causal attention for a block of prefill rows, AVX2 + FMA + F16C (this file is compiled with
// -mavx2 -mfma -mf16c and only called when the CPU has them): the AVX-512 block kernel of
// attention_prefill.cc at half the width. A block of rows of one sequence and one GQA group
// walks the prefix once, in tiles of 16 tokens whose K (transposed) and V are widened to fp32
// once for every query vector of the block; Q·Kᵀ and P·V are register-blocked FMA loops over 4
// query vectors, with the online softmax in between. Row by row (the path before it) re-read
// and re-widened the whole prefix once per query row: at 4K tokens, 60 % of a prefill's time.
// All in fp32; only the order of the sums differs from AttendSpans.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/log.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_prefill_block.h"
#include "kernels/cpu/simd_math.h"

namespace tinyserve {
namespace {

constexpr int kTok = 16;  // tokens per tile
constexpr int kMr = 4;    // query vectors per register block

// Dims [c, c + 8) of token t's key (value = false) or value in a span, in fp32.
inline __m256 KvRow8(const KvSpan& s, bool value, int t, int c, int d) {
  const int64_t off = static_cast<int64_t>(t) * d + c;
  if (s.type == KvSpanType::kF16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>((value ? s.v : s.k) + off)));
  }
  const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>((value ? s.v8 : s.k8) + off))));
  return _mm256_mul_ps(x, value ? _mm256_set1_ps(s.v_scale) : _mm256_loadu_ps(s.k_scales + c));
}

// r[i][j] -> r[j][i] for an 8 x 8 block of floats.
inline void Transpose8x8(__m256* r) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Tokens [off, off + n) of a span (n <= 16) -> kt[d][16] (K transposed) and vt[16][d] in fp32;
// token slots n..15 are zero.
void LoadTile(const KvSpan& s, int off, int n, int d, float* kt, float* vt) {
  for (int c = 0; c < d; c += 8) {
    for (int half = 0; half < 2; ++half) {
      __m256 k[8];
      for (int r = 0; r < 8; ++r) {
        const int j = 8 * half + r;
        const bool live = j < n;
        k[r] = live ? KvRow8(s, false, off + j, c, d) : _mm256_setzero_ps();
        _mm256_store_ps(vt + j * d + c,
                        live ? KvRow8(s, true, off + j, c, d) : _mm256_setzero_ps());
      }
      Transpose8x8(k);
      for (int i = 0; i < 8; ++i) _mm256_store_ps(kt + (c + i) * kTok + 8 * half, k[i]);
    }
  }
}

inline float HMax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

using prefill_block::State;

// One register block of query vectors m0..m0+kMr-1 (those >= m_end are padding) against one
// tile of n tokens at positions j0.. . Query vector m belongs to row m / n_q at position
// pos0 + m / n_q and sees tokens up to it; one that sees none of the tile keeps its state.
// Each query vector's 16 scores are two vectors (kMr x 2 accumulators, 8 of AVX2's 16
// registers).
void BlockTile(const State& st, int m0, int m_end, int n_q, int d, int64_t pos0, int64_t j0, int n,
               const float* kt, const float* vt) {
  __m256 s[kMr][2];
#pragma GCC unroll 4
  for (int i = 0; i < kMr; ++i) s[i][0] = s[i][1] = _mm256_setzero_ps();
  const float* q = st.q + static_cast<size_t>(m0) * d;
  for (int k = 0; k < d; ++k) {
    const __m256 k0 = _mm256_load_ps(kt + k * kTok), k1 = _mm256_load_ps(kt + k * kTok + 8);
#pragma GCC unroll 4
    for (int i = 0; i < kMr; ++i) {
      const __m256 qv = _mm256_broadcast_ss(q + i * d + k);
      s[i][0] = _mm256_fmadd_ps(qv, k0, s[i][0]);
      s[i][1] = _mm256_fmadd_ps(qv, k1, s[i][1]);
    }
  }
  // s[][] indexed only by unrolled constants, so that it stays in registers through the loop
  // above (indexed by the softmax loop's i, GCC stored it to the stack at every step).
  alignas(32) float p[kMr][kTok];
#pragma GCC unroll 4
  for (int i = 0; i < kMr; ++i) {
    _mm256_store_ps(p[i], s[i][0]);
    _mm256_store_ps(p[i] + 8, s[i][1]);
  }
  float alpha[kMr];
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int i = 0; i < kMr; ++i) {
    const int m = m0 + i;
    const int64_t limit = m < m_end ? std::min<int64_t>(n, pos0 + m / n_q - j0 + 1) : 0;
    if (limit <= 0) {
      _mm256_store_ps(p[i], _mm256_setzero_ps());
      _mm256_store_ps(p[i] + 8, _mm256_setzero_ps());
      alpha[i] = 1.0f;
      continue;
    }
    const __m256i lim = _mm256_set1_epi32(static_cast<int>(limit));
    const __m256 valid0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, lane));
    const __m256 valid1 =
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(lim, _mm256_add_epi32(lane, _mm256_set1_epi32(8))));
    const __m256 s0 = _mm256_blendv_ps(neg_inf, _mm256_load_ps(p[i]), valid0);
    const __m256 s1 = _mm256_blendv_ps(neg_inf, _mm256_load_ps(p[i] + 8), valid1);
    const float m_new = std::max(st.m[m], HMax(_mm256_max_ps(s0, s1)));
    alpha[i] = std::exp(st.m[m] - m_new);
    // Exp256 flushes far-negative inputs to a tiny value, not 0: masked lanes are zeroed.
    const __m256 mv = _mm256_set1_ps(m_new);
    const __m256 p0 = _mm256_and_ps(Exp256(_mm256_sub_ps(s0, mv)), valid0);
    const __m256 p1 = _mm256_and_ps(Exp256(_mm256_sub_ps(s1, mv)), valid1);
    st.l[m] = st.l[m] * alpha[i] + HSum(_mm256_add_ps(p0, p1));
    st.m[m] = m_new;
    _mm256_store_ps(p[i], p0);
    _mm256_store_ps(p[i] + 8, p1);
  }
  // O = O·alpha + P·V, 16 columns at a time (kMr x 2 accumulators).
  for (int c = 0; c < d; c += 16) {
    __m256 acc[kMr][2];
#pragma GCC unroll 4
    for (int i = 0; i < kMr; ++i) {
      const float* o = st.o + static_cast<size_t>(m0 + i) * d + c;
      const __m256 a = _mm256_set1_ps(alpha[i]);
      acc[i][0] = _mm256_mul_ps(_mm256_load_ps(o), a);
      acc[i][1] = _mm256_mul_ps(_mm256_load_ps(o + 8), a);
    }
    for (int j = 0; j < n; ++j) {
      const __m256 v0 = _mm256_load_ps(vt + j * d + c), v1 = _mm256_load_ps(vt + j * d + c + 8);
#pragma GCC unroll 4
      for (int i = 0; i < kMr; ++i) {
        const __m256 pij = _mm256_broadcast_ss(&p[i][j]);
        acc[i][0] = _mm256_fmadd_ps(pij, v0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(pij, v1, acc[i][1]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < kMr; ++i) {
      float* o = st.o + static_cast<size_t>(m0 + i) * d + c;
      _mm256_store_ps(o, acc[i][0]);
      _mm256_store_ps(o + 8, acc[i][1]);
    }
  }
}

}  // namespace

void AttendCausalBlockAvx2(const float* q, int64_t q_stride, int n_rows, int n_q, int d,
                           int64_t pos0, const KvSpan* spans, int n_spans, float scale, float* out,
                           int64_t out_stride) {
  prefill_block::AttendCausalBlock<kTok, kMr, LoadTile, BlockTile>(
      q, q_stride, n_rows, n_q, d, pos0, spans, n_spans, scale, out, out_stride);
}

}  // namespace tinyserve
