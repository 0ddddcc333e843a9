// Causal attention for a block of prefill rows on the AMX tile unit. This file is compiled with
// -mamx-tile -mamx-bf16 plus the AVX-512 flags and only called when cpu_features says the CPU
// has them and the OS granted the tile state.
//
// The same walk as attention_prefill.cc (the block's query vectors against the prefix, 32
// tokens at a time, with the online softmax in base 2 between the two products), with both
// products on the tile unit, in fp32 accumulation (TDPBF16PS), transposed so that the softmax
// runs across 16 query vectors per vector register and needs no horizontal reductions:
//   Sᵀ (32 tokens x 16 query vectors) = K · Qᵀ,   Oᵀ (d x 16 query vectors) += Vᵀ · Pᵀ.
// bf16 alone would be coarse (8 significant bits; fp16 keys and llama.cpp's fp16 products have
// 11), so every factor is split in two bf16: x = hi + lo + e, hi = x rounded to bf16 and lo =
// x − hi rounded to bf16 (both to nearest even), which leaves |e| <= 2^-18·|x| (e = 0 for an
// fp16 key or value: 11 bits fit in 16). A product is then hi·hi + lo·hi + hi·lo, three tile
// products, missing only lo·lo and e: about 2^-17 relative per term, unbiased, finer than the
// fp16 of the cache itself. On this VM's Sapphire Rapids it is twice the AVX-512 kernel
// (attention_cpu_bench BM_PrefillBlock); the tile unit is the limit, not the softmax.
//
// Tiles (all 16 rows x 64 bytes, amx_tiles.h): 0-1 C, fp32 16 x 16 (two token halves of Sᵀ, or
// two 16-dim column tiles of Oᵀ); 2-3 and 6-7 A, the hi and lo of two 16 x 32 bf16 row tiles (K
// rows: tokens x dims; Vᵀ rows: dims x tokens); 4-5 B, the hi and lo of Qᵀ or Pᵀ in VNNI pairs
// (pair row kk holds elements 2kk and 2kk+1 of each of the 16 query vectors). Per tile of 32
// tokens the keys and values are split and laid out once, for all the block's query tiles (rows
// x group heads / 16 of them); the queries once per call.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/log.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention512.h"
#include "kernels/cpu/simd512.h"

namespace tinyserve {
namespace {

constexpr int kTok = 32;      // tokens per tile: one bf16 k-step of P·V, two C columns of Q·Kᵀ
constexpr int kQ = 16;        // query vectors per tile
constexpr int kTileB = 1024;  // bytes of one A or B tile

// Word indices for _mm512_permutex2var_epi16 over (a, b), two vectors of 16 float bit patterns
// whose upper halves are bf16 (RoundedBits): in_order, a's 16 then b's 16 (32 elements of one
// row); paired, a0 b0 a1 b1 ... (a VNNI pair row of two rows a and b).
struct WordIndex {
  alignas(64) uint16_t in_order[32];
  alignas(64) uint16_t paired[32];
  WordIndex() {
    for (int i = 0; i < 16; ++i) {
      in_order[i] = static_cast<uint16_t>(2 * i + 1);
      in_order[16 + i] = static_cast<uint16_t>(32 + 2 * i + 1);
      paired[2 * i] = static_cast<uint16_t>(2 * i + 1);
      paired[2 * i + 1] = static_cast<uint16_t>(32 + 2 * i + 1);
    }
  }
};
const WordIndex kWords;

// The bits of x with x rounded to the nearest bf16 (ties to even) in their upper half.
inline __m512i RoundedBits(__m512 x) {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(b, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
}

// x minus its bf16 rounding (exact in fp32), given RoundedBits(x).
inline __m512 Rest(__m512 x, __m512i rounded) {
  return _mm512_sub_ps(
      x, _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(0xffff0000u))));
}

// (a, b) -> the hi and lo bf16 of their 32 values, arranged by idx, at hi and lo.
inline void Split(__m512 a, __m512 b, __m512i idx, uint8_t* hi, uint8_t* lo) {
  const __m512i ra = RoundedBits(a), rb = RoundedBits(b);
  _mm512_store_si512(hi, _mm512_permutex2var_epi16(ra, idx, rb));
  _mm512_store_si512(
      lo, _mm512_permutex2var_epi16(RoundedBits(Rest(a, ra)), idx, RoundedBits(Rest(b, rb))));
}

// C tiles 0 and 1 += A0 (tiles 2 hi, 3 lo) and A1 (6 hi, 7 lo) times B (4 hi, 5 lo), each
// product split-bf16: hi·hi + lo·hi + hi·lo.
inline void SplitProducts(const uint8_t* a0, const uint8_t* a1, const uint8_t* b) {
  _tile_loadd(4, b, 64);
  _tile_loadd(5, b + kTileB, 64);
  _tile_loadd(2, a0, 64);
  _tile_loadd(3, a0 + kTileB, 64);
  _tile_loadd(6, a1, 64);
  _tile_loadd(7, a1 + kTileB, 64);
  _tile_dpbf16ps(0, 2, 4);
  _tile_dpbf16ps(1, 6, 4);
  _tile_dpbf16ps(0, 3, 4);
  _tile_dpbf16ps(1, 7, 4);
  _tile_dpbf16ps(0, 2, 5);
  _tile_dpbf16ps(1, 6, 5);
}

// The spans read as one sequence of tokens.
struct Cursor {
  const KvSpan* spans;
  int sp = 0, off = 0;
};

// One of a tile's 32 token slots: its span and index there (span null: an empty slot, zero).
struct Slot {
  const KvSpan* span;
  int t;
};

// The next n (<= 32) tokens at c -> slots[0, n); slots n..31 empty.
void NextTile(Cursor* c, int n, Slot* slots) {
  for (int i = 0; i < kTok; ++i) {
    if (i >= n) {
      slots[i] = {nullptr, 0};
      continue;
    }
    while (c->off == c->spans[c->sp].n) ++c->sp, c->off = 0;
    slots[i] = {&c->spans[c->sp], c->off++};
  }
}

inline __m512 Row16(const Slot& s, bool value, int c, int d) {
  return s.span != nullptr ? KvRow16(*s.span, value, s.t, c, d) : _mm512_setzero_ps();
}

// The tile's keys -> ka[d/32 k-steps][2 token halves][hi, lo]: K as A tiles (row t: dims
// 32·step .. of token 16·half + t, in order).
void PackKeys(const Slot* slots, int d, uint8_t* ka) {
  const __m512i idx = _mm512_load_si512(kWords.in_order);
  for (int s = 0; s < d / 32; ++s)
    for (int h = 0; h < 2; ++h) {
      uint8_t* hi = ka + (2 * s + h) * 2 * kTileB;
      for (int t = 0; t < 16; ++t) {
        const Slot& slot = slots[16 * h + t];
        Split(Row16(slot, false, 32 * s, d), Row16(slot, false, 32 * s + 16, d), idx, hi + 64 * t,
              hi + kTileB + 64 * t);
      }
    }
}

// The tile's values -> va[d/16 column tiles][hi, lo]: Vᵀ as A tiles (row c: the 32 tokens'
// values at dim 16·tile + c).
void PackValues(const Slot* slots, int d, uint8_t* va) {
  const __m512i idx = _mm512_load_si512(kWords.in_order);
  for (int n = 0; n < d / 16; ++n) {
    __m512i r0[16], r1[16];
    for (int t = 0; t < 16; ++t) {
      r0[t] = _mm512_castps_si512(Row16(slots[t], true, 16 * n, d));
      r1[t] = _mm512_castps_si512(Row16(slots[16 + t], true, 16 * n, d));
    }
    Transpose16x16(r0);
    Transpose16x16(r1);
    uint8_t* hi = va + n * 2 * kTileB;
    for (int c = 0; c < 16; ++c)
      Split(_mm512_castsi512_ps(r0[c]), _mm512_castsi512_ps(r1[c]), idx, hi + 64 * c,
            hi + kTileB + 64 * c);
  }
}

struct State {
  const uint8_t* qb;  // [m_pad / 16][d / 32][hi, lo] B tiles of the pre-scaled queries, Qᵀ
  float* ot;          // [d][m_pad] unnormalised outputs, transposed
  float* m;           // [m_pad] running max (base 2)
  float* l;           // [m_pad] running sum
  int m_pad;
};

// Sᵀ = K·Qᵀ for query tile qt (vectors 16·qt ..) and one packed tile of keys ka: 32 tokens x
// 16 query vectors -> sc.
void Scores(const State& st, int qt, int d, const uint8_t* ka, float (*sc)[kQ]) {
  const int steps = d / 32;
  _tile_zero(0);
  _tile_zero(1);
  for (int s = 0; s < steps; ++s) {
    const uint8_t* k = ka + 2 * s * 2 * kTileB;
    SplitProducts(k, k + 2 * kTileB, st.qb + (qt * steps + s) * 2 * kTileB);
  }
  _tile_stored(0, sc[0], 64);
  _tile_stored(1, sc[16], 64);
}

// The softmax update and Oᵀ += Vᵀ·Pᵀ of query tile qt, given its scores sc against a tile of
// tokens (values va packed). rel: each vector's position relative to the tile's first token
// (-1 for padding); a vector sees the tokens up to its position (never a slot past the real
// tokens: the last row's position is the last real token). One that sees none of the tile gets
// zero weights and keeps its state.
void Accumulate(const State& st, int qt, __m512i rel, int d, const float (*sc)[kQ],
                const uint8_t* va) {
  // The online softmax, 16 query vectors per lane-parallel step: token t's scores are sc[t].
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 row[kTok];
  __m512 m_new = _mm512_load_ps(st.m + qt * kQ);
  for (int t = 0; t < kTok; ++t) {
    const __mmask16 sees = _mm512_cmpge_epi32_mask(rel, _mm512_set1_epi32(t));
    row[t] = _mm512_mask_mov_ps(neg_inf, sees, _mm512_load_ps(sc[t]));
    m_new = _mm512_max_ps(m_new, row[t]);
  }
  const __m512 m_old = _mm512_load_ps(st.m + qt * kQ);
  // Vectors that have seen nothing yet keep max -inf; subtract 0 for them instead (their
  // weights are exp2(-inf) = 0).
  const __mmask16 none = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ);
  const __m512 m_sub = _mm512_mask_mov_ps(m_new, none, _mm512_setzero_ps());
  __m512 sum = _mm512_setzero_ps();
  for (int t = 0; t < kTok; ++t) {
    row[t] = Exp2(_mm512_sub_ps(row[t], m_sub));
    sum = _mm512_add_ps(sum, row[t]);
  }
  const __mmask16 moved = _mm512_cmp_ps_mask(m_new, m_old, _CMP_NEQ_UQ) & ~none;
  __m512 l = _mm512_load_ps(st.l + qt * kQ);
  if (moved != 0) {
    // Some maxima moved: rescale what those vectors have so far (rare after the first tiles).
    const __m512 alpha =
        _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), moved, Exp2(_mm512_sub_ps(m_old, m_sub)));
    l = _mm512_mul_ps(l, alpha);
    for (int c = 0; c < d; ++c) {
      float* o = st.ot + static_cast<size_t>(c) * st.m_pad + qt * kQ;
      _mm512_store_ps(o, _mm512_mul_ps(_mm512_load_ps(o), alpha));
    }
  }
  _mm512_store_ps(st.l + qt * kQ, _mm512_add_ps(l, sum));
  _mm512_store_ps(st.m + qt * kQ, m_new);

  // Pᵀ as B tiles (pair row kk: tokens 2kk, 2kk + 1 of the 16 vectors), then Oᵀ += Vᵀ·Pᵀ, two
  // column tiles of 16 dims at a time, accumulated in the tiles straight from ot.
  alignas(64) uint8_t p[2 * kTileB];
  const __m512i idx = _mm512_load_si512(kWords.paired);
  for (int kk = 0; kk < 16; ++kk)
    Split(row[2 * kk], row[2 * kk + 1], idx, p + 64 * kk, p + kTileB + 64 * kk);
  const auto stride = static_cast<long>(st.m_pad * sizeof(float));
  for (int c = 0; c < d / 16; c += 2) {
    float* o0 = st.ot + static_cast<size_t>(16 * c) * st.m_pad + qt * kQ;
    float* o1 = o0 + static_cast<size_t>(16) * st.m_pad;
    _tile_loadd(0, o0, stride);
    _tile_loadd(1, o1, stride);
    SplitProducts(va + c * 2 * kTileB, va + (c + 1) * 2 * kTileB, p);
    _tile_stored(0, o0, stride);
    _tile_stored(1, o1, stride);
  }
}

}  // namespace

void AttendCausalBlockAmx(const float* q, int64_t q_stride, int n_rows, int n_q, int d,
                          int64_t pos0, const KvSpan* spans, int /*n_spans*/, float scale,
                          float* out, int64_t out_stride) {
  TS_CHECK(d % 32 == 0 && d <= 256) << d;
  const int m_total = n_rows * n_q;
  const int n_qt = (m_total + kQ - 1) / kQ;
  const int m_pad = n_qt * kQ;
  const int steps = d / 32;
  const size_t qb_bytes = static_cast<size_t>(n_qt) * steps * 2 * kTileB;
  const size_t ka_bytes = static_cast<size_t>(steps) * 4 * kTileB;
  const size_t va_bytes = static_cast<size_t>(d / 16) * 2 * kTileB;
  const size_t o_floats = static_cast<size_t>(m_pad) * d;
  static thread_local AlignedScratch buf;
  uint8_t* base =
      buf.Get(qb_bytes + ka_bytes + va_bytes + (o_floats + 3 * static_cast<size_t>(m_pad)) * 4);
  uint8_t* qb = base;
  uint8_t* ka = qb + qb_bytes;
  uint8_t* va = ka + ka_bytes;
  State st{qb, reinterpret_cast<float*>(va + va_bytes), nullptr, nullptr, m_pad};
  st.m = st.ot + o_floats;
  st.l = st.m + m_pad;

  // Queries in base 2 (s·log2 e, so that exp(s) = 2^(s·log2 e)), split and transposed into B
  // tiles: per query tile and k-step, the 16 vectors' rows of 32 bf16 (16 pairs) transposed.
  const float qscale = scale * 1.44269504088896341f;
  const __m512i idx = _mm512_load_si512(kWords.in_order);
  for (int qt = 0; qt < n_qt; ++qt)
    for (int s = 0; s < steps; ++s) {
      uint8_t* hi = qb + (qt * steps + s) * 2 * kTileB;
      for (int r = 0; r < kQ; ++r) {
        const int m = qt * kQ + r;
        __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
        if (m < m_total) {
          const float* src = q + (m / n_q) * q_stride + (m % n_q) * d + 32 * s;
          a = _mm512_mul_ps(_mm512_loadu_ps(src), _mm512_set1_ps(qscale));
          b = _mm512_mul_ps(_mm512_loadu_ps(src + 16), _mm512_set1_ps(qscale));
        }
        Split(a, b, idx, hi + 64 * r, hi + kTileB + 64 * r);
      }
      for (uint8_t* t : {hi, hi + kTileB}) {
        __m512i rows[16];
        for (int r = 0; r < 16; ++r) rows[r] = _mm512_load_si512(t + 64 * r);
        Transpose16x16(rows);
        for (int kk = 0; kk < 16; ++kk) _mm512_store_si512(t + 64 * kk, rows[kk]);
      }
    }
  // The row of each query vector (padding: a row before any token).
  int32_t* row_of = reinterpret_cast<int32_t*>(st.l + m_pad);
  for (int m = 0; m < m_pad; ++m) row_of[m] = m < m_total ? m / n_q : -(1 << 30);
  alignas(64) float sc[2][kTok][kQ];  // scores of two query tiles
  for (int m = 0; m < m_pad; ++m) {
    st.m[m] = -std::numeric_limits<float>::infinity();
    st.l[m] = 0.0f;
  }
  std::memset(st.ot, 0, o_floats * sizeof(float));

  LoadAmxTileConfig();
  Cursor cur{spans};
  Slot slots[kTok];
  const int64_t end = pos0 + n_rows;  // tokens the last row sees
  for (int64_t j0 = 0; j0 < end; j0 += kTok) {
    const int n = static_cast<int>(std::min<int64_t>(kTok, end - j0));
    NextTile(&cur, n, slots);
    PackKeys(slots, d, ka);
    PackValues(slots, d, va);
    // Rows before j0 - pos0 see none of this tile: start at the query tile of the first one
    // that does. The scores of the next query tile are computed before the softmax of this
    // one, so that the tile unit can work on them while the vector units do the softmax.
    const int qt0 = static_cast<int>(std::max<int64_t>(0, j0 - pos0)) * n_q / kQ;
    const __m512i first_row = _mm512_set1_epi32(static_cast<int>(j0 - pos0));
    Scores(st, qt0, d, ka, sc[qt0 & 1]);
    for (int qt = qt0; qt < n_qt; ++qt) {
      if (qt + 1 < n_qt) Scores(st, qt + 1, d, ka, sc[(qt + 1) & 1]);
      // Positions relative to j0 (row - (j0 - pos0); |j0 - pos0| < 2^30), clamped to [-1, 32].
      const __m512i rel = _mm512_min_epi32(
          _mm512_max_epi32(_mm512_sub_epi32(_mm512_load_si512(row_of + qt * kQ), first_row),
                           _mm512_set1_epi32(-1)),
          _mm512_set1_epi32(kTok));
      Accumulate(st, qt, rel, d, sc[qt & 1], va);
    }
  }
  _tile_release();

  // out = Oᵀ transposed back, over l.
  for (int qt = 0; qt < n_qt; ++qt) {
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_load_ps(st.l + qt * kQ));
    for (int c0 = 0; c0 < d; c0 += 16) {
      __m512i rows[16];
      for (int c = 0; c < 16; ++c)
        rows[c] = _mm512_castps_si512(_mm512_mul_ps(
            _mm512_load_ps(st.ot + static_cast<size_t>(c0 + c) * m_pad + qt * kQ), inv));
      Transpose16x16(rows);
      for (int r = 0; r < kQ && qt * kQ + r < m_total; ++r) {
        const int m = qt * kQ + r;
        _mm512_storeu_ps(out + (m / n_q) * out_stride + (m % n_q) * d + c0,
                         _mm512_castsi512_ps(rows[r]));
      }
    }
  }
}

}  // namespace tinyserve
