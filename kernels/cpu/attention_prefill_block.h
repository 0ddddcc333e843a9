// File: kernels/cpu/attention_prefill_block.h
// The driver of the block prefill attention kernels (attention_prefill.cc for AVX-512,
// attention_prefill_avx2.cc for AVX2): a block of rows of one sequence and one GQA group walks
// the prefix once, in tiles of kTok tokens that LoadTile widens to fp32 (K transposed, V as
// rows), and BlockTile runs Q·Kᵀ, the online softmax and P·V for kMr query vectors at a time
// against each tile.
//
// Each ISA file instantiates AttendCausalBlock with the functions of its anonymous namespace,
// so each instantiation is local to the file and compiled for that file's ISA.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/log.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/attention.h"

namespace tinyserve::prefill_block {

// The block's state; each array 64-byte aligned when kMr is a multiple of 8 (32 for 4).
struct State {
  float* q;  // [m_pad][d] queries times scale
  float* o;  // [m_pad][d] unnormalised outputs
  float* m;  // [m_pad] running max
  float* l;  // [m_pad] running sum
};

// LoadTile(span, off, n, d, kt, vt): tokens [off, off + n) of a span into kt and vt (zeros past
// n). BlockTile(state, m0, m_end, n_q, d, pos0, j0, n, kt, vt): query vectors m0..m0 + kMr - 1
// against a tile of n tokens at positions j0.. . `scale` multiplies the queries (scale·log2 e
// for a base-2 softmax).
template <int kTok, int kMr, auto LoadTile, auto BlockTile>
void AttendCausalBlock(const float* q, int64_t q_stride, int n_rows, int n_q, int d, int64_t pos0,
                       const KvSpan* spans, int n_spans, float scale, float* out,
                       int64_t out_stride) {
  TS_CHECK(d % 32 == 0 && d <= 256) << d;
  const int m_total = n_rows * n_q;
  const int m_pad = (m_total + kMr - 1) / kMr * kMr;
  static thread_local AlignedScratch buf;
  const size_t vec = static_cast<size_t>(m_pad) * d;
  float* base = reinterpret_cast<float*>(
      buf.Get((2 * vec + 2 * static_cast<size_t>(m_pad) + 2 * kTok * d) * sizeof(float) + 64));
  State st{base, base + vec, base + 2 * vec, base + 2 * vec + m_pad};
  // kt and vt keep the scratch's alignment: 2·m_pad floats is a multiple of 2·kMr.
  float* kt = base + 2 * vec + 2 * static_cast<size_t>(m_pad);  // [d][kTok]
  float* vt = kt + kTok * d;                                    // [kTok][d]
  for (int m = 0; m < m_pad; ++m) {
    float* dst = st.q + static_cast<size_t>(m) * d;
    if (m >= m_total) {
      std::memset(dst, 0, d * sizeof(float));
    } else {
      const float* src = q + (m / n_q) * q_stride + (m % n_q) * d;
      for (int c = 0; c < d; ++c) dst[c] = src[c] * scale;
    }
    st.m[m] = -std::numeric_limits<float>::infinity();
    st.l[m] = 0.0f;
  }
  std::memset(st.o, 0, vec * sizeof(float));
  const int64_t end = pos0 + n_rows;  // tokens the last row sees
  int64_t j0 = 0;
  for (int sp = 0; sp < n_spans && j0 < end; ++sp) {
    for (int off = 0; off < spans[sp].n && j0 < end;) {
      const int n = static_cast<int>(std::min<int64_t>({kTok, spans[sp].n - off, end - j0}));
      LoadTile(spans[sp], off, n, d, kt, vt);
      // Rows before j0 - pos0 see none of this tile: start at the register block of the first
      // one that does.
      const int m_first = static_cast<int>(std::max<int64_t>(0, j0 - pos0)) * n_q;
      for (int m0 = m_first / kMr * kMr; m0 < m_total; m0 += kMr)
        BlockTile(st, m0, m_total, n_q, d, pos0, j0, n, kt, vt);
      off += n;
      j0 += n;
    }
  }
  for (int m = 0; m < m_total; ++m) {
    const float inv = 1.0f / st.l[m];
    const float* o = st.o + static_cast<size_t>(m) * d;
    float* dst = out + (m / n_q) * out_stride + (m % n_q) * d;
    for (int c = 0; c < d; ++c) dst[c] = o[c] * inv;
  }
}

}  // namespace tinyserve::prefill_block
