// AVX-512 (F, BW, VL, VNNI) kernels (this file is compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c; only called when cpu_features says the CPU has
// them). One 512-bit vector holds a whole group of four blocks (block k in 128-bit lane k);
// vpdpbusd (u8 × s8, four products summed into s32) replaces maddubs + madd. Q8_0 weights are
// made unsigned by adding 128 (xor 0x80) and the integer correction −128·Σq removes it again.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/quant_kernels.h"
#include "kernels/cpu/simd512.h"
#include "kernels/cpu/weight_layout.h"

namespace tinyserve {
namespace {

// MR weight rows against NT token rows. MR·NT independent accumulators keep the FMA pipes
// busy (one row and one token would be one long dependency chain).
template <GgmlType T, int MR, int NT>
void TileDot(const uint8_t* const* rows, int64_t nb, int64_t cols, const uint8_t* const* acts,
             float* out /* [MR][NT] */) {
  constexpr bool kQ8 = T == GgmlType::kQ8_0;
  constexpr int64_t kQsGroup = kQ8 ? 128 : 64;
  const int64_t qs_region = nb * (kQ8 ? 32 : 16);
  const size_t dl_off = ActDlaneOffset(cols), bias_off = ActBiasOffset(cols);
  const size_t ic_off = ActIcorrOffset(cols);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i lane_idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 acc[MR][NT];
  __m128 bacc[MR][NT];
  for (int i = 0; i < MR; ++i)
    for (int t = 0; t < NT; ++t) {
      acc[i][t] = _mm512_setzero_ps();
      bacc[i][t] = _mm_setzero_ps();
    }

  // Group g of four blocks; gs < 4 blocks in the last group of a row (masked loads: the lanes
  // past gs read as zero, and the activations there are zero too).
  auto group = [&](int64_t g, int64_t gs) {
    const bool tail = gs < 4;
    const __mmask64 qmask = tail ? (__mmask64{1} << (16 * gs)) - 1 : ~__mmask64{0};
    const __mmask8 dmask = static_cast<__mmask8>((1u << gs) - 1);
    __m512i wl[MR], wh[MR];
    __m512 dl[MR];
    __m128 bw[MR];
    for (int i = 0; i < MR; ++i) {
      const uint8_t* qs = rows[i] + g * kQsGroup;
      const uint8_t* d = rows[i] + qs_region + 8 * g;
      if constexpr (kQ8) {
        wl[i] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(qmask, qs), x80);
        wh[i] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(qmask, qs + (tail ? 16 * gs : 64)), x80);
      } else {
        const __m512i v = _mm512_maskz_loadu_epi8(qmask, qs);
        wl[i] = _mm512_and_si512(v, m4);
        wh[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
      }
      const __m128 d4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(dmask, d));
      dl[i] = _mm512_permutexvar_ps(lane_idx, _mm512_castps128_ps512(d4));
      if constexpr (T == GgmlType::kQ4_1) {
        bw[i] = _mm_cvtph_ps(_mm_maskz_loadu_epi16(dmask, d + 2 * nb));
      }
    }
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = acts[t] + g * 128;
      const __m512i al = _mm512_load_si512(a), ah = _mm512_load_si512(a + 64);
      const __m512 da = _mm512_load_ps(reinterpret_cast<const float*>(acts[t] + dl_off) + 16 * g);
      // Q4_0 / Q8_0 start from the integer correction (−8 or −128 times the lane's Σq).
      const __m512i p0 = T == GgmlType::kQ4_1
                             ? _mm512_setzero_si512()
                             : _mm512_load_si512(acts[t] + ic_off + 64 * g);
      __m128 ba = _mm_setzero_ps();
      if constexpr (T == GgmlType::kQ4_1) {
        ba = _mm_load_ps(reinterpret_cast<const float*>(acts[t] + bias_off) + 4 * g);
      }
      for (int i = 0; i < MR; ++i) {
        const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p0, wl[i], al), wh[i], ah);
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dl[i], da), acc[i][t]);
        if constexpr (T == GgmlType::kQ4_1) bacc[i][t] = _mm_fmadd_ps(bw[i], ba, bacc[i][t]);
      }
    }
  };

  const int64_t full = nb / 4;
  for (int64_t g = 0; g < full; ++g) group(g, 4);
  if (nb % 4 != 0) group(full, nb % 4);
  for (int i = 0; i < MR; ++i)
    for (int t = 0; t < NT; ++t)
      out[i * NT + t] = HSum512(_mm512_add_ps(acc[i][t], _mm512_zextps128_ps512(bacc[i][t])));
}

template <GgmlType T, int MR>
void RowsTokens(const uint8_t* const* rows, int64_t nb, int64_t cols, const uint8_t* acts,
                size_t act_stride, int64_t t0, int64_t t1, float* y, int64_t ldy, int64_t r) {
  for (int64_t t = t0; t < t1; t += 4) {
    const uint8_t* a[4];
    float out[MR * 4];
    const int nt = static_cast<int>(std::min<int64_t>(4, t1 - t));
    for (int i = 0; i < nt; ++i) a[i] = acts + (t + i) * act_stride;
    switch (nt) {
      case 4: TileDot<T, MR, 4>(rows, nb, cols, a, out); break;
      case 3: TileDot<T, MR, 3>(rows, nb, cols, a, out); break;
      case 2: TileDot<T, MR, 2>(rows, nb, cols, a, out); break;
      default: TileDot<T, MR, 1>(rows, nb, cols, a, out); break;
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < nt; ++j) y[(t + j) * ldy + r + i] = out[i * nt + j];
  }
}

template <GgmlType T>
void GemmSplitT(const uint8_t* w, size_t w_stride, int64_t nrows, int64_t cols,
                const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* y, int64_t ldy) {
  const int64_t nb = cols / 32;
  // Prefetch about 2 KiB ahead in the weight stream (the hardware prefetcher alone leaves
  // single-thread bandwidth on the table).
  const int64_t pf_rows = std::max<int64_t>(1, 2048 / static_cast<int64_t>(w_stride));
  // Decode (one token): 4 rows per tile; batches: 2 rows × 4 tokens.
  constexpr int64_t kMrDecode = 4, kMrBatch = 2;
  const int64_t mr = n_tokens == 1 ? kMrDecode : kMrBatch;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
    const int64_t t1 = std::min(n_tokens, t0 + kTokenBlock);
    int64_t r = 0;
    for (; r + mr <= nrows; r += mr) {
      const uint8_t* rows[4];
      for (int64_t i = 0; i < mr; ++i) rows[i] = w + (r + i) * w_stride;
      if (r + mr + pf_rows <= nrows) {
        const uint8_t* pf = rows[0] + pf_rows * w_stride;
        for (size_t off = 0; off < mr * w_stride; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
      }
      if (mr == kMrDecode) {
        RowsTokens<T, kMrDecode>(rows, nb, cols, acts, act_stride, t0, t1, y, ldy, r);
      } else {
        RowsTokens<T, kMrBatch>(rows, nb, cols, acts, act_stride, t0, t1, y, ldy, r);
      }
    }
    for (; r < nrows; ++r) {
      const uint8_t* rows[1] = {w + r * w_stride};
      RowsTokens<T, 1>(rows, nb, cols, acts, act_stride, t0, t1, y, ldy, r);
    }
  }
}

void GemmSplitAvx512(GgmlType wtype, const uint8_t* w, size_t w_stride, int64_t nrows,
                     int64_t cols, const uint8_t* acts, size_t act_stride, int64_t n_tokens,
                     float* y, int64_t ldy) {
  switch (wtype) {
    case GgmlType::kQ4_0:
      return GemmSplitT<GgmlType::kQ4_0>(w, w_stride, nrows, cols, acts, act_stride, n_tokens, y, ldy);
    case GgmlType::kQ4_1:
      return GemmSplitT<GgmlType::kQ4_1>(w, w_stride, nrows, cols, acts, act_stride, n_tokens, y, ldy);
    default:
      return GemmSplitT<GgmlType::kQ8_0>(w, w_stride, nrows, cols, acts, act_stride, n_tokens, y, ldy);
  }
}

inline __m512 Load16(const float* p, __mmask16 k) { return _mm512_maskz_loadu_ps(k, p); }
inline __m512 Load16(const uint16_t* p, __mmask16 k) {
  return _mm512_maskz_cvtph_ps(0xffff, _mm256_maskz_loadu_epi16(k, p));
}

template <typename W, int NT>
void FloatRowDot(const W* row, int64_t cols, const float* x, float* out) {
  __m512 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 32 <= cols; c += 32) {
    const __m512 w0 = Load16(row + c, 0xffff), w1 = Load16(row + c + 16, 0xffff);
    for (int t = 0; t < NT; ++t) {
      acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * cols + c), acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * cols + c + 16), acc[t][1]);
    }
  }
  for (; c < cols; c += 16) {
    const __mmask16 k = cols - c >= 16 ? 0xffff : static_cast<__mmask16>((1u << (cols - c)) - 1);
    const __m512 w0 = Load16(row + c, k);
    for (int t = 0; t < NT; ++t) acc[t][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(k, x + t * cols + c), acc[t][0]);
  }
  for (int t = 0; t < NT; ++t) out[t] = HSum512(_mm512_add_ps(acc[t][0], acc[t][1]));
}

template <typename W>
void GemmFloat(const W* w, int64_t w_stride, int64_t nrows, int64_t cols, const float* x,
               int64_t n_tokens, float* y, int64_t ldy) {
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
    const int64_t t1 = std::min(n_tokens, t0 + kTokenBlock);
    for (int64_t r = 0; r < nrows; ++r) {
      const W* row = w + r * w_stride;
      for (int64_t t = t0; t < t1; t += 4) {
        float out[4];
        const int nt = static_cast<int>(std::min<int64_t>(4, t1 - t));
        const float* xt = x + t * cols;
        switch (nt) {
          case 4: FloatRowDot<W, 4>(row, cols, xt, out); break;
          case 3: FloatRowDot<W, 3>(row, cols, xt, out); break;
          case 2: FloatRowDot<W, 2>(row, cols, xt, out); break;
          default: FloatRowDot<W, 1>(row, cols, xt, out); break;
        }
        for (int i = 0; i < nt; ++i) y[(t + i) * ldy + r] = out[i];
      }
    }
  }
}

void GemmF32Avx512(const float* w, int64_t w_stride, int64_t nrows, int64_t cols,
                   const float* x, int64_t n_tokens, float* y, int64_t ldy) {
  GemmFloat(w, w_stride, nrows, cols, x, n_tokens, y, ldy);
}

void GemmF16Avx512(const uint16_t* w, int64_t w_stride, int64_t nrows, int64_t cols,
                   const float* x, int64_t n_tokens, float* y, int64_t ldy) {
  GemmFloat(w, w_stride, nrows, cols, x, n_tokens, y, ldy);
}

}  // namespace

const CpuKernels& Avx512CpuKernels() {
  static const CpuKernels k{QuantizeActsAvx2, GemmSplitAvx512, GemmF32Avx512, GemmF16Avx512};
  return k;
}

}  // namespace tinyserve
