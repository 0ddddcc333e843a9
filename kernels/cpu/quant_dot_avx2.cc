// AVX2 + FMA + F16C kernels (this file is compiled with -mavx2 -mfma -mf16c; only called when
// cpu_features says the CPU has them). Integer block dots use maddubs (u8 × s8 -> s16 pairs)
// and madd with ones (-> s32), as llama.cpp does without VNNI.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/cpu/split_tail.h"
#include "kernels/cpu/weight_layout.h"

namespace tinyserve {
namespace {

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int HSumI(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

inline float RoundF16(float v) { return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT)); }

// roundf (ties away from zero), exactly: truncate, then step away from zero when the dropped
// fraction (exact in float) is at least one half. (_mm256_round_ps rounds ties to even, which
// would differ from the reference quantizer on ties.)
inline __m256 RoundHalfAway(__m256 v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
  const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
  return _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ), step));
}

}  // namespace

void QuantizeActsAvx2(GgmlType wtype, const float* x, int64_t cols, uint8_t* dst) {
  const int64_t nb = cols / 32, groups = ActGroups(cols);
  float* dlane = reinterpret_cast<float*>(dst + ActDlaneOffset(cols));
  float* bias = reinterpret_cast<float*>(dst + ActBiasOffset(cols));
  int32_t* icorr = reinterpret_cast<int32_t*>(dst + ActIcorrOffset(cols));
  std::memset(icorr, 0, groups * 64 + groups * 16);  // icorr and bias are adjacent
  if (nb % 4 != 0) {
    std::memset(dst + (groups - 1) * 128, 0, 128);
    std::memset(dlane + (groups - 1) * 16, 0, 64);
  }
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const int bias_mul = ActCorrection(wtype);
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 8 * i);
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
                              _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    // The same scalar operations as QuantizeRowQ8_0 / Q8_1.
    const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(RoundHalfAway(_mm256_mul_ps(v[i], vid)));
    const int sum = HSumI(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, perm);  // 32 int8 in element order
    uint8_t* lo = dst + (b / 4) * 128 + (b % 4) * 16;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo), _mm256_castsi256_si128(p));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + 64), _mm256_extracti128_si256(p, 1));
    const float dr = RoundF16(d);
    _mm_storeu_ps(dlane + 4 * b, _mm_set1_ps(dr));
    if (ActsHaveBias(wtype)) {
      bias[b] = RoundF16(d * sum);
    } else {
      // Sums of 4 consecutive int8 (lanes 0-3: low half, 4-7: high half), then low + high.
      const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), p), _mm256_set1_epi16(1));
      const __m128i lanes = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(icorr + 4 * b), _mm_mullo_epi32(lanes, _mm_set1_epi32(bias_mul)));
    }
  }
}

namespace {

// 32 bits -> 32 bytes: byte j is 0x10 where bit j is set, else 0 (the fifth bit of a Q5 code).
inline __m256i FifthBits(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(0x10));
}

// The weights of one group as the dot products take them, w = {wl0, wl1, wh0, wh1} (blocks 0-1
// and 2-3, elements 0..15 and 16..31): the codes of the 4- and 5-bit types, the int8 values of
// Q8_0 and the IQ4_NL levels. qh: the group's fifth bits (Q5).
template <GgmlType T>
inline void UnpackGroup(const uint8_t* qs, const uint8_t* qh, __m256i* w) {
  if constexpr (T == GgmlType::kQ8_0) {
    for (int k = 0; k < 4; ++k)
      w[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * k));
    return;
  }
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32));
  w[0] = _mm256_and_si256(v0, m4);
  w[1] = _mm256_and_si256(v1, m4);
  w[2] = _mm256_and_si256(_mm256_srli_epi16(v0, 4), m4);
  w[3] = _mm256_and_si256(_mm256_srli_epi16(v1, 4), m4);
  if constexpr (T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1) {  // 64 bits for wl, 64 for wh
    uint32_t bits[4];
    std::memcpy(bits, qh, 16);
    for (int k = 0; k < 4; ++k) w[k] = _mm256_or_si256(w[k], FifthBits(bits[k]));
  }
  if constexpr (T == GgmlType::kIQ4_NL) {  // the levels as int8, then the Q8_0 product
    const __m256i levels = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
    for (int k = 0; k < 4; ++k) w[k] = _mm256_shuffle_epi8(levels, w[k]);
  }
}

// One weight row against NT token rows of activations (NT <= 4). tail: the row's last, partial
// group (LoadTailGroup), or nullptr when nb % 4 == 0. kExpanded: the row's groups come
// unpacked from exp (ExpandRow), its scales still from row and tail.
template <GgmlType T, int NT, bool kExpanded>
void RowDot(const uint8_t* row, int64_t nb, int64_t cols, const TailGroup* tail, const uint8_t* exp,
            const uint8_t* const* acts, float* out) {
  constexpr bool kQ8 = T == GgmlType::kQ8_0;
  constexpr bool kNl = T == GgmlType::kIQ4_NL;  // signed levels
  constexpr bool kBias = T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1;
  const uint8_t* dw = row + SplitScalesOffset(T, nb);
  const uint8_t* qhw = row + nb * 16;
  const uint8_t* mw = dw + 2 * nb;
  const size_t dl_off = ActDlaneOffset(cols), bias_off = ActBiasOffset(cols);
  const size_t ic_off = ActIcorrOffset(cols);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i idx0 = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  const __m256i idx1 = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();

  auto group = [&](const uint8_t* qs, const uint8_t* qh, const uint16_t* d, const uint16_t* m,
                   int64_t g) {
    __m256i w[4];
    if constexpr (kExpanded) {
      for (int k = 0; k < 4; ++k)
        w[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(exp + 128 * g + 32 * k));
    } else {
      UnpackGroup<T>(qs, qh, w);
    }
    const __m256i wl0 = w[0], wl1 = w[1], wh0 = w[2], wh1 = w[3];
    const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(d)));
    const __m256 dl0 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d4), idx0);
    const __m256 dl1 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d4), idx1);
    __m256 bw = _mm256_setzero_ps();
    if constexpr (kBias) {
      bw = _mm256_zextps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m))));
    }
    for (int t = 0; t < NT; ++t) {
      const uint8_t* a = acts[t] + g * 128;
      const __m256i al0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(a));
      const __m256i al1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(a + 32));
      const __m256i ah0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(a + 64));
      const __m256i ah1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(a + 96));
      __m256i p0, p1;
      if constexpr (kQ8 || kNl) {
        // Sign trick: |w| (unsigned) times a with w's sign; |w|·|a| <= 128·127, so a pair of
        // products fits int16.
        auto dot = [&](__m256i w, __m256i av) {
          return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(av, w)), ones);
        };
        p0 = _mm256_add_epi32(dot(wl0, al0), dot(wh0, ah0));
        p1 = _mm256_add_epi32(dot(wl1, al1), dot(wh1, ah1));
      } else {
        // Codes 0..31 times |a| <= 127: two pairs of products still fit int16 (<= 15748).
        p0 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(wl0, al0), _mm256_maddubs_epi16(wh0, ah0)), ones);
        p1 = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(wl1, al1), _mm256_maddubs_epi16(wh1, ah1)), ones);
        if constexpr (!kBias) {
          const int32_t* ic = reinterpret_cast<const int32_t*>(acts[t] + ic_off) + 16 * g;
          p0 = _mm256_add_epi32(p0, _mm256_load_si256(reinterpret_cast<const __m256i*>(ic)));
          p1 = _mm256_add_epi32(p1, _mm256_load_si256(reinterpret_cast<const __m256i*>(ic + 8)));
        }
      }
      const float* dla = reinterpret_cast<const float*>(acts[t] + dl_off) + 16 * g;
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_mul_ps(dl0, _mm256_load_ps(dla)), acc[t]);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_mul_ps(dl1, _mm256_load_ps(dla + 8)), acc[t]);
      if constexpr (kBias) {
        const float* ba = reinterpret_cast<const float*>(acts[t] + bias_off) + 4 * g;
        acc[t] = _mm256_fmadd_ps(bw, _mm256_zextps128_ps256(_mm_load_ps(ba)), acc[t]);
      }
    }
  };

  const int64_t full = nb / 4;
  const int64_t qs_group = kQ8 ? 128 : 64;
  for (int64_t g = 0; g < full; ++g) {
    group(row + g * qs_group, qhw + 16 * g, reinterpret_cast<const uint16_t*>(dw) + 4 * g,
          reinterpret_cast<const uint16_t*>(mw) + 4 * g, g);
  }
  if (tail != nullptr) group(tail->qs, tail->qh, tail->d, tail->m, full);
  for (int t = 0; t < NT; ++t) out[t] = HSum(acc[t]);
}

// A row's groups unpacked once (UnpackGroup; 128 bytes per group, 32-byte aligned), so that a
// block of many tokens does not unpack them again for every 4 tokens.
template <GgmlType T>
void ExpandRow(const uint8_t* row, int64_t nb, const TailGroup* tail, uint8_t* out) {
  const int64_t full = nb / 4;
  __m256i w[4];
  auto store = [&](int64_t g) {
    for (int k = 0; k < 4; ++k)
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 128 * g + 32 * k), w[k]);
  };
  for (int64_t g = 0; g < full; ++g) {
    UnpackGroup<T>(row + 64 * g, row + nb * 16 + 16 * g, w);
    store(g);
  }
  if (tail != nullptr) {
    UnpackGroup<T>(tail->qs, tail->qh, w);
    store(full);
  }
}

template <GgmlType T, bool kExpanded>
void RowTokens(const uint8_t* row, int64_t nb, int64_t cols, const TailGroup* tail,
               const uint8_t* exp, const uint8_t* acts, size_t act_stride, int64_t t0, int64_t t1,
               float* y, int64_t ldy, int64_t r) {
  for (int64_t t = t0; t < t1; t += 4) {
    const uint8_t* a[4];
    float out[4];
    const int nt = static_cast<int>(std::min<int64_t>(4, t1 - t));
    for (int i = 0; i < nt; ++i) a[i] = acts + (t + i) * act_stride;
    switch (nt) {
      case 4:
        RowDot<T, 4, kExpanded>(row, nb, cols, tail, exp, a, out);
        break;
      case 3:
        RowDot<T, 3, kExpanded>(row, nb, cols, tail, exp, a, out);
        break;
      case 2:
        RowDot<T, 2, kExpanded>(row, nb, cols, tail, exp, a, out);
        break;
      default:
        RowDot<T, 1, kExpanded>(row, nb, cols, tail, exp, a, out);
        break;
    }
    for (int i = 0; i < nt; ++i) y[(t + i) * ldy + r] = out[i];
  }
}

template <GgmlType T>
void GemmSplitT(const uint8_t* w, size_t w_stride, int64_t nrows, int64_t cols,
                const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* y, int64_t ldy) {
  const int64_t nb = cols / 32;
  // Prefetch about 2 KiB ahead in the weight stream (the hardware prefetcher alone leaves
  // single-thread bandwidth on the table).
  const int64_t pf_rows = std::max<int64_t>(1, 2048 / static_cast<int64_t>(w_stride));
  TailGroup tail_group;  // the row's partial last group, loaded once per row
  const TailGroup* tail = nb % 4 != 0 ? &tail_group : nullptr;
  if (tail != nullptr) InitTailGroup(&tail_group);
  // Q8_0 is its own unpacked form.
  const bool expand = T != GgmlType::kQ8_0 && n_tokens >= kExpandMinTokens;
  static thread_local AlignedScratch exp_scratch;
  uint8_t* exp_buf = expand ? exp_scratch.Get(static_cast<size_t>(ActGroups(cols)) * 128) : nullptr;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenBlock) {
    const int64_t t1 = std::min(n_tokens, t0 + kTokenBlock);
    const bool expand_block = expand && t1 - t0 >= kExpandMinTokens;
    for (int64_t r = 0; r < nrows; ++r) {
      const uint8_t* row = w + r * w_stride;
      if (r + pf_rows < nrows) {
        const uint8_t* pf = row + pf_rows * w_stride;
        for (size_t off = 0; off < w_stride; off += 64) _mm_prefetch(reinterpret_cast<const char*>(pf + off), _MM_HINT_T0);
      }
      if (tail != nullptr) LoadTailGroup(T, row, nb, &tail_group);
      if constexpr (T != GgmlType::kQ8_0) {
        if (expand_block) {
          ExpandRow<T>(row, nb, tail, exp_buf);
          RowTokens<T, true>(row, nb, cols, tail, exp_buf, acts, act_stride, t0, t1, y, ldy, r);
          continue;
        }
      }
      RowTokens<T, false>(row, nb, cols, tail, nullptr, acts, act_stride, t0, t1, y, ldy, r);
    }
  }
}

void GemmSplitAvx2(GgmlType wtype, const uint8_t* w, size_t w_stride, int64_t nrows, int64_t cols,
                   const uint8_t* acts, size_t act_stride, int64_t n_tokens, float* y, int64_t ldy) {
  WithSplitType(wtype, [&](auto t) {
    GemmSplitT<decltype(t)::value>(w, w_stride, nrows, cols, acts, act_stride, n_tokens, y, ldy);
  });
}

inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline float Load1(float v) { return v; }
inline float Load1(uint16_t v) { return _cvtsh_ss(v); }

// One row against NT tokens; two accumulators per token hide the FMA latency.
template <typename W, int NT>
void FloatRowDot(const W* row, int64_t cols, const float* x, float* out) {
  __m256 acc[NT][2];
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m256 w0 = Load8(row + c), w1 = Load8(row + c + 8);
    for (int t = 0; t < NT; ++t) {
      acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * cols + c), acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * cols + c + 8), acc[t][1]);
    }
  }
  for (int t = 0; t < NT; ++t) {
    float s = HSum(_mm256_add_ps(acc[t][0], acc[t][1]));
    for (int64_t k = c; k < cols; ++k) s += Load1(row[k]) * x[t * cols + k];
    out[t] = s;
  }
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

void GemmF32Avx2(const float* w, int64_t w_stride, int64_t nrows, int64_t cols, const float* x,
                 int64_t n_tokens, float* y, int64_t ldy) {
  GemmFloat(w, w_stride, nrows, cols, x, n_tokens, y, ldy);
}

void GemmF16Avx2(const uint16_t* w, int64_t w_stride, int64_t nrows, int64_t cols,
                 const float* x, int64_t n_tokens, float* y, int64_t ldy) {
  GemmFloat(w, w_stride, nrows, cols, x, n_tokens, y, ldy);
}

}  // namespace

const CpuKernels& Avx2CpuKernels() {
  static const CpuKernels k{QuantizeActsAvx2, GemmSplitAvx2, GemmF32Avx2, GemmF16Avx2};
  return k;
}

}  // namespace tinyserve
