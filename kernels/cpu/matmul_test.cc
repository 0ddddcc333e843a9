// Tests of MatMul: every instruction-set path, repacked and ggml layout, 1-3 threads, on odd
// shapes, against two oracles:
//  * SameActsReference: float64 sum over blocks of the llama.cpp formula with activations from
//    the reference quantizers (QuantizeRowQ8_0 / Q8_1). The kernels use bit-identical quantized
//    activations, so the only difference is fp32 rounding and summation order:
//    |y − ref| <= 1e-5 · Σ |d_w·d_a·q_w·q_a| (+ Σ |m_w·s_a| for Q4_1), the usual bound for a
//    reordered float sum of those terms.
//  * MatMulReference (float activations): the difference is the activation quantization error,
//    at most Σ_i |w_i|·d_a(i)/2 (d_a = block amax / 127), about 1e-2 of Σ|w·x| on random data;
//    we check that bound (×1.01 plus 1e-5·Σ|w·x| for rounding).
//  F32 / F16 weights: |y − MatMulReference| <= 1e-5 · Σ|w·x|.
// The AMX tile path (many tokens) multiplies in bf16 instead; its oracles are Bf16Reference
// (Σ bf16(w)·bf16(x) in float64, within fp32 summation error plus one weight rounding to the other
// bf16 neighbour) and the float product within 2^-8 · Σ|w·x| (two bf16 roundings) plus rounding.
#include "kernels/cpu/matmul.h"

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/fp16.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/cpu/weight_layout.h"

namespace tinyserve {
namespace {

std::vector<CpuIsa> AvailableIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAmx})
    if (isa <= DetectedCpuIsa()) out.push_back(isa);
  return out;
}

// Restores the active ISA when a test ends.
class IsaGuard {
 public:
  IsaGuard() : saved_(ActiveCpuIsa()) {}
  ~IsaGuard() { SetActiveCpuIsa(saved_); }

 private:
  CpuIsa saved_;
};

std::vector<float> RandomFloats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& f : v) f = dist(rng);
  return v;
}

// A [rows, cols] matrix of `type` made from random floats (quantized by the reference).
Matrix RandomMatrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  const std::vector<float> f = RandomFloats(rows * cols, seed);
  if (type == GgmlType::kF32) return MatrixFromFloats(f.data(), rows, cols);
  const size_t row_bytes = GgmlRowBytes(type, cols);
  auto bytes = std::make_shared<std::vector<uint8_t>>(row_bytes * rows);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = bytes->data() + r * row_bytes;
    const float* src = f.data() + r * cols;
    switch (type) {
      case GgmlType::kF16:
        for (int64_t c = 0; c < cols; ++c) {
          const fp16_t h = FloatToFp16(src[c]);
          std::memcpy(dst + 2 * c, &h, 2);
        }
        break;
      case GgmlType::kQ4_0:
        QuantizeRowQ4_0(src, dst, cols);
        break;
      case GgmlType::kQ4_1:
        QuantizeRowQ4_1(src, dst, cols);
        break;
      case GgmlType::kQ5_0:
      case GgmlType::kQ5_1:
      case GgmlType::kIQ4_NL: {  // no reference quantizer: random codes, scales near 1/127 (Q5:
                                 // 1/16) and for Q5_1 a min near -1
        const int bb = GetGgmlTypeInfo(type)->block_bytes;
        const float scale = type == GgmlType::kIQ4_NL ? 1.0f / 127 : 1.0f / 16;
        for (int64_t b = 0; b < cols / 32; ++b) {
          uint8_t* blk = dst + bb * b;
          const fp16_t d = FloatToFp16((1.0f + 0.5f * src[32 * b]) * scale);
          const fp16_t m = FloatToFp16(-1.0f + 0.25f * src[32 * b + 1]);
          std::memcpy(blk, &d, 2);
          if (type == GgmlType::kQ5_1) std::memcpy(blk + 2, &m, 2);
          for (int j = 2; j < bb; ++j) {
            if (j < 4 && type == GgmlType::kQ5_1) continue;
            blk[j] =
                static_cast<uint8_t>(std::lround((src[32 * b + j % 32] + 1) * 127.5f) ^ (7 * j));
          }
        }
        break;
      }
      default:
        QuantizeRowQ8_0(src, dst, cols);
        break;
    }
  }
  Matrix m = MatrixView(type, rows, cols, bytes->data());
  m.storage = bytes;
  return m;
}

float F16At(const uint8_t* p) {
  fp16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFloat(h);
}

struct Expected {
  std::vector<double> value;      // [n_tokens][rows]
  std::vector<double> tolerance;  // [n_tokens][rows]
};

// The integer weight q_w of element j of a ggml block: the code (minus 8 or 16 for Q4_0 / Q5_0),
// or the IQ4_NL level.
int GgmlQ(GgmlType type, const uint8_t* blk, int j) {
  auto nibble = [&](int qs) { return j < 16 ? blk[qs + j] & 15 : blk[qs + j - 16] >> 4; };
  auto fifth = [&](int qh) {
    uint32_t bits;
    std::memcpy(&bits, blk + qh, 4);
    return static_cast<int>((bits >> j) & 1) << 4;
  };
  switch (type) {
    case GgmlType::kQ8_0:
      return static_cast<int8_t>(blk[2 + j]);
    case GgmlType::kIQ4_NL:
      return kIq4nlValues[nibble(2)];
    case GgmlType::kQ4_0:
      return nibble(2) - 8;
    case GgmlType::kQ4_1:
      return nibble(4);
    case GgmlType::kQ5_0:
      return (nibble(6) | fifth(2)) - 16;
    default:  // Q5_1
      return nibble(8) | fifth(4);
  }
}

// The llama.cpp formula in float64 with reference-quantized activations (ggml-layout weights).
Expected SameActsReference(const Matrix& w, const float* x, int64_t n_tokens) {
  const int64_t nb = w.cols / 32;
  const bool q81 = w.type == GgmlType::kQ4_1 || w.type == GgmlType::kQ5_1;
  std::vector<uint8_t> xq(nb * 36);
  Expected e{std::vector<double>(n_tokens * w.rows), std::vector<double>(n_tokens * w.rows)};
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (q81) {
      QuantizeRowQ8_1(x + t * w.cols, xq.data(), w.cols);
    } else {
      QuantizeRowQ8_0(x + t * w.cols, xq.data(), w.cols);
    }
    for (int64_t r = 0; r < w.rows; ++r) {
      double sum = 0, mag = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* a = xq.data() + b * (q81 ? 36 : 34);
        const int8_t* qa = reinterpret_cast<const int8_t*>(a + (q81 ? 4 : 2));
        const double da = F16At(a);
        const uint8_t* blk = w.Row(r) + b * GetGgmlTypeInfo(w.type)->block_bytes;
        int64_t p = 0;
        double term_min = 0;
        int64_t pabs = 0;
        for (int j = 0; j < 32; ++j) {
          const int qw = GgmlQ(w.type, blk, j);
          p += qw * qa[j];
          pabs += std::abs(qw * qa[j]);
        }
        if (q81) term_min = static_cast<double>(F16At(blk + 2)) * F16At(a + 2);
        const double scale = F16At(blk) * da;
        sum += scale * static_cast<double>(p) + term_min;
        mag += std::fabs(scale) * static_cast<double>(pabs) + std::fabs(term_min);
      }
      e.value[t * w.rows + r] = sum;
      e.tolerance[t * w.rows + r] = 1e-5 * mag + 1e-30;
    }
  }
  return e;
}

// Float reference with the provable activation-quantization bound (quantized weights) or a
// rounding bound (F32 / F16).
Expected FloatReference(const Matrix& w, const float* x, int64_t n_tokens) {
  Expected e{std::vector<double>(n_tokens * w.rows), std::vector<double>(n_tokens * w.rows)};
  const bool quantized = w.type != GgmlType::kF32 && w.type != GgmlType::kF16;
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    MatrixRowToFloat(w, r, row.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * w.cols;
      double sum = 0, mag = 0, qbound = 0;
      const int64_t n_chunks = quantized ? w.cols / 32 : 1;  // activation blocks
      for (int64_t b = 0; b < n_chunks; ++b) {
        const int64_t c0 = quantized ? b * 32 : 0, c1 = quantized ? c0 + 32 : w.cols;
        double amax = 0, wabs = 0;
        for (int64_t c = c0; c < c1; ++c) {
          sum += static_cast<double>(row[c]) * xt[c];
          mag += std::fabs(static_cast<double>(row[c]) * xt[c]);
          amax = std::max(amax, std::fabs(static_cast<double>(xt[c])));
          wabs += std::fabs(row[c]);
        }
        qbound += wabs * amax / 127 / 2;
      }
      e.value[t * w.rows + r] = sum;
      e.tolerance[t * w.rows + r] = (quantized ? 1.01 * qbound : 0) + 1e-5 * mag + 1e-30;
    }
  }
  return e;
}

// Round to nearest even bf16 (finite inputs).
double RoundBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// The tile path's oracles: [0] the bf16 product, [1] the float product with the bf16 bound.
std::array<Expected, 2> Bf16Reference(const Matrix& w, const float* x, int64_t n_tokens) {
  std::array<Expected, 2> e;
  for (Expected& x : e)
    x = {std::vector<double>(n_tokens * w.rows), std::vector<double>(n_tokens * w.rows)};
  std::vector<float> row(w.cols);
  const double sum_err = static_cast<double>(w.cols) * 0x1p-24;  // fp32 accumulation, worst case
  for (int64_t r = 0; r < w.rows; ++r) {
    MatrixRowToFloat(w, r, row.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * w.cols;
      double sum = 0, exact = 0, mag = 0, big = 0;
      for (int64_t c = 0; c < w.cols; ++c) {
        const double term = RoundBf16(row[c]) * RoundBf16(xt[c]);
        sum += term;
        exact += static_cast<double>(row[c]) * xt[c];
        mag += std::fabs(term);
        big = std::max(big, std::fabs(term));
      }
      e[0].value[t * w.rows + r] = sum;
      e[0].tolerance[t * w.rows + r] = sum_err * mag + 0x1p-8 * big + 1e-30;
      e[1].value[t * w.rows + r] = exact;
      e[1].tolerance[t * w.rows + r] = (0x1p-8 * 1.01 + sum_err) * mag + 1e-30;
    }
  }
  return e;
}

// Counts failures, printing the first few with their configuration.
int Compare(const std::vector<float>& y, const Expected& e, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!(std::fabs(y[i] - e.value[i]) <= e.tolerance[i])) {  // also catches NaN
      if (++bad <= 3) {
        ADD_FAILURE() << what << " index " << i << ": got " << y[i] << ", want " << e.value[i]
                      << " ± " << e.tolerance[i];
      }
    }
  }
  return bad;
}

TEST(MatMul, AllPathsMatchReferencesOnOddShapes) {
  IsaGuard guard;
  std::vector<std::unique_ptr<ThreadPool>> pools;
  for (int n : {1, 2, 3}) pools.push_back(std::make_unique<ThreadPool>(n));
  uint32_t seed = 1;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kF16, GgmlType::kF32}) {
    const bool quantized = HasSplitLayout(type);
    for (int64_t rows : {1, 3, 17, 33, 129}) {
      for (int64_t cols : {32, 96, 576, 1536}) {
        for (int64_t n_tokens : {1, 2, 5, 8, 13, 16, 37}) {
          const Matrix ggml = RandomMatrix(type, rows, cols, ++seed);
          const std::vector<float> x = RandomFloats(n_tokens * cols, ++seed);
          const Expected same = quantized ? SameActsReference(ggml, x.data(), n_tokens) : Expected{};
          const Expected flt = FloatReference(ggml, x.data(), n_tokens);
          std::array<Expected, 2> bf16;  // computed when a case takes the tile path
          for (bool repack : {false, true}) {
            if (repack && !quantized) continue;
            const Matrix w = repack ? RepackToSplit(ggml) : ggml;
            for (CpuIsa isa : AvailableIsas()) {
              SetActiveCpuIsa(isa);
              const TileKernels* tiles = CpuKernelsFor(isa).tiles;
              const bool tile_path = tiles != nullptr && repack && n_tokens >= tiles->min_tokens;
              if (tile_path && bf16[0].value.empty())
                bf16 = Bf16Reference(ggml, x.data(), n_tokens);
              for (auto& pool : pools) {
                const std::string what = std::string(GgmlTypeName(type)) + " " +
                                         std::to_string(rows) + "x" + std::to_string(cols) +
                                         " n=" + std::to_string(n_tokens) + " " +
                                         std::string(CpuIsaName(isa)) +
                                         (repack ? " split" : " ggml") + " threads=" +
                                         std::to_string(pool->num_threads());
                std::vector<float> y(n_tokens * rows, NAN);
                MatMul(w, x.data(), n_tokens, y.data(), pool.get());
                if (tile_path) {
                  if (Compare(y, bf16[0], what + " (tile path) vs bf16") > 0) return;
                  if (Compare(y, bf16[1], what + " (tile path) vs float") > 0) return;
                  continue;
                }
                if (quantized && Compare(y, same, what + " vs same-acts") > 0) return;
                if (Compare(y, flt, what + " vs float") > 0) return;
              }
            }
          }
        }
      }
    }
  }
}

// Row splits must not change any output: each output is computed the same way on any thread.
TEST(MatMul, ThreadedEqualsSingleThreadExactly) {
  IsaGuard guard;
  ThreadPool one(1), two(2), three(3);
  for (GgmlType type :
       {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ8_0, GgmlType::kIQ4_NL, GgmlType::kF32}) {
    const Matrix w0 = RandomMatrix(type, 1000, 576, 7);
    const Matrix w = HasSplitLayout(type) ? RepackToSplit(w0) : w0;
    for (int64_t n_tokens : {1, 40}) {
      const std::vector<float> x = RandomFloats(n_tokens * 576, 8);
      for (CpuIsa isa : AvailableIsas()) {
        SetActiveCpuIsa(isa);
        std::vector<float> y1(n_tokens * 1000), y2(y1.size()), y3(y1.size());
        MatMul(w, x.data(), n_tokens, y1.data(), &one);
        MatMul(w, x.data(), n_tokens, y2.data(), &two);
        MatMul(w, x.data(), n_tokens, y3.data(), &three);
        EXPECT_EQ(y1, y2) << GgmlTypeName(type) << " " << CpuIsaName(isa);
        EXPECT_EQ(y1, y3) << GgmlTypeName(type) << " " << CpuIsaName(isa);
      }
    }
  }
}

// The kernels' activation quantizers give the reference quantizers' bits (values, d, s),
// including ties (x·id exactly k + 0.5), where roundf and round-to-even differ.
TEST(MatMul, ActivationQuantizersMatchReferenceBits) {
  const int64_t cols = 32 * 7;  // a partial last group
  std::vector<float> x = RandomFloats(cols, 3, -3.0f, 3.0f);
  for (int j = 0; j < 32; ++j) x[32 + j] = (j == 0) ? 127.0f : static_cast<float>(j) - 15.5f;
  for (int j = 0; j < 32; ++j) x[64 + j] = 0.0f;  // an all-zero block
  for (GgmlType wtype : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                         GgmlType::kQ8_0, GgmlType::kIQ4_NL}) {
    const bool q81 = ActsHaveBias(wtype);
    std::vector<uint8_t> ref(cols / 32 * 36);
    if (q81) {
      QuantizeRowQ8_1(x.data(), ref.data(), cols);
    } else {
      QuantizeRowQ8_0(x.data(), ref.data(), cols);
    }
    for (CpuIsa isa : AvailableIsas()) {
      alignas(64) uint8_t act[2048];
      ASSERT_LE(ActRowBytes(cols), sizeof(act));
      std::memset(act, 0xAB, sizeof(act));
      CpuKernelsFor(isa).quantize_acts(wtype, x.data(), cols, act);
      const float* dlane = reinterpret_cast<const float*>(act + ActDlaneOffset(cols));
      const float* bias = reinterpret_cast<const float*>(act + ActBiasOffset(cols));
      const int32_t* icorr = reinterpret_cast<const int32_t*>(act + ActIcorrOffset(cols));
      for (int64_t b = 0; b < ActGroups(cols) * 4; ++b) {
        const uint8_t* lo = act + (b / 4) * 128 + (b % 4) * 16;
        if (b >= cols / 32) {  // padding must be zero
          for (int j = 0; j < 16; ++j) EXPECT_EQ(lo[j] | lo[64 + j], 0) << b;
          EXPECT_EQ(dlane[4 * b], 0.0f);
          EXPECT_EQ(bias[b], 0.0f);
          for (int i = 0; i < 4; ++i) EXPECT_EQ(icorr[4 * b + i], 0);
          continue;
        }
        const uint8_t* rb = ref.data() + b * (q81 ? 36 : 34);
        const uint8_t* rq = rb + (q81 ? 4 : 2);
        for (int i = 0; i < 4; ++i) {
          int lane = 0;
          for (int j = 4 * i; j < 4 * i + 4; ++j)
            lane += static_cast<int8_t>(rq[j]) + static_cast<int8_t>(rq[16 + j]);
          EXPECT_EQ(icorr[4 * b + i], ActCorrection(wtype) * lane) << GgmlTypeName(wtype);
        }
        for (int j = 0; j < 16; ++j) {
          EXPECT_EQ(lo[j], rq[j]) << CpuIsaName(isa) << " block " << b << " j " << j;
          EXPECT_EQ(lo[64 + j], rq[16 + j]) << CpuIsaName(isa) << " block " << b << " j " << j + 16;
        }
        for (int i = 0; i < 4; ++i) EXPECT_EQ(dlane[4 * b + i], F16At(rb));
        EXPECT_EQ(bias[b], q81 ? F16At(rb + 2) : 0.0f) << CpuIsaName(isa) << " block " << b;
      }
    }
  }
}

// The tile path's activation tiles (AMX): [nb][16 pair rows][16 tokens][2 bf16], rounded to
// nearest even, tokens past n zero.
TEST(MatMul, TileActivationsAreBf16InBlockOrder) {
  const CpuKernels& k = CpuKernelsFor(DetectedCpuIsa());
  if (k.tiles == nullptr) GTEST_SKIP() << "no tile path (AMX) on this CPU";
  const int64_t cols = 32 * 7, nb = cols / 32;
  const std::vector<float> x = RandomFloats(3 * cols, 5, -3.0f, 3.0f);
  alignas(64) uint8_t tile[8192];
  ASSERT_EQ(k.tiles->tile_bytes(cols), static_cast<size_t>(nb) * 1024);
  std::memset(tile, 0xAB, sizeof(tile));
  k.tiles->convert_tile(GgmlType::kQ4_1, x.data(), 3, cols, tile);
  for (int64_t b = 0; b < nb; ++b) {
    for (int t = 0; t < 16; ++t) {
      for (int j = 0; j < 32; ++j) {
        uint16_t h;
        std::memcpy(&h, tile + b * 1024 + (j / 2) * 64 + t * 4 + (j % 2) * 2, 2);
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        float got;
        std::memcpy(&got, &u, 4);
        const double want = t < 3 ? RoundBf16(x[t * cols + 32 * b + j]) : 0.0;
        ASSERT_EQ(got, want) << "block " << b << " token " << t << " element " << j;
      }
    }
  }
}

// The tile path's bf16 weights (its dequantization, which needs AVX512-BF16 but not AMX): each
// element is the float weight rounded to bf16 (within one bf16 rounding, 2^-8 relative, as the
// Q4_1 / Q5_1 value d·n + m is fused there).
TEST(MatMul, TileWeightsAreTheWeightsInBf16) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ8_0, GgmlType::kIQ4_NL}) {
    for (int64_t cols : {32, 160, 576}) {
      const Matrix split = RepackToSplit(RandomMatrix(type, 1, cols, 23));
      const int64_t nb = cols / 32;
      std::vector<uint8_t> storage(nb * 64 + 64);
      uint8_t* out = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
      if (!DequantRowBf16ForTest(type, split.Row(0), nb, out))
        GTEST_SKIP() << "no AMX kernels compiled in, or no AVX512-BF16 on this CPU";
      std::vector<float> want(cols);
      MatrixRowToFloat(split, 0, want.data());
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t h;
        std::memcpy(&h, out + 2 * c, 2);
        const uint32_t u = static_cast<uint32_t>(h) << 16;
        float got;
        std::memcpy(&got, &u, 4);
        ASSERT_LE(std::fabs(got - want[c]), 0x1p-8 * std::fabs(want[c]) + 1e-30)
            << GgmlTypeName(type) << " cols " << cols << " element " << c << ": " << got << " vs "
            << want[c];
      }
    }
  }
}

TEST(MatMul, SplitLayoutRoundTripsAndSlices) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ8_0, GgmlType::kIQ4_NL}) {
    for (int64_t cols : {32, 160, 576}) {
      const Matrix ggml = RandomMatrix(type, 5, cols, 11);
      const Matrix split = RepackToSplit(ggml);
      EXPECT_EQ(split.layout, MatrixLayout::kSplit);
      EXPECT_EQ(split.row_bytes, ggml.row_bytes);
      const Matrix back = ToGgmlLayout(split);
      EXPECT_EQ(0, std::memcmp(back.data, ggml.data, ggml.row_bytes * ggml.rows));
      std::vector<float> a(cols), b(cols);
      MatrixRowToFloat(ggml, 3, a.data());
      MatrixRowToFloat(split, 3, b.data());
      EXPECT_EQ(a, b);
      const Matrix rows = SliceRows(split, 1, 4);
      EXPECT_EQ(rows.layout, MatrixLayout::kSplit);
      MatrixRowToFloat(rows, 2, b.data());
      EXPECT_EQ(a, b);
      auto cols_slice = SliceCols(split, 0, 32);
      ASSERT_TRUE(cols_slice.ok());
      MatrixRowToFloat(*cols_slice, 3, b.data());
      EXPECT_TRUE(std::equal(b.begin(), b.begin() + 32, a.begin()));
    }
  }
}

TEST(MatMul, PrepareMatrixRepacksByDefault) {
  const Matrix ggml = RandomMatrix(GgmlType::kQ4_1, 4, 64, 5);
  auto prepared = PrepareMatrix(ggml);
  ASSERT_TRUE(prepared.ok());
  EXPECT_EQ(prepared->layout, RepackEnabled() ? MatrixLayout::kSplit : MatrixLayout::kGgml);
}

TEST(CpuFeatures, ClampsToDetected) {
  IsaGuard guard;
  EXPECT_EQ(SetActiveCpuIsa(CpuIsa::kScalar), CpuIsa::kScalar);
  EXPECT_EQ(ActiveCpuIsa(), CpuIsa::kScalar);
  EXPECT_EQ(SetActiveCpuIsa(CpuIsa::kAmx), DetectedCpuIsa());
  EXPECT_EQ(CpuIsaName(CpuIsa::kAvx2), "avx2");
}

}  // namespace
}  // namespace tinyserve
