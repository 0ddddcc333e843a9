#include "kernels/cpu/dequant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fp16.h"

namespace tinyserve {
namespace {

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float LoadF16(const uint8_t* p) { return Fp16ToFloat(LoadU16(p)); }
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void StoreF16(uint8_t* p, float f) {
  const fp16_t h = FloatToFp16(f);
  std::memcpy(p, &h, 2);
}

void DequantQ4_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b), m = LoadF16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void DequantQ5_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint32_t qh = LoadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>(((qs[j] & 0xF) | h0) - 16) * d;
    y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
  }
}

void DequantQ5_1(const uint8_t* b, float* y) {
  const float d = LoadF16(b), m = LoadF16(b + 2);
  const uint32_t qh = LoadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int h0 = ((qh >> j) & 1) << 4, h1 = ((qh >> (j + 16)) & 1) << 4;
    y[j] = static_cast<float>((qs[j] & 0xF) | h0) * d + m;
    y[j + 16] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
  }
}

void DequantQ8_0(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

void DequantQ4_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b), dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    ScaleMinK4(2 * c, scales, &sc0, &m0);
    ScaleMinK4(2 * c + 1, scales, &sc1, &m1);
    const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = d0 * (qs[32 * c + l] & 0xF) - mm0;
      y[64 * c + 32 + l] = d1 * (qs[32 * c + l] >> 4) - mm1;
    }
  }
}

void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = LoadF16(b + 208);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* l_ = ql + 64 * h;
    const uint8_t* h_ = qh + 32 * h;
    const int8_t* s_ = sc + 8 * h;
    float* out = y + 128 * h;
    for (int l = 0; l < 32; ++l) {
      const int i = l / 16;
      const int q1 = static_cast<int>((l_[l] & 0xF) | (((h_[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int>((l_[l + 32] & 0xF) | (((h_[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int>((l_[l] >> 4) | (((h_[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int>((l_[l + 32] >> 4) | (((h_[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * s_[i] * q1;
      out[l + 32] = d * s_[i + 2] * q2;
      out[l + 64] = d * s_[i + 4] * q3;
      out[l + 96] = d * s_[i + 6] * q4;
    }
  }
}

void DequantQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  const float d = LoadF16(b + 80), dmin = LoadF16(b + 82);
  int is = 0;
  for (int n = 0; n < 2; ++n, q += 32) {
    for (int shift = 0; shift < 8; shift += 2) {
      for (int half = 0; half < 2; ++half, ++is) {
        const float dl = d * static_cast<float>(scales[is] & 0xF);
        const float ml = dmin * static_cast<float>(scales[is] >> 4);
        for (int l = 0; l < 16; ++l)
          *y++ = dl * static_cast<float>((q[16 * half + l] >> shift) & 3) - ml;
      }
    }
  }
}

void DequantQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* q = b + 32;
  const uint8_t* s = b + 96;
  const float d = LoadF16(b + 108);
  // 16 6-bit scales: low nibbles in s[0..7] (sub-blocks 0-7 low, 8-15 high), top two bits in
  // s[8..11] (sub-block j's at bits 2·(j / 4) of s[8 + j % 4]).
  int scales[16];
  for (int j = 0; j < 16; ++j)
    scales[j] =
        (((s[j % 8] >> (4 * (j / 8))) & 0xF) | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
  int is = 0, bit = 0;
  for (int n = 0; n < 2; ++n, q += 32) {
    for (int shift = 0; shift < 8; shift += 2, ++bit) {
      for (int half = 0; half < 2; ++half, ++is) {
        const float dl = d * static_cast<float>(scales[is]);
        for (int l = 0; l < 16; ++l) {
          const int i = 16 * half + l;
          const int v = ((q[i] >> shift) & 3) - (((hmask[i] >> bit) & 1) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
    }
  }
}

void DequantQ5_K(const uint8_t* b, float* y) {
  const float d = LoadF16(b), dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  for (int c = 0; c < 4; ++c, ql += 32) {
    int sc0, m0, sc1, m1;
    ScaleMinK4(2 * c, scales, &sc0, &m0);
    ScaleMinK4(2 * c + 1, scales, &sc1, &m1);
    const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
    for (int l = 0; l < 32; ++l) {
      const int lo = (ql[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
      const int hi = (ql[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
      y[64 * c + l] = d0 * static_cast<float>(lo) - mm0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(hi) - mm1;
    }
  }
}

void DequantIQ4_NL(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
    y[j + 16] = d * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
  }
}

void DequantIQ4_XS(const uint8_t* b, float* y) {
  const float d = LoadF16(b);
  const uint16_t scales_h = LoadU16(b + 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
    const int ls =
        ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nlValues[qs[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(kIq4nlValues[qs[j] >> 4]);
    }
  }
}

}  // namespace

absl::Status DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  const GgmlTypeInfo* info = GetGgmlTypeInfo(type);
  if (info == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize: unsupported type code ", static_cast<uint32_t>(type)));
  if (n % info->block_size != 0)
    return absl::InvalidArgumentError(absl::StrCat("dequantize: ", n, " elements is not a multiple of the ",
                                                   std::string(info->name), " block size ", info->block_size));
  const uint8_t* p = static_cast<const uint8_t*>(src);
  const int64_t nb = n / info->block_size;
  switch (type) {
    case GgmlType::kF32: std::memcpy(dst, p, n * 4); break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadF16(p + 2 * i);
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(LoadU16(p + 2 * i));
      break;
    case GgmlType::kQ4_0:
      for (int64_t i = 0; i < nb; ++i) DequantQ4_0(p + 18 * i, dst + 32 * i);
      break;
    case GgmlType::kQ4_1:
      for (int64_t i = 0; i < nb; ++i) DequantQ4_1(p + 20 * i, dst + 32 * i);
      break;
    case GgmlType::kQ5_0:
      for (int64_t i = 0; i < nb; ++i) DequantQ5_0(p + 22 * i, dst + 32 * i);
      break;
    case GgmlType::kQ5_1:
      for (int64_t i = 0; i < nb; ++i) DequantQ5_1(p + 24 * i, dst + 32 * i);
      break;
    case GgmlType::kQ8_0:
      for (int64_t i = 0; i < nb; ++i) DequantQ8_0(p + 34 * i, dst + 32 * i);
      break;
    case GgmlType::kQ4_K:
      for (int64_t i = 0; i < nb; ++i) DequantQ4_K(p + 144 * i, dst + 256 * i);
      break;
    case GgmlType::kQ6_K:
      for (int64_t i = 0; i < nb; ++i) DequantQ6_K(p + 210 * i, dst + 256 * i);
      break;
    case GgmlType::kQ2_K:
      for (int64_t i = 0; i < nb; ++i) DequantQ2_K(p + 84 * i, dst + 256 * i);
      break;
    case GgmlType::kQ3_K:
      for (int64_t i = 0; i < nb; ++i) DequantQ3_K(p + 110 * i, dst + 256 * i);
      break;
    case GgmlType::kQ5_K:
      for (int64_t i = 0; i < nb; ++i) DequantQ5_K(p + 176 * i, dst + 256 * i);
      break;
    case GgmlType::kIQ4_NL:
      for (int64_t i = 0; i < nb; ++i) DequantIQ4_NL(p + 18 * i, dst + 32 * i);
      break;
    case GgmlType::kIQ4_XS:
      for (int64_t i = 0; i < nb; ++i) DequantIQ4_XS(p + 136 * i, dst + 256 * i);
      break;
    case GgmlType::kQ8_1:
      return absl::InvalidArgumentError("dequantize: Q8_1 is an activation type");
  }
  return absl::OkStatus();
}

void QuantizeRowQ4_0(const float* x, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 18) {
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        mx = x[j];
      }
    const float d = mx / -8, id = d != 0 ? 1.0f / d : 0.0f;
    StoreF16(out, d);
    for (int j = 0; j < 16; ++j) {
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<uint8_t>(x[j] * id + 8.5f));
      const uint8_t q1 = std::min<uint8_t>(15, static_cast<uint8_t>(x[j + 16] * id + 8.5f));
      out[2 + j] = q0 | (q1 << 4);
    }
  }
}

void QuantizeRowQ4_1(const float* x, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 20) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / 15, id = d != 0 ? 1.0f / d : 0.0f;
    StoreF16(out, d);
    StoreF16(out + 2, mn);
    for (int j = 0; j < 16; ++j) {
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<uint8_t>((x[j] - mn) * id + 0.5f));
      const uint8_t q1 = std::min<uint8_t>(15, static_cast<uint8_t>((x[j + 16] - mn) * id + 0.5f));
      out[4 + j] = q0 | (q1 << 4);
    }
  }
}

void QuantizeRowQ8_0(const float* x, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 34) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
    StoreF16(out, d);
    for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
  }
}

void QuantizeRowQ8_1(const float* x, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += 36) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127, id = d != 0 ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int8_t q = static_cast<int8_t>(std::roundf(x[j] * id));
      out[4 + j] = static_cast<uint8_t>(q);
      sum += q;
    }
    StoreF16(out, d);
    StoreF16(out + 2, d * sum);
  }
}

}  // namespace tinyserve
