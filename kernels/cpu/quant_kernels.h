// File: kernels/cpu/quant_kernels.h
// The per-ISA inner kernels of MatMul (internal to kernels/cpu; MatMul in matmul.h is the API).
//
// Quantized weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, in the split layout of
// weight_layout.h) are multiplied with activations quantized once per call and per token row, the
// llama.cpp scheme: Q8_0 for Q4_0, Q5_0, Q8_0 and IQ4_NL weights, Q8_1 (with its block sum) for
// Q4_1 and Q5_1. Quantized values and scales are
// bit-identical to QuantizeRowQ8_0 / QuantizeRowQ8_1 (dequant.h); only their arrangement
// differs. One token row of activations (ActRowBytes(cols) bytes, 64-byte aligned):
//
//   qs    [G][2][4][16] int8   group g = blocks 4g..4g+3: [low halves][high halves], block k in
//                              16-byte lane k; blocks past nb are zero
//   dlane [G][4][4] float      fp16-rounded d of block k, repeated in the 4 int32 lanes of k
//   icorr [G][4][4] int32      int32 lane 4k+i: c·(Σ of q[4i..4i+3] + q[16+4i..16+4i+3]) of block
//                              k, the elements that lane i of a maddubs+madd or dpbusd sums;
//                              c = ActCorrection(weight type): −8 (Q4_0), −16 (Q5_0), −128
//                              (Q8_0, IQ4_NL), 0 (Q4_1, Q5_1)
//   bias  [G][4] float         Q4_1 / Q5_1: s of block k (fp16-rounded d·Σq, as in Q8_1); else 0
//   with G = ceil(nb / 4), nb = cols / 32; everything past nb is 0.
//
// Per block, with the integer dot P = Σ q_w·q_a over its 32 elements, q_w as the SIMD kernels
// feed it to the unsigned side of maddubs / dpbusd (nibbles 0..15, 5-bit codes 0..31; Q8_0 + 128
// under VNNI):
//   Q4_0: d_w·d_a·(P + icorr)           (= d_w·d_a·Σ (n−8)·q_a; each int32 lane exact)
//   Q5_0: as Q4_0 with n the 5-bit code and −16 for −8
//   Q4_1: d_w·d_a·P + m_w·bias          (= d_w·d_a·Σ n·q_a + m_w·s_a, the ggml formula)
//   Q5_1: as Q4_1 with n the 5-bit code
//   Q8_0: d_w·d_a·Σ q_w·q_a             (VNNI: P over q_w + 128, plus icorr; AVX2: sign trick)
//   IQ4_NL: as Q8_0, q_w the level kIq4nlValues[n] that a byte shuffle looks up per nibble
// and y is the fp32 sum over blocks. The correction is integer and per lane, so every int32
// lane holds exactly Σ q_w·q_a over its eight elements, as llama.cpp's kernels do: no large
// float terms cancel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

// Q4_1 and Q5_1 take Q8_1 activations (with the block sums in bias); the others Q8_0.
inline bool ActsHaveBias(GgmlType wtype) {
  return wtype == GgmlType::kQ4_1 || wtype == GgmlType::kQ5_1;
}
// The c of icorr for weights of type wtype.
inline int ActCorrection(GgmlType wtype) {
  switch (wtype) {
    case GgmlType::kQ4_0:
      return -8;
    case GgmlType::kQ5_0:
      return -16;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return 0;
    default:
      return -128;
  }
}

inline int64_t ActGroups(int64_t cols) { return (cols / 32 + 3) / 4; }
inline size_t ActRowBytes(int64_t cols) {
  return static_cast<size_t>((ActGroups(cols) * 272 + 63) / 64 * 64);
}
inline size_t ActDlaneOffset(int64_t cols) { return static_cast<size_t>(ActGroups(cols) * 128); }
inline size_t ActIcorrOffset(int64_t cols) { return static_cast<size_t>(ActGroups(cols) * 192); }
inline size_t ActBiasOffset(int64_t cols) { return static_cast<size_t>(ActGroups(cols) * 256); }

// A second path for products of many tokens (AMX tile kernels, quant_dot_amx.cc), on split-layout
// weights. It multiplies in bf16 with fp32 accumulation instead of the int8 block dots above, and
// takes its activations in tiles of kTileTokens token rows.
inline constexpr int64_t kTileTokens = 16;
struct TileKernels {
  int64_t min_tokens;                  // MatMul takes this path for n_tokens >= min_tokens
  size_t (*tile_bytes)(int64_t cols);  // one tile of activations (a multiple of 64)
  // Token rows x[0..n) (n <= kTileTokens) -> one tile (bf16); the rows past n are zero.
  void (*convert_tile)(GgmlType wtype, const float* x, int64_t n, int64_t cols, uint8_t* dst);
  // As CpuKernels::gemm_split, with acts = ceil(n_tokens / kTileTokens) tiles, tile_bytes apart.
  void (*gemm_split)(GgmlType wtype, const uint8_t* w, size_t w_stride, int64_t nrows, int64_t cols,
                     const uint8_t* acts, int64_t n_tokens, float* y, int64_t ldy);
};

struct CpuKernels {
  // One token row x[cols] -> dst[ActRowBytes(cols)] for weights of type wtype.
  // REQUIRES: cols % 32 == 0; dst 64-byte aligned.
  void (*quantize_acts)(GgmlType wtype, const float* x, int64_t cols, uint8_t* dst);
  // y[t·ldy + r] = dot(W[r], x[t]) for r < nrows, t < n_tokens. W: split-layout rows, w_stride
  // bytes apart; acts: n_tokens rows from quantize_acts, act_stride bytes apart.
  void (*gemm_split)(GgmlType wtype, const uint8_t* w, size_t w_stride, int64_t nrows,
                     int64_t cols, const uint8_t* acts, size_t act_stride, int64_t n_tokens,
                     float* y, int64_t ldy);
  // Float weights: w rows w_stride elements apart, x [n_tokens][cols].
  void (*gemm_f32)(const float* w, int64_t w_stride, int64_t nrows, int64_t cols, const float* x,
                   int64_t n_tokens, float* y, int64_t ldy);
  void (*gemm_f16)(const uint16_t* w, int64_t w_stride, int64_t nrows, int64_t cols,
                   const float* x, int64_t n_tokens, float* y, int64_t ldy);
  const TileKernels* tiles = nullptr;  // AMX; null on other paths
};

// Calls f(std::integral_constant<GgmlType, T>{}) with T = wtype, one of the split-layout types
// (weight_layout.h); Q8_0 for any other type.
template <typename F>
inline void WithSplitType(GgmlType wtype, F&& f) {
  using G = GgmlType;
  switch (wtype) {
    case G::kQ4_0:
      return f(std::integral_constant<G, G::kQ4_0>{});
    case G::kQ4_1:
      return f(std::integral_constant<G, G::kQ4_1>{});
    case G::kQ5_0:
      return f(std::integral_constant<G, G::kQ5_0>{});
    case G::kQ5_1:
      return f(std::integral_constant<G, G::kQ5_1>{});
    case G::kIQ4_NL:
      return f(std::integral_constant<G, G::kIQ4_NL>{});
    default:
      return f(std::integral_constant<G, G::kQ8_0>{});
  }
}

// The table for an instruction set (REQUIRES: isa <= DetectedCpuIsa()).
const CpuKernels& CpuKernelsFor(CpuIsa isa);

const CpuKernels& ScalarCpuKernels();
#if defined(TINYSERVE_X86_KERNELS)
const CpuKernels& Avx2CpuKernels();
const CpuKernels& Avx512CpuKernels();
// The AVX-512 table plus the AMX tile path (REQUIRES: DetectedCpuIsa() == CpuIsa::kAmx).
const CpuKernels& AmxCpuKernels();
// The AVX2 activation quantizer, shared by the AVX-512 table.
void QuantizeActsAvx2(GgmlType wtype, const float* x, int64_t cols, uint8_t* dst);
#endif

// Test hook: the tile path's dequantization (AMX, quant_dot_amx.cc) of one split-layout row of nb
// blocks to bf16, 64 bytes per block at out (64-byte aligned). It needs AVX512-BF16, not AMX, so
// its tables are checked on CPUs without a tile unit too. False where it cannot run (no AMX
// kernels compiled in, or no AVX512-BF16).
bool DequantRowBf16ForTest(GgmlType type, const uint8_t* split_row, int64_t nb, uint8_t* out);

// Tokens per cache block in gemm_split: activations of this many tokens stay in L1 while
// every row of the range streams past them.
inline constexpr int64_t kTokenBlock = 32;

// Token blocks of at least this many tokens unpack each weight row once into a buffer (the SIMD
// kernels' ExpandRow) instead of once per 4 tokens: +20 % on Q5_0 / Q5_1 products of 16-512
// tokens, +5 % on Q4_1 (bench/matmul_bench, docs/PERFORMANCE.md).
inline constexpr int64_t kExpandMinTokens = 8;

// Products of at least this many tokens take the AMX path where it exists (measured:
// bench/matmul_bench, docs/PERFORMANCE.md).
inline constexpr int64_t kAmxMinTokens = 12;

}  // namespace tinyserve
