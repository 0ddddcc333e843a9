// AMX (Intel Advanced Matrix Extensions) kernels for products of many tokens: prefill chunks and
// decode batches. This file is compiled with -mamx-tile -mamx-bf16 -mavx512bf16 plus the
// AVX-512 flags and only called when cpu_features says the CPU has them and the OS granted the
// tile state.
//
// The tile path multiplies in bf16 with fp32 accumulation (TDPBF16PS), not with the int8 block
// dots of the other paths: int8 needs its own product per 32-element block (each block has its
// scales), and moving those 16x16 partial products out of the tiles and scaling them on the
// vector units costs more than the products (an int8 version of this kernel measured 2.6x over
// AVX-512 at 512 tokens; this one 6-7x). In bf16 one tile accumulates the whole row, so the
// tile unit does all the arithmetic:
//   y[t, r] = Σ_i bf16(w[r, i]) · bf16(x[t, i]),  summed in fp32
// with w the dequantized weight (d·n + m, d·(n − 8), d·(n − 16), d·level or d·q, computed in fp32
// and rounded to nearest even) and x the fp32 activations rounded the same way. Each factor is
// within 2^-9 of its value, so |y − Σ w·x| <= (2^-8 + fp32 rounding)·Σ|w·x|. That is tighter than
// the 8-bit activations of the other paths (an element is within amax/254 of its value).
//
// The weights are the A operand (16 rows x 32 elements per tile row, row-major: a dequantized
// row is a tile row as it stands) and the activations the B operand (VNNI pairs: tile row kk
// holds elements 2kk, 2kk+1 of each of 16 tokens), so the only transposes are those of the
// activations, once per call, and of each 16x16 result. Per strip of 32 weight rows the blocks
// are dequantized once into a per-thread buffer (the 4- and 5-bit types through a 16- or 32-entry
// bf16 table per block and vpermw); then blocks of 32 tokens stream past: 2 A x 2 B tiles into 4 C
// tiles, so each tile load feeds two products.
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/log.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/cpu/simd512.h"
#include "kernels/cpu/weight_layout.h"

namespace tinyserve {
namespace {

constexpr int kTile = 16;  // weight rows per A tile, tokens per B tile

// A tile of 16 token rows: [nb][16 pair rows kk][16 tokens][2 bf16], one block of 32 elements per
// 1 KiB (a B operand as it stands). Tokens past the real ones are zero.
size_t AmxTileBytes(int64_t cols) { return static_cast<size_t>(cols / 32) * 1024; }

// 32 floats -> 32 bf16 in order (round to nearest even).
inline __m512i ToBf16(const float* x) {
  return reinterpret_cast<__m512i>(
      _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
}

// Token rows x[0..n) -> one activation tile: each block's 16 x 16 dwords (token, pair) transposed.
void ConvertTileAmx(GgmlType, const float* x, int64_t n, int64_t cols, uint8_t* dst) {
  const int64_t nb = cols / 32;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i v[kTile];
    for (int64_t t = 0; t < kTile; ++t)
      v[t] = t < n ? ToBf16(x + t * cols + 32 * b) : _mm512_setzero_si512();
    Transpose16x16(v);
    for (int kk = 0; kk < kTile; ++kk) _mm512_store_si512(dst + b * 1024 + kk * 64, v[kk]);
  }
}

// Tiles (LoadAmxTileConfig: all 16 rows of 64 bytes) 0-3: C (16 weight rows x 16 tokens fp32;
// tile 2i + j = row tile i, token tile j); 4-5: A (16 weight rows x 32 bf16); 6-7: B (16 pair
// rows x 16 tokens).

// nb fp16 values at src -> floats at dst.
void ScalesToFloat(const uint8_t* src, int64_t nb, float* dst) {
  for (int64_t b = 0; b < nb; b += 16) {
    const __mmask16 m = nb - b >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nb - b)) - 1);
    _mm512_mask_storeu_ps(dst + b, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + 2 * b)));
  }
}

// Block b of a split-layout row as 32 bf16 in element order. d, m: the row's scales as floats.
template <GgmlType T>
inline __m512i DequantBlock(const uint8_t* row, int64_t nb, int64_t b, const float* d,
                            const float* m) {
  const __m512 vd = _mm512_set1_ps(d[b]);
  if constexpr (T == GgmlType::kQ8_0) {
    __m512 lo, hi;
    const int64_t g = b / 4, gs = std::min<int64_t>(4, nb - 4 * g);
    const uint8_t* q = row + 128 * g + 16 * (b % 4);
    lo = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
    hi = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * gs))));
    lo = _mm512_mul_ps(lo, vd);
    hi = _mm512_mul_ps(hi, vd);
    return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  } else {
    // The block's 16 (Q5: 32) possible values in bf16, looked up by its codes.
    constexpr bool kQ5 = T == GgmlType::kQ5_0 || T == GgmlType::kQ5_1;
    const __m512 n = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();  // codes 0..15, 16..31
    if constexpr (T == GgmlType::kQ4_0) {
      lo = _mm512_mul_ps(_mm512_sub_ps(n, _mm512_set1_ps(8)), vd);
    } else if constexpr (T == GgmlType::kQ5_0) {
      lo = _mm512_mul_ps(_mm512_sub_ps(n, _mm512_set1_ps(16)), vd);
      hi = _mm512_mul_ps(n, vd);
    } else if constexpr (T == GgmlType::kIQ4_NL) {
      const __m512 levels = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4nlValues))));
      lo = _mm512_mul_ps(levels, vd);
    } else {  // Q4_1, Q5_1
      lo = _mm512_fmadd_ps(n, vd, _mm512_set1_ps(m[b]));
      if constexpr (kQ5)
        hi = _mm512_fmadd_ps(_mm512_add_ps(n, _mm512_set1_ps(16)), vd, _mm512_set1_ps(m[b]));
    }
    const __m512i table = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * b));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m256i nib =
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    __m512i idx = _mm512_cvtepu8_epi16(nib);
    if constexpr (kQ5) {  // bit j of the block's qh: element j's code + 16
      const int64_t g = b / 4, k = b % 4, gs = std::min<int64_t>(4, nb - 4 * g);
      const uint8_t* qh = row + nb * 16 + 16 * g + 2 * k;
      uint16_t bits_lo, bits_hi;
      std::memcpy(&bits_lo, qh, 2);
      std::memcpy(&bits_hi, qh + 2 * gs, 2);
      const __mmask32 fifth = _cvtu32_mask32(bits_lo | (static_cast<uint32_t>(bits_hi) << 16));
      idx = _mm512_mask_add_epi16(idx, fifth, idx, _mm512_set1_epi16(16));
    }
    return _mm512_permutexvar_epi16(idx, table);
  }
}

// Rows [0, n) of a split-layout matrix, dequantized to bf16 -> rows[n][nb][64 bytes] (an A tile
// of block b is 16 rows of it at stride nb·64). Rows are walked front to back, one stream each
// (walking 16 rows block by block waits on 16 cache misses per block); the rows of the next
// strip (prefetch, n_prefetch of them) are prefetched meanwhile. scales: 2·nb floats of scratch.
template <GgmlType T>
void DequantRows(const uint8_t* w, size_t w_stride, int64_t n, int64_t nb, uint8_t* rows,
                 float* scales, const uint8_t* prefetch, int64_t n_prefetch) {
  const int64_t qs_region = SplitScalesOffset(T, nb);  // qs and qh
  float* d = scales;
  float* m = scales + nb;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* row = w + i * w_stride;
    ScalesToFloat(row + qs_region, nb, d);
    if constexpr (T == GgmlType::kQ4_1 || T == GgmlType::kQ5_1)
      ScalesToFloat(row + qs_region + 2 * nb, nb, m);
    uint8_t* out = rows + i * nb * 64;
    for (int64_t b = 0; b < nb; ++b)
      _mm512_store_si512(out + 64 * b, DequantBlock<T>(row, nb, b, d, m));
    if (i < n_prefetch) {
      const char* p = reinterpret_cast<const char*>(prefetch + i * w_stride);
      for (size_t off = 0; off < w_stride; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
    }
  }
}

// C tile (16 weight rows x 16 tokens) -> y[t·ldy + r] for t < nt, r < nr.
inline void StoreTransposed(const float* c, int64_t nr, int64_t nt, float* y, int64_t ldy) {
  __m512i v[kTile];
  for (int i = 0; i < kTile; ++i) v[i] = _mm512_load_si512(c + 16 * i);
  Transpose16x16(v);  // v[t] = the 16 rows of token t
  const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
  for (int64_t t = 0; t < nt; ++t)
    _mm512_mask_storeu_ps(y + t * ldy, mask, _mm512_castsi512_ps(v[t]));
}

// Up to 32 weight rows (A tiles from a0, a1, at stride a_stride) against up to 32 tokens (B
// tiles b0, b1): kTwoA / kTwoB say whether the second tile exists; nr0/nr1 rows and nt0/nt1
// tokens are real.
template <bool kTwoA, bool kTwoB>
void Block(const uint8_t* a0, const uint8_t* a1, long a_stride, const uint8_t* b0,
           const uint8_t* b1, int64_t nb, int64_t nr0, int64_t nr1, int64_t nt0, int64_t nt1,
           float* y, int64_t ldy) {
  _tile_zero(0);
  if constexpr (kTwoB) _tile_zero(1);
  if constexpr (kTwoA) _tile_zero(2);
  if constexpr (kTwoA && kTwoB) _tile_zero(3);
  for (int64_t b = 0; b < nb; ++b) {
    _tile_loadd(4, a0 + b * 64, a_stride);
    _tile_loadd(6, b0 + b * 1024, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kTwoB) {
      _tile_loadd(7, b1 + b * 1024, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kTwoA) {
      _tile_loadd(5, a1 + b * 64, a_stride);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kTwoB) _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float c[kTile * kTile];
  _tile_stored(0, c, 64);
  StoreTransposed(c, nr0, nt0, y, ldy);
  if constexpr (kTwoB) {
    _tile_stored(1, c, 64);
    StoreTransposed(c, nr0, nt1, y + kTile * ldy, ldy);
  }
  if constexpr (kTwoA) {
    _tile_stored(2, c, 64);
    StoreTransposed(c, nr1, nt0, y + kTile, ldy);
  }
  if constexpr (kTwoA && kTwoB) {
    _tile_stored(3, c, 64);
    StoreTransposed(c, nr1, nt1, y + kTile * ldy + kTile, ldy);
  }
}

template <GgmlType T>
void GemmT(const uint8_t* w, size_t w_stride, int64_t nrows, int64_t cols, const uint8_t* acts,
           int64_t n_tokens, float* y, int64_t ldy) {
  const int64_t nb = cols / 32;
  const size_t tile_bytes = AmxTileBytes(cols);
  const size_t row_bytes = static_cast<size_t>(nb) * 64;  // one dequantized row
  static thread_local AlignedScratch buf;
  uint8_t* rows = buf.Get(2 * kTile * row_bytes + 2 * nb * sizeof(float));  // 32 rows, scales
  float* scales = reinterpret_cast<float*>(rows + 2 * kTile * row_bytes);
  const auto a_stride = static_cast<long>(row_bytes);
  LoadAmxTileConfig();
  for (int64_t r = 0; r < nrows; r += 2 * kTile) {
    const int64_t nr = std::min<int64_t>(2 * kTile, nrows - r);
    const int64_t nr0 = std::min<int64_t>(kTile, nr), nr1 = nr - nr0;
    const int64_t next = std::clamp<int64_t>(nrows - r - 2 * kTile, 0, 2 * kTile);
    // In a last, partial strip the A tiles also read the rows past nr (left from an earlier
    // strip, or never written): they only reach C rows that are not stored.
    DequantRows<T>(w + r * w_stride, w_stride, nr, nb, rows, scales, w + (r + 2 * kTile) * w_stride,
                   next);
    const uint8_t* a0 = rows;
    const uint8_t* a1 = rows + kTile * row_bytes;
    for (int64_t t = 0; t < n_tokens; t += 2 * kTile) {
      const int64_t nt0 = std::min<int64_t>(kTile, n_tokens - t);
      const int64_t nt1 = std::clamp<int64_t>(n_tokens - t - kTile, 0, kTile);
      const uint8_t* b0 = acts + (t / kTile) * tile_bytes;
      const uint8_t* b1 = b0 + tile_bytes;
      float* yt = y + t * ldy + r;
      if (nr1 > 0 && nt1 > 0) {
        Block<true, true>(a0, a1, a_stride, b0, b1, nb, nr0, nr1, nt0, nt1, yt, ldy);
      } else if (nr1 > 0) {
        Block<true, false>(a0, a1, a_stride, b0, b1, nb, nr0, nr1, nt0, nt1, yt, ldy);
      } else if (nt1 > 0) {
        Block<false, true>(a0, a1, a_stride, b0, b1, nb, nr0, nr1, nt0, nt1, yt, ldy);
      } else {
        Block<false, false>(a0, a1, a_stride, b0, b1, nb, nr0, nr1, nt0, nt1, yt, ldy);
      }
    }
  }
  _tile_release();
}

void GemmSplitAmx(GgmlType wtype, const uint8_t* w, size_t w_stride, int64_t nrows, int64_t cols,
                  const uint8_t* acts, int64_t n_tokens, float* y, int64_t ldy) {
  WithSplitType(wtype, [&](auto t) {
    GemmT<decltype(t)::value>(w, w_stride, nrows, cols, acts, n_tokens, y, ldy);
  });
}

}  // namespace

bool DequantRowBf16ForTest(GgmlType type, const uint8_t* split_row, int64_t nb, uint8_t* out) {
  unsigned eax, ebx, ecx, edx;  // AVX512-BF16: CPUID leaf 7, sub-leaf 1, EAX bit 5
  if (!__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) || (eax & (1u << 5)) == 0 ||
      DetectedCpuIsa() < CpuIsa::kAvx512) {
    return false;
  }
  std::vector<float> scales(static_cast<size_t>(2 * nb));
  WithSplitType(type, [&](auto t) {
    DequantRows<decltype(t)::value>(split_row, 0, 1, nb, out, scales.data(), split_row, 0);
  });
  return true;
}

const CpuKernels& AmxCpuKernels() {
  static const TileKernels tiles{kAmxMinTokens, AmxTileBytes, ConvertTileAmx, GemmSplitAmx};
  static const CpuKernels k = [] {
    CpuKernels out = Avx512CpuKernels();
    out.tiles = &tiles;
    return out;
  }();
  return k;
}

}  // namespace tinyserve
