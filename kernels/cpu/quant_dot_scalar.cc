// Scalar kernels: the portable fallback and the semantics the SIMD kernels must match.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/fp16.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/quant_kernels.h"
#include "kernels/cpu/weight_layout.h"

namespace tinyserve {
namespace {

void QuantizeActsScalar(GgmlType wtype, const float* x, int64_t cols, uint8_t* dst) {
  const int64_t nb = cols / 32, groups = ActGroups(cols);
  std::memset(dst, 0, ActRowBytes(cols));
  float* dlane = reinterpret_cast<float*>(dst + ActDlaneOffset(cols));
  float* bias = reinterpret_cast<float*>(dst + ActBiasOffset(cols));
  int32_t* icorr = reinterpret_cast<int32_t*>(dst + ActIcorrOffset(cols));
  (void)groups;
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    // Same operations as QuantizeRowQ8_0 / Q8_1, so the same bits.
    const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
    int8_t* lo = reinterpret_cast<int8_t*>(dst + (b / 4) * 128 + (b % 4) * 16);
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int8_t q = static_cast<int8_t>(std::roundf(x[j] * id));
      (j < 16 ? lo[j] : lo[64 + j - 16]) = q;
      sum += q;
    }
    const float dr = Fp16ToFloat(FloatToFp16(d));
    for (int i = 0; i < 4; ++i) dlane[4 * b + i] = dr;
    if (ActsHaveBias(wtype)) {
      bias[b] = Fp16ToFloat(FloatToFp16(d * sum));
    } else {
      const int c = ActCorrection(wtype);
      for (int i = 0; i < 4; ++i) {
        int lane = 0;
        for (int j = 4 * i; j < 4 * i + 4; ++j) lane += lo[j] + lo[64 + j];
        icorr[4 * b + i] = c * lane;
      }
    }
  }
}

// Weight value q_w of element j of block b (as the integer the block stores, the code minus 8
// or 16 for Q4_0 / Q5_0 so that no bias is needed; the level for IQ4_NL).
inline int WeightQ(GgmlType type, const uint8_t* row, int64_t nb, int64_t b, int j) {
  const int64_t g = b / 4, k = b % 4, gs = std::min<int64_t>(4, nb - 4 * g);
  if (type == GgmlType::kQ8_0) {
    const uint8_t* p = row + g * 128 + (j < 16 ? k * 16 + j : gs * 16 + k * 16 + j - 16);
    return static_cast<int8_t>(*p);
  }
  const uint8_t byte = row[b * 16 + (j & 15)];
  int n = j < 16 ? (byte & 15) : (byte >> 4);
  if (SplitQhBytes(type) != 0) {  // the fifth bit: low or high half of the group's qh
    const uint8_t* qh = row + nb * 16 + g * 16 + (j < 16 ? 0 : 2 * gs) + 2 * k;
    const int bit = (j & 15);
    n |= ((qh[bit / 8] >> (bit % 8)) & 1) << 4;
  }
  switch (type) {
    case GgmlType::kIQ4_NL:
      return kIq4nlValues[n];
    case GgmlType::kQ4_0:
      return n - 8;
    case GgmlType::kQ5_0:
      return n - 16;
    default:
      return n;
  }
}

void GemmSplitScalar(GgmlType wtype, const uint8_t* w, size_t w_stride, int64_t nrows,
                     int64_t cols, const uint8_t* acts, size_t act_stride, int64_t n_tokens,
                     float* y, int64_t ldy) {
  const int64_t nb = cols / 32;
  const int64_t scales = SplitScalesOffset(wtype, nb);
  for (int64_t r = 0; r < nrows; ++r) {
    const uint8_t* row = w + r * w_stride;
    const uint8_t* dw = row + scales;
    const uint8_t* mw = dw + 2 * nb;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const uint8_t* a = acts + t * act_stride;
      const float* dlane = reinterpret_cast<const float*>(a + ActDlaneOffset(cols));
      const float* bias = reinterpret_cast<const float*>(a + ActBiasOffset(cols));
      float acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const int8_t* lo = reinterpret_cast<const int8_t*>(a + (b / 4) * 128 + (b % 4) * 16);
        int p = 0;
        for (int j = 0; j < 16; ++j) p += WeightQ(wtype, row, nb, b, j) * lo[j];
        for (int j = 16; j < 32; ++j) p += WeightQ(wtype, row, nb, b, j) * lo[64 + j - 16];
        fp16_t d16, m16;
        std::memcpy(&d16, dw + 2 * b, 2);
        acc += Fp16ToFloat(d16) * dlane[4 * b] * static_cast<float>(p);
        if (ActsHaveBias(wtype)) {
          std::memcpy(&m16, mw + 2 * b, 2);
          acc += Fp16ToFloat(m16) * bias[b];
        }
      }
      y[t * ldy + r] = acc;
    }
  }
}

template <typename W, typename Load>
void GemmFloatScalar(const W* w, int64_t w_stride, int64_t nrows, int64_t cols, const float* x,
                     int64_t n_tokens, float* y, int64_t ldy, Load load) {
  for (int64_t r = 0; r < nrows; ++r) {
    const W* row = w + r * w_stride;
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * cols;
      float acc = 0;
      for (int64_t c = 0; c < cols; ++c) acc += load(row[c]) * xt[c];
      y[t * ldy + r] = acc;
    }
  }
}

void GemmF32Scalar(const float* w, int64_t w_stride, int64_t nrows, int64_t cols,
                   const float* x, int64_t n_tokens, float* y, int64_t ldy) {
  GemmFloatScalar(w, w_stride, nrows, cols, x, n_tokens, y, ldy, [](float v) { return v; });
}

void GemmF16Scalar(const uint16_t* w, int64_t w_stride, int64_t nrows, int64_t cols,
                   const float* x, int64_t n_tokens, float* y, int64_t ldy) {
  GemmFloatScalar(w, w_stride, nrows, cols, x, n_tokens, y, ldy,
                  [](uint16_t v) { return Fp16ToFloat(v); });
}

}  // namespace

const CpuKernels& ScalarCpuKernels() {
  static const CpuKernels k{QuantizeActsScalar, GemmSplitScalar, GemmF32Scalar, GemmF16Scalar};
  return k;
}

}  // namespace tinyserve
