// AVX-512 (F, BW, VL, VNNI) kernels (this file is compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512vnni -mavx2 -mfma -mf16c; only called when cpu_features says the CPU has
// them). One 512-bit vector holds a whole group of four blocks (block k in 128-bit lane k);
// vpdpbusd (u8 × s8, four products summed into s32) replaces maddubs + madd. Q8_0 weights are
// made unsigned by adding 128 (xor 0x80) and the integer correction −128·Σq removes it again.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/cpu/simd512.h"
#include "kernels/cpu/weight_layout.h"

namespace tinyserve {
namespace {

// The weights of group g (gs blocks) of a split row as dpbusd's unsigned operand: wl holds
// elements 0..15 of block k in 128-bit lane k, wh elements 16..31; lanes past gs are zero (masked
// loads). Q8_0 and IQ4_NL values + 128; 4- and 5-bit codes as they are (icorr or the bias
// removes the offset).
template <GgmlType T>
inline void UnpackGroup(const uint8_t* row, int64_t nb, int64_t g, int64_t gs, __m512i* wl,
                        __m512i* wh) {
  constexpr bool kQ8 = T == GgmlType::kQ8_0;
  constexpr bool kNl = T == GgmlType::kIQ4_NL;
  constexpr bool kQ5 = T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1;
  const bool tail = gs < 4;
  const __mmask64 qmask = tail ? (__mmask64{1} << (16 * gs)) - 1 : ~__mmask64{0};
  const __m512i x80 = _mm512_set1_epi8(static_cast<char>(0x80));
  const uint8_t* qs = row + g * (kQ8 ? 128 : 64);
  if constexpr (kQ8) {
    *wl = _mm512_xor_si512(_mm512_maskz_loadu_epi8(qmask, qs), x80);
    *wh = _mm512_xor_si512(_mm512_maskz_loadu_epi8(qmask, qs + (tail ? 16 * gs : 64)), x80);
    return;
  }
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i v = _mm512_maskz_loadu_epi8(qmask, qs);
  *wl = _mm512_and_si512(v, m4);
  *wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
  if constexpr (kNl) {  // the levels + 128, in each 128-bit lane
    const __m512i levels = _mm512_xor_si512(
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues))),
        x80);
    *wl = _mm512_maskz_shuffle_epi8(qmask, levels, *wl);
    *wh = _mm512_maskz_shuffle_epi8(qmask, levels, *wh);
  }
  if constexpr (kQ5) {  // the fifth bits: one per byte of wl, then of wh
    const __m512i x10 = _mm512_set1_epi8(0x10);
    const uint8_t* qh = row + nb * 16 + 16 * g;
    const __mmask16 hmask = static_cast<__mmask16>((1u << (2 * gs)) - 1);
    const __mmask64 lo =
        _cvtu64_mask64(static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_maskz_loadu_epi8(hmask, qh))));
    const __mmask64 hi = _cvtu64_mask64(
        static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_maskz_loadu_epi8(hmask, qh + 2 * gs))));
    *wl = _mm512_mask_add_epi8(*wl, lo, *wl, x10);
    *wh = _mm512_mask_add_epi8(*wh, hi, *wh, x10);
  }
}

// A row's groups unpacked once (UnpackGroup; 128 bytes per group, 64-byte aligned), so that a
// block of many tokens does not unpack them again for every 4 tokens.
template <GgmlType T>
void ExpandRow(const uint8_t* row, int64_t nb, uint8_t* out) {
  for (int64_t g = 0; 4 * g < nb; ++g) {
    __m512i wl, wh;
    UnpackGroup<T>(row, nb, g, std::min<int64_t>(4, nb - 4 * g), &wl, &wh);
    _mm512_store_si512(out + 128 * g, wl);
    _mm512_store_si512(out + 128 * g + 64, wh);
  }
}

// MR weight rows against NT token rows. MR·NT independent accumulators keep the FMA pipes
// busy (one row and one token would be one long dependency chain). kExpanded: the rows' weights
// come from ExpandRow (exp), their scales still from rows.
template <GgmlType T, int MR, int NT, bool kExpanded>
void TileDot(const uint8_t* const* rows, const uint8_t* const* exp, int64_t nb, int64_t cols,
             const uint8_t* const* acts, float* out /* [MR][NT] */) {
  constexpr bool kBias = T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1;
  const int64_t qs_region = SplitScalesOffset(T, nb);  // qs and qh
  const size_t dl_off = ActDlaneOffset(cols), bias_off = ActBiasOffset(cols);
  const size_t ic_off = ActIcorrOffset(cols);
  const __m512i lane_idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 acc[MR][NT];
  __m128 bacc[MR][NT];
  for (int i = 0; i < MR; ++i)
    for (int t = 0; t < NT; ++t) {
      acc[i][t] = _mm512_setzero_ps();
      bacc[i][t] = _mm_setzero_ps();
    }

  // Group g of four blocks; gs < 4 blocks in the last group of a row (the lanes past gs are
  // zero, and the activations there are zero too).
  auto group = [&](int64_t g, int64_t gs) {
    const __mmask8 dmask = static_cast<__mmask8>((1u << gs) - 1);
    __m512i wl[MR], wh[MR];
    __m512 dl[MR];
    __m128 bw[MR];
    for (int i = 0; i < MR; ++i) {
      if constexpr (kExpanded) {
        wl[i] = _mm512_load_si512(exp[i] + 128 * g);
        wh[i] = _mm512_load_si512(exp[i] + 128 * g + 64);
      } else {
        UnpackGroup<T>(rows[i], nb, g, gs, &wl[i], &wh[i]);
      }
      const uint8_t* d = rows[i] + qs_region + 8 * g;
      const __m128 d4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(dmask, d));
      dl[i] = _mm512_permutexvar_ps(lane_idx, _mm512_castps128_ps512(d4));
      if constexpr (kBias) bw[i] = _mm_cvtph_ps(_mm_maskz_loadu_epi16(dmask, d + 2 * nb));
    }
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = acts[t] + g * 128;
      const __m512i al = _mm512_load_si512(a), ah = _mm512_load_si512(a + 64);
      const __m512 da = _mm512_load_ps(reinterpret_cast<const float*>(acts[t] + dl_off) + 16 * g);
      // Types without a bias start from the integer correction (c times the lane's Σq).
      const __m512i p0 =
          kBias ? _mm512_setzero_si512() : _mm512_load_si512(acts[t] + ic_off + 64 * g);
      __m128 ba = _mm_setzero_ps();
      if constexpr (kBias)
        ba = _mm_load_ps(reinterpret_cast<const float*>(acts[t] + bias_off) + 4 * g);
      for (int i = 0; i < MR; ++i) {
        const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(p0, wl[i], al), wh[i], ah);
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dl[i], da), acc[i][t]);
        if constexpr (kBias) bacc[i][t] = _mm_fmadd_ps(bw[i], ba, bacc[i][t]);
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

template <GgmlType T, int MR, bool kExpanded>
void RowsTokens(const uint8_t* const* rows, const uint8_t* const* exp, int64_t nb, int64_t cols,
                const uint8_t* acts, size_t act_stride, int64_t t0, int64_t t1, float* y,
                int64_t ldy, int64_t r) {
  for (int64_t t = t0; t < t1; t += 4) {
    const uint8_t* a[4];
    float out[MR * 4];
    const int nt = static_cast<int>(std::min<int64_t>(4, t1 - t));
    for (int i = 0; i < nt; ++i) a[i] = acts + (t + i) * act_stride;
    switch (nt) {
      case 4:
        TileDot<T, MR, 4, kExpanded>(rows, exp, nb, cols, a, out);
        break;
      case 3:
        TileDot<T, MR, 3, kExpanded>(rows, exp, nb, cols, a, out);
        break;
      case 2:
        TileDot<T, MR, 2, kExpanded>(rows, exp, nb, cols, a, out);
        break;
      default:
        TileDot<T, MR, 1, kExpanded>(rows, exp, nb, cols, a, out);
        break;
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
  // Q8_0 is its own unpacked form (one xor).
  const bool expand = T != GgmlType::kQ8_0 && n_tokens >= kExpandMinTokens;
  const size_t exp_bytes = static_cast<size_t>(ActGroups(cols)) * 128;
  static thread_local AlignedScratch exp_scratch;
  uint8_t* exp_buf = expand ? exp_scratch.Get(kMrBatch * exp_bytes) : nullptr;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
    const int64_t t1 = std::min(n_tokens, t0 + kTokenBlock);
    const bool expand_block = expand && t1 - t0 >= kExpandMinTokens;
    int64_t r = 0;
    for (; r + mr <= nrows; r += mr) {
      const uint8_t* rows[4];
      for (int64_t i = 0; i < mr; ++i) rows[i] = w + (r + i) * w_stride;
      if (r + mr + pf_rows <= nrows) {
        const uint8_t* pf = rows[0] + pf_rows * w_stride;
        for (size_t off = 0; off < mr * w_stride; off += 64)
          _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
      }
      if (expand_block) {
        const uint8_t* exp[kMrBatch];
        for (int64_t i = 0; i < kMrBatch; ++i) {
          ExpandRow<T>(rows[i], nb, exp_buf + i * exp_bytes);
          exp[i] = exp_buf + i * exp_bytes;
        }
        RowsTokens<T, kMrBatch, true>(rows, exp, nb, cols, acts, act_stride, t0, t1, y, ldy, r);
      } else if (mr == kMrDecode) {
        RowsTokens<T, kMrDecode, false>(rows, nullptr, nb, cols, acts, act_stride, t0, t1, y, ldy,
                                        r);
      } else {
        RowsTokens<T, kMrBatch, false>(rows, nullptr, nb, cols, acts, act_stride, t0, t1, y, ldy,
                                       r);
      }
    }
    for (; r < nrows; ++r) {
      const uint8_t* rows[1] = {w + r * w_stride};
      RowsTokens<T, 1, false>(rows, nullptr, nb, cols, acts, act_stride, t0, t1, y, ldy, r);
    }
  }
}

void GemmSplitAvx512(GgmlType wtype, const uint8_t* w, size_t w_stride, int64_t nrows,
                     int64_t cols, const uint8_t* acts, size_t act_stride, int64_t n_tokens,
                     float* y, int64_t ldy) {
  WithSplitType(wtype, [&](auto t) {
    GemmSplitT<decltype(t)::value>(w, w_stride, nrows, cols, acts, act_stride, n_tokens, y, ldy);
  });
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
