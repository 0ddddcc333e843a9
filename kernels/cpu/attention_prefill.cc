// Causal attention for a block of prefill rows (AVX-512; this file is compiled with -mavx512f
// -mavx512bw -mavx512vl -mfma -mf16c and only called when the CPU has them).
//
// Row by row, prefill attention reads the whole prefix once per query row: at 8K tokens that is
// ~770 GB of K/V for SmolLM2 and the step waits on memory. Here a block of rows of one sequence
// and one GQA group walks the prefix once, in tiles of 16 tokens: each tile's K (transposed) and
// V are widened to fp32 once and used by every query vector of the block (rows x group heads),
// so the work becomes arithmetic: Q·Kᵀ and P·V as register-blocked FMA loops over 8 query vectors
// at a time, with the online softmax (base 2, the query pre-scaled by scale·log2 e) in between.
// All in fp32, like AttendSpans; only the order of the sums differs.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/log.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention512.h"
#include "kernels/cpu/attention_prefill_block.h"
#include "kernels/cpu/simd512.h"

namespace tinyserve {
namespace {

constexpr int kTok = 16;  // tokens per tile
constexpr int kMr = 8;    // query vectors per register block

// Tokens [off, off + n) of a span (n <= 16) -> kt[d][16] (K transposed) and vt[16][d] in fp32;
// token slots n..15 are zero.
void LoadTile(const KvSpan& s, int off, int n, int d, float* kt, float* vt) {
  alignas(64) float krows[kTok * 256];
  for (int j = 0; j < kTok; ++j) {
    float* kr = krows + j * d;
    float* vr = vt + j * d;
    if (j >= n) {
      std::memset(kr, 0, d * sizeof(float));
      std::memset(vr, 0, d * sizeof(float));
      continue;
    }
    WidenKvToken(s, off + j, d, kr, vr);
  }
  for (int c = 0; c < d; c += 16) {
    __m512i v[kTok];
    for (int j = 0; j < kTok; ++j) v[j] = _mm512_castps_si512(_mm512_load_ps(krows + j * d + c));
    Transpose16x16(v);
    for (int i = 0; i < 16; ++i) _mm512_store_ps(kt + (c + i) * kTok, _mm512_castsi512_ps(v[i]));
  }
}

using prefill_block::State;

// One register block of query vectors m0..m0+kMr-1 (those >= m_end are padding) against one
// tile of n tokens at positions j0.. . Query vector m belongs to row m / n_q at position
// pos0 + m / n_q and sees tokens up to it; one that sees none of the tile keeps its state.
void BlockTile(const State& st, int m0, int m_end, int n_q, int d, int64_t pos0, int64_t j0, int n,
               const float* kt, const float* vt) {
  __m512 s[kMr];
  for (int i = 0; i < kMr; ++i) s[i] = _mm512_setzero_ps();
  const float* q = st.q + static_cast<size_t>(m0) * d;
  for (int k = 0; k < d; ++k) {
    const __m512 kv = _mm512_load_ps(kt + k * kTok);
    for (int i = 0; i < kMr; ++i) s[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i * d + k]), kv, s[i]);
  }
  alignas(64) float p[kMr][kTok];
  float alpha[kMr];
  for (int i = 0; i < kMr; ++i) {
    const int m = m0 + i;
    const int64_t limit = m < m_end ? std::min<int64_t>(n, pos0 + m / n_q - j0 + 1) : 0;
    if (limit <= 0) {
      _mm512_store_ps(p[i], _mm512_setzero_ps());
      alpha[i] = 1.0f;
      continue;
    }
    const __mmask16 valid = limit >= kTok ? __mmask16(0xffff) : __mmask16((1u << limit) - 1);
    const __m512 si =
        _mm512_mask_mov_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), valid, s[i]);
    const float m_new = std::max(st.m[m], HMax512(si));
    alpha[i] = std::exp2(st.m[m] - m_new);
    const __m512 pi = Exp2(_mm512_sub_ps(si, _mm512_set1_ps(m_new)));
    st.l[m] = st.l[m] * alpha[i] + HSum512(pi);
    st.m[m] = m_new;
    _mm512_store_ps(p[i], pi);
  }
  // O = O·alpha + P·V, 32 columns at a time (kMr x 2 accumulators).
  for (int c = 0; c < d; c += 32) {
    __m512 acc[kMr][2];
    for (int i = 0; i < kMr; ++i) {
      const float* o = st.o + static_cast<size_t>(m0 + i) * d + c;
      const __m512 a = _mm512_set1_ps(alpha[i]);
      acc[i][0] = _mm512_mul_ps(_mm512_load_ps(o), a);
      acc[i][1] = _mm512_mul_ps(_mm512_load_ps(o + 16), a);
    }
    for (int j = 0; j < n; ++j) {
      const __m512 v0 = _mm512_load_ps(vt + j * d + c), v1 = _mm512_load_ps(vt + j * d + c + 16);
      for (int i = 0; i < kMr; ++i) {
        const __m512 pij = _mm512_set1_ps(p[i][j]);
        acc[i][0] = _mm512_fmadd_ps(pij, v0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(pij, v1, acc[i][1]);
      }
    }
    for (int i = 0; i < kMr; ++i) {
      float* o = st.o + static_cast<size_t>(m0 + i) * d + c;
      _mm512_store_ps(o, acc[i][0]);
      _mm512_store_ps(o + 16, acc[i][1]);
    }
  }
}

}  // namespace

void AttendCausalBlockAvx512(const float* q, int64_t q_stride, int n_rows, int n_q, int d,
                             int64_t pos0, const KvSpan* spans, int n_spans, float scale,
                             float* out, int64_t out_stride) {
  // Queries in base 2: s·log2 e, so that exp(s) = 2^(s·log2 e).
  prefill_block::AttendCausalBlock<kTok, kMr, LoadTile, BlockTile>(
      q, q_stride, n_rows, n_q, d, pos0, spans, n_spans, scale * 1.44269504088896341f, out,
      out_stride);
}

}  // namespace tinyserve
